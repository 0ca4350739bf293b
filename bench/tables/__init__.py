"""What a table is: its config parsed once into a TableSpec (table_spec.py, spec.py), row and seed
selections (table_overrides.py), its partition columns (columns.py), the papers' evaluation protocols
(protocols.py), the method and dataset catalog read without importing them (catalog.py, catalog_data.py) and
the command-line conventions every command shares (flags.py). It sits on run assembly and imports nothing
above it (tests/core/test_layering.py); nothing here changes a run's numbers, so bench/core/code_version.py does
not hash it."""
