"""The catalog: every registered method, dataset and partition scheme by name, with its one-line description and
its options, read without importing the modules that implement them (torch, Lightning, open_clip).

`fedbench list`, `fedbench coverage` and the names a run is checked against before the training stack is
imported read it. It is written from the real classes into ``catalog_data.py`` (``python -m
bench.tables.catalog --write``, or ``make catalog``) and bound to a digest of the sources of
``lightning_modules`` and ``datamodules``: when any of those files differs from what the catalog was written
from (a new method, an edited docstring), ``load()`` reads the real classes instead, so it is never wrong, only
slower; tests/commands/test_startup.py fails until the catalog is rewritten.

    methods   name -> module, description (the paper, one line), options (method.args with their defaults),
              protocol (its default evaluation), runs_centrally
    datasets  name -> module, description, classes (a count, or None: read from the folders), home_entries,
              default_root, needs_root (no place under the data home: --data.root only)
    schemes   name -> module, description
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import pprint
import re
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.core.paths import REPO_ROOT

SOURCES = ("lightning_modules", "datamodules")
DATA_FILE = Path(__file__).with_name("catalog_data.py")
WIDTH = 110  # characters of a description
# the registries, by module and name: consulted only when already imported (names registered at run time)
REGISTRIES = {"methods": ("lightning_modules.base", "METHODS"), "datasets": ("datamodules.base", "DATASETS"),
              "schemes": ("datamodules.partitions", "PARTITION_SCHEMES")}


def source_digest(root: Path = REPO_ROOT) -> str:
    """sha1 of (relative path, contents) of every .py file of the method and dataset packages."""
    h = hashlib.sha1()
    for package in SOURCES:
        for path in sorted((root / package).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def load() -> dict[str, Any]:
    """The catalog, with the names registered in this process beyond it (a scheme or method that a test or a
    script registers at run time; only possible once its registry is imported)."""
    base = committed_or_built()
    extra = {key: [n for n in runtime_names(key) if n not in base[key]] for key in REGISTRIES}
    if not any(extra.values()):
        return base
    builders = {"methods": method_entries, "datasets": dataset_entries, "schemes": scheme_entries}
    out = dict(base)
    for key, names in extra.items():
        if names:
            built = builders[key]()
            out[key] = {**base[key], **{n: built[n] for n in names}}
    return out


def runtime_names(key: str) -> list[str]:
    """The names in the registry of ``key`` when its module is imported (none otherwise)."""
    module, attr = REGISTRIES[key]
    registry = getattr(sys.modules.get(module), attr, None)
    return registry.registered_names() if registry is not None else []


@functools.cache
def committed_or_built() -> dict[str, Any]:
    """The committed catalog when it was written from the sources as they are, else built now from the real
    classes (which imports them)."""
    try:
        from bench.tables.catalog_data import CATALOG
    except ImportError:
        CATALOG = None  # no catalog written yet
    if CATALOG is not None and CATALOG.get("digest") == source_digest():
        return CATALOG
    return build()


def method_traits(name: str) -> tuple[str, bool]:
    """(protocol, runs_centrally) of method ``name``: from the catalog, else (a method registered at run time,
    or an unknown name: its error) from the class."""
    entry = load()["methods"].get(name)
    if entry is not None:
        return entry["protocol"], entry["runs_centrally"]
    from lightning_modules.base import METHODS

    cls = METHODS.get(name)
    return cls.protocol, bool(cls.runs_centrally)


KINDS = {"methods": "method", "datasets": "dataset", "schemes": "partition scheme"}  # the registries' kinds


def check_names(method: str, datasets: list[str], scheme: str) -> None:
    """An unknown method, dataset or partition scheme is the registry's error (UnknownNameError, the same
    text), before anything imports the modules; a name the catalog lacks is looked up in its registry when
    that is imported already (a method registered at run time, by a test or a script)."""
    for key, name in [("methods", method), *(("datasets", d) for d in datasets), ("schemes", scheme)]:
        check_names_of(key, name)


def scheme_option_names(scheme: str) -> set[str]:
    """The options (``partition.args``) partition scheme ``scheme`` takes, from the catalog (an unknown name: the
    registry's error)."""
    check_names_of("schemes", scheme)
    entry = load()["schemes"].get(scheme)
    if entry is not None:
        return set(entry["options"])
    from datamodules.partitions import option_defaults

    return set(option_defaults(scheme))


def check_names_of(key: str, name: str) -> None:
    """An unknown name of registry ``key`` is the registry's error (see ``check_names``)."""
    from bench.core.registry import unknown_name

    entries = load()[key]
    if name not in entries and not registered(key, name):
        raise unknown_name(KINDS[key], name, sorted(entries))


def registered(key: str, name: str) -> bool:
    """Whether ``name`` was registered in this process beyond the catalog (see ``runtime_names``)."""
    return name in runtime_names(key)


def build() -> dict[str, Any]:
    """The catalog from the real classes (imports every method, dataset and scheme module)."""
    return {"digest": source_digest(), "methods": method_entries(), "datasets": dataset_entries(),
            "schemes": scheme_entries()}


def write(path: Path = DATA_FILE) -> Path:
    """Write ``build()`` to ``path`` as a Python module (it ships with the package like any module)."""
    text = pprint.pformat(build(), width=120, sort_dicts=True)
    path.write_text(f'"""Written by `python -m bench.tables.catalog --write` (bench/tables/catalog.py): do not '
                    f'edit."""\nCATALOG = {text}\n')
    return path


# ---- from the real classes ------------------------------------------------------------------------------------
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


def plain(value: Any) -> Any:
    """An option's default as JSON holds it (a tuple as a list; what JSON cannot hold, as its repr)."""
    if value is inspect.Parameter.empty:
        return "<required>"
    return json.loads(json.dumps(value, default=repr))


def method_descriptions() -> dict[str, str]:
    """Registered method name -> one line: the paper and what it does. A method is described by the first
    paragraph of its module's docstring (which names its paper); a second method in the same module
    (``fednpr-code`` beside ``fednpr``) by its own class docstring."""
    from lightning_modules.base import METHODS

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
    return out


def method_entries() -> dict[str, dict[str, Any]]:
    from bench.assembly.validation import FILLED_BY_BUILDER, method_signature
    from lightning_modules.base import METHODS

    described = method_descriptions()
    out = {}
    for name in METHODS.names():
        cls = METHODS.get(name)
        params = method_signature(cls)
        options = {k: plain(p.default) for k, p in sorted(params.items()) if k not in FILLED_BY_BUILDER | {"betas"}}
        out[name] = {"module": cls.__module__, "description": described[name], "options": options,
                     "protocol": cls.protocol, "runs_centrally": bool(cls.runs_centrally)}
    return out


def dataset_entries() -> dict[str, dict[str, Any]]:
    from datamodules.base import DATASETS

    out = {}
    for name in DATASETS.names():
        cls = DATASETS.get(name)
        classes = cls.__dict__.get("class_names", getattr(cls, "class_names", None))
        doc = first_paragraph(cls.__dict__.get("__doc__")) or first_paragraph(sys.modules[cls.__module__].__doc__)
        out[name] = {"module": cls.__module__, "description": one_line(doc),
                     "classes": len(classes) if isinstance(classes, list | tuple) else None,
                     "home_entries": list(cls.home_entries), "default_root": cls.default_root,
                     "needs_root": bool(not cls.home_entries and cls.download_hint)}
    return out


def scheme_entries() -> dict[str, dict[str, Any]]:
    """Partition scheme -> the first sentence of its description in the docstring of the module that
    registers it (datamodules/partitions/<file>.py): its ``name`` entry, or the module's first line; the
    scheme function's own docstring when its module has none; and its options (``partition.args``) with their
    defaults."""
    from datamodules.partitions import PARTITION_SCHEMES, option_defaults

    out = {}
    for name in PARTITION_SCHEMES.names():
        scheme = PARTITION_SCHEMES.get(name)
        doc = getattr(sys.modules.get(scheme.__module__), "__doc__", None) or scheme.__doc__ or ""
        entry = re.search(rf"^``{re.escape(name)}``\n((?:    .*\n?)+)", doc, re.MULTILINE)
        text = entry.group(1) if entry else doc.split("\n\n")[0].removeprefix(f"``{name}``:")
        out[name] = {"module": scheme.__module__, "description": one_line(" ".join(text.replace("``", "").split())),
                     "options": {k: plain(v) for k, v in option_defaults(name).items()}}
    return out


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print("usage: python -m bench.tables.catalog --write   (rewrites bench/tables/catalog_data.py)")
        return 2
    print(f"written: {write()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
