"""Reporting on top of the round core: tables (their partition columns and the papers' protocols),
plots, paper numbers and the comparison with them, coverage, the table and regression runners, W&B
logging and the speed benchmarks. Nothing here changes a run's numbers, so bench/core/code_version.py
does not hash it."""
