"""The other subcommands, each over the table runner or the definitions: `fedbench coverage`, `list`,
`data get` (with the data sources and the checked download), `dashboard` (and its offline preview) and
`regression`. bench/cli.py dispatches to them; only the performance tools and the CLI sit above."""
