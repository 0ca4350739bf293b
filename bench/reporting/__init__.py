"""Reporting a table: the papers' numbers and where they come from (paper_sources.py, paper_numbers.py),
the comparison with them (paper_compare.py, departures.py, cell_marks.py, uncertainty.py), and rendering
(tables.py, table_grid.py, table_files.py, plots.py). It reads the table definitions below it
(bench.tables) and never runs anything; nothing here changes a run's numbers, so
bench/core/code_version.py does not hash it."""
