"""`fedbench list`: every registered method with the paper it follows (one line), every dataset with where
it is looked for under the data home, and the partition schemes.

Read from the registries (``METHODS``, ``DATASETS``, ``PARTITION_SCHEMES``) and the docstrings of
the code that implements them, so a new method, dataset or scheme is listed without editing this file.
A method is described by the first paragraph of its module's docstring (which names its paper); a second
method in the same module (``fednpr-code`` beside ``fednpr``) by its own class docstring.
"""
from __future__ import annotations

import inspect
import re
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

from bench.reporting.flags import CommandParser
from datamodules.base import DATASETS
from datamodules.data_home import DATA_HOME_ENV, data_home, locate, set_data_home
from datamodules.partitions import PARTITION_SCHEMES
from lightning_modules.base import METHODS

WIDTH = 110  # characters of a description


def first_paragraph(doc: str | None) -> str:
    """The first paragraph of a docstring on one line, without reST's double backquotes."""
    return " ".join((doc or "").strip().split("\n\n")[0].replace("``", "").split())


def one_line(text: str, width: int = WIDTH) -> str:
    return textwrap.shorten(text, width, placeholder=" ...") if text else ""


def source_line(cls: type) -> int:
    """Where ``cls`` is defined in its module; a class made by ``compose()`` (type(), no class statement)
    comes after the module's own classes."""
    try:
        return inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        return 10**9


def method_descriptions() -> dict[str, str]:
    """Registered method name -> one line: the paper and what it does."""
    modules: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for name in METHODS.names():
        cls = METHODS.get(name)
        modules[cls.__module__].append((source_line(cls), name))
    out = {}
    for module, members in modules.items():
        module_doc = first_paragraph(sys.modules[module].__doc__)
        for i, (_, name) in enumerate(sorted(members)):
            cls = METHODS.get(name)
            own = first_paragraph(cls.__dict__.get("__doc__"))
            text = (own or module_doc) if i else (module_doc or own)
            out[name] = one_line(text or cls.__name__)
    return dict(sorted(out.items()))


def shown_entry(entry: str) -> str:
    """A data-home entry as a path: folders end with '/', files (``dermamnist*.npz``) do not."""
    return entry if Path(entry).suffix else f"{entry}/"


def dataset_locations(home: Path) -> dict[str, tuple[str, str, str]]:
    """Dataset name -> (found / missing / -, its classes, where it is looked for)."""
    out = {}
    for name in DATASETS.names():
        cls = DATASETS.get(name)
        classes = cls.__dict__.get("class_names", getattr(cls, "class_names", None))
        count = f"{len(classes)} classes" if isinstance(classes, list | tuple) else "its classes"  # class-folder
        if cls.home_entries:
            where = " or ".join(shown_entry(e) for e in cls.home_entries)
            if cls.default_root:
                where += f" (else {cls.default_root})"
            found = locate(home, cls.home_entries)
            if found is None and cls.default_root and Path(cls.default_root).expanduser().exists():
                found = Path(cls.default_root).expanduser()
            status = "found" if found else "missing"
            where += f": found at {found}" if found else ""
        elif cls.download_hint:
            status, where = "-", "--data.root DIR (not looked for under the data home)"
        else:
            status, where = "-", "needs no files"
        out[name] = (status, count, where)
    return out


def scheme_descriptions() -> dict[str, str]:
    """Partition scheme -> the first sentence of its description in the docstring of the module that
    registers it (datamodules/partitions/<file>.py): its ``name`` entry, or the module's first line; the
    scheme function's own docstring when its module has none."""
    out = {}
    for name in PARTITION_SCHEMES.names():
        scheme = PARTITION_SCHEMES.get(name)
        doc = getattr(sys.modules.get(scheme.__module__), "__doc__", None) or scheme.__doc__ or ""
        entry = re.search(rf"^``{re.escape(name)}``\n((?:    .*\n?)+)", doc, re.MULTILINE)
        text = entry.group(1) if entry else doc.split("\n\n")[0].removeprefix(f"``{name}``:")
        out[name] = one_line(" ".join(text.replace("``", "").split()))
    return out



def table(rows: dict[str, str | tuple[str, ...]]) -> list[str]:
    """Aligned lines: the name, then the cells (the last one unpadded)."""
    rows = {name: (name, *((cells,) if isinstance(cells, str) else cells)) for name, cells in rows.items()}
    widths = [max(len(r[i]) for r in rows.values()) for i in range(len(next(iter(rows.values()))))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=False)) + "  " + r[-1]
            for r in rows.values()]


def listing(home: Path | None = None) -> str:
    home = home or data_home()
    methods, datasets, schemes = method_descriptions(), dataset_locations(home), scheme_descriptions()
    return "\n".join([
        f"Methods ({len(methods)}; --method.name NAME):", *table(methods), "",
        (f"Datasets ({len(datasets)}; --data.name NAME), looked for under the data home {home} "
         f"(--data-home DIR or ${DATA_HOME_ENV}; an explicit --data.root wins):"), *table(datasets), "",
        f"Partition schemes ({len(schemes)}; --partition.scheme NAME):", *table(schemes),
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
