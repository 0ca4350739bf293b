"""`fedbench data get NAME [NAME ...]` (or `--table CONFIG`): put datasets into the data home.

A dataset the loader already finds (under the data home, or at its default folder) is left alone. A
fetchable one is downloaded with a progress bar, resumed after an interruption, checked against its
recorded SHA-256 (and its authors' MD5) and unpacked atomically (bench/commands/download.py). A dataset
behind a registration or a licence prints the exact steps and the command fails, so that `make table2`
stops before the table. `--table CONFIG` gets every dataset the table config's runs read without an
explicit data.root (the Makefile's table targets run it first). docs/data.md has the table of sources.
"""
from __future__ import annotations

import sys
from pathlib import Path

from jsonargparse import ArgumentParser

from bench.commands.data_sources import SOURCES
from bench.commands.download import MIRROR_ENV, ManualDatasetError, fetch, home_lock, read_checksums
from bench.core.errors import FedbenchError
from bench.tables.flags import CommandParser
from datamodules.data_home import DATA_HOME_ENV, data_home, locate, set_data_home


def present_at(name: str, home: Path) -> Path | None:
    """Where the loader of dataset ``name`` finds its files (data home, else its default folder), or None.
    The name a source unpacks to is checked first, without importing the data modules (and torch)."""
    if name in SOURCES and (home / SOURCES[name].target).exists():
        return locate(home, (SOURCES[name].target,))
    from bench.tables import catalog  # the loaders' entries without importing them (no torch)

    entry = catalog.load()["datasets"][name]
    found = locate(home, entry["home_entries"]) if entry["home_entries"] else None
    if found is None and entry["default_root"] and Path(entry["default_root"]).expanduser().exists():
        found = Path(entry["default_root"]).expanduser()
    return found


def availability(name: str, home: Path) -> str:
    """present / fetchable / manual / - (no files to get: generated, or a folder of your own)."""
    if name not in SOURCES:
        return "-"
    if present_at(name, home) is not None:
        return "present"
    return "fetchable" if SOURCES[name].fetchable else "manual"


def table_datasets(path: str) -> list[str]:
    """The dataset names a table config's runs read from the data home (rows with a data.root excluded)."""
    from bench.tables.table_spec import load_table_config

    spec = load_table_config(path)
    base = spec.base.get("data") or {}
    names = []
    for row in spec.rows:
        data = base | (row.overrides.get("data") or {})
        if data.get("name") and not data.get("root") and data["name"] not in names:
            names.append(data["name"])
    return names


def check_names(names: list[str]) -> None:
    """Every name a dataset (an unknown one: the registry's error, with the closest names)."""
    unknown = [name for name in names if name not in SOURCES]
    if unknown:
        from datamodules.base import DATASETS

        for name in unknown:
            DATASETS.get(name)


def get_one(name: str, home: Path, args) -> bool:
    """Make dataset ``name`` present; False when it needs the manual steps printed."""
    found = present_at(name, home)  # also: an unknown name is an error with the closest ones
    if found is not None and not (args.force and name in SOURCES and SOURCES[name].fetchable):
        print(f"{name}: present at {found}")
        return True
    if name not in SOURCES:
        print(f"{name}: nothing to download (generated, or your own folder via --data.root)")
        return True
    try:
        dest = fetch(name, home, mirror=args.mirror, checksums=args.checksums, progress=args.progress)
    except ManualDatasetError as err:
        print(str(err))
        return False
    print(f"{name}: ready at {dest}")
    return True


def build_parser() -> CommandParser:
    parser = CommandParser(prog="fedbench data", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["get"], help="get: download (or say how to get) the datasets")
    ArgumentParser.add_argument(parser, "names", nargs="*", metavar="NAME",  # positional words, as argparse reads them
                                help="dataset names (fedbench list shows them)")
    parser.add_argument("--table", default=None, metavar="CONFIG",
                        help="every dataset a table config reads (configs/tables/<table>_<dataset>.yaml)")
    parser.add_argument("--data-home", default=None,
                        help=f"where datasets go (default ${DATA_HOME_ENV}, else ./data)")
    parser.add_argument("--mirror", default=None, metavar="URL",
                        help=f"download every file as <URL>/<file name> (default ${MIRROR_ENV}, else the sources)")
    parser.add_argument("--checksums", default=None, metavar="FILE",
                        help="a sha256sum file replacing the recorded checksums of the files it names (a mirror's)")
    parser.add_argument("--force", action="store_true",
                        help="download even when the loader finds the dataset elsewhere (its default folder); an "
                             "existing folder in the data home is never replaced")
    parser.add_argument("--progress", type=bool, default=sys.stderr.isatty(),
                        help="show a progress bar (default: on a terminal; bare: true)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    home = set_data_home(args.data_home) if args.data_home else data_home()
    names = list(args.names) + (table_datasets(args.table) if args.table else [])
    if not names:
        raise FedbenchError("fedbench data get: name at least one dataset (fedbench list shows them) or --table CONFIG.")
    check_names(names)  # bad input is one error before anything is downloaded
    args.checksums = read_checksums(args.checksums) if args.checksums else None
    with home_lock(home):  # one `data get` at a time per data home: never two writers of one .part
        manual = [name for name in names if not get_one(name, home, args)]
    if manual:
        raise FedbenchError(f"{', '.join(manual)} must be fetched by hand: follow the steps above, then run the "
                            "same command again.")
    return 0

