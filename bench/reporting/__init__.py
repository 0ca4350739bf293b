"""Reporting on top of the round core: tables, plots, paper numbers, the table and regression runners,
W&B logging and the speed benchmarks. Nothing here changes a run's numbers, so bench/code_version.py
does not hash it."""
