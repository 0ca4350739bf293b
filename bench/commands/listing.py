"""`fedbench list`: every registered method with the paper it follows (one line), every dataset with where
it is looked for under the data home and whether it is present, fetchable (`fedbench data get NAME`) or
manual (the same command prints the steps), and the partition schemes.

Read from the catalog (bench/tables/catalog.py: names, descriptions and options recorded from the
registries ``METHODS``, ``DATASETS``, ``PARTITION_SCHEMES`` and the docstrings of the code that implements them),
so a new method, dataset or scheme is listed without editing this file, and listing imports none of them
(no torch). A method is described by the first paragraph of its module's docstring (which names its paper); a
second method in the same module (``fednpr-code`` beside ``fednpr``) by its own class docstring.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.commands.data_command import availability, present_at
from bench.tables import catalog
from bench.tables.flags import CommandParser
from datamodules.data_home import DATA_HOME_ENV, data_home, set_data_home


def method_descriptions(entries: dict[str, Any] | None = None) -> dict[str, str]:
    """Registered method name -> one line: the paper and what it does."""
    entries = catalog.load()["methods"] if entries is None else entries
    return {name: entries[name]["description"] for name in sorted(entries)}


def shown_entry(entry: str) -> str:
    """A data-home entry as a path: folders end with '/', files (``dermamnist*.npz``) do not."""
    return entry if Path(entry).suffix else f"{entry}/"


def dataset_locations(home: Path, entries: dict[str, Any] | None = None) -> dict[str, tuple[str, str, str]]:
    """Dataset name -> (present / fetchable / manual / -, its classes, where it is looked for)."""
    entries = catalog.load()["datasets"] if entries is None else entries
    out = {}
    for name in sorted(entries):
        d = entries[name]
        count = f"{d['classes']} classes" if d["classes"] is not None else "its classes"  # class-folder
        if d["home_entries"]:
            where = " or ".join(shown_entry(e) for e in d["home_entries"])
            if d["default_root"]:
                where += f" (else {d['default_root']})"
            found = present_at(name, home)
            where += f": found at {found}" if found else ""
        elif d["needs_root"]:
            where = "--data.root DIR (not looked for under the data home)"
        else:
            where = "needs no files"
        out[name] = (availability(name, home), count, where)
    return out


def scheme_descriptions(entries: dict[str, Any] | None = None) -> dict[str, tuple[str, str]]:
    """Partition scheme -> (its options with their defaults, the first sentence of its description)
    (bench/tables/catalog.py)."""
    entries = catalog.load()["schemes"] if entries is None else entries
    return {name: (", ".join(f"{k}={v}" for k, v in sorted(entries[name]["options"].items())) or "-",
                   entries[name]["description"]) for name in sorted(entries)}


def table(rows: dict[str, str | tuple[str, ...]]) -> list[str]:
    """Aligned lines: the name, then the cells (the last one unpadded)."""
    rows = {name: (name, *((cells,) if isinstance(cells, str) else cells)) for name, cells in rows.items()}
    widths = [max(len(r[i]) for r in rows.values()) for i in range(len(next(iter(rows.values()))))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=False)) + "  " + r[-1]
            for r in rows.values()]


def listing(home: Path | None = None, entries: dict[str, Any] | None = None) -> str:
    """The listing; ``entries``: a catalog (default ``catalog.load()``)."""
    home = home or data_home()
    entries = catalog.load() if entries is None else entries
    methods = method_descriptions(entries["methods"])
    datasets, schemes = dataset_locations(home, entries["datasets"]), scheme_descriptions(entries["schemes"])
    return "\n".join([
        f"Methods ({len(methods)}; --method.name NAME):", *table(methods), "",
        (f"Datasets ({len(datasets)}; --data.name NAME), looked for under the data home {home} "
         f"(--data-home DIR or ${DATA_HOME_ENV}; an explicit --data.root wins); fetchable: `fedbench data get "
         "NAME` downloads it, manual: it prints the steps:"), *table(datasets), "",
        (f"Partition schemes ({len(schemes)}; --partition.scheme NAME, its options --partition.args "
        "'{beta: 0.1}'; option=default):"), *table(schemes),
    ])


def build_parser() -> CommandParser:
    parser = CommandParser(prog="fedbench list", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-home", default=None,
                        help=f"the data home to look in (default ${DATA_HOME_ENV}, else ./data)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    home = set_data_home(args.data_home) if args.data_home else None
    print(listing(home))
    return 0
