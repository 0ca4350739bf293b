"""Published numbers of the five reproduced papers, transcribed from their tables.

The data lives in ``results/paper/<paper>.json`` (one file per paper, see the files for the
per-table notes on how garbled tables were reconstructed).  Each file looks like::

    {"paper": "fedbm", "title": ..., "source": ..., "tables": [
        {"id": "I", "caption": ..., "kind": "comparison" | "ablation", "note": ...,  # note optional
         "cells": [{"dataset", "partition", "method", "metric", "mean", "std", "setting", ...}]}]}

Cells are unique by ``(paper, table, dataset, partition, method, metric, setting)``.

How a table measured its numbers is its ``protocol`` (bench/tables/protocols.py: ``eval``, ``round``,
``model``, ``setup``), with per-method exceptions in ``method_protocols``. Each facet of it says where it
comes from in ``sources`` (bench/reporting/paper_sources.py)::

    "protocol": {"eval": "global", "round": "best-val-sum5", "setup": {...}, ...,
                 "sources": {"eval":  {"kind": "stated", "where": "Sec. 4.2: 'each client's test set'"},
                             "round": {"kind": "code", "where": "meiluzhu/FedBM main.py: best val sum of 5"},
                             "model": {"default": {...}, "real": {...}},  # per dataset / metric
                             ...}}

Facets: ``eval``, ``round``, ``model`` (where the record names one), the setup values it records
(``clients``, ``rounds``, ``local_epochs``, ``sample_ratio``, ``epochs``, ``partition``) and
``hyperparameters`` (optimiser, learning rate and its schedule, batch size, the method's own). Kinds:
``stated`` (``where`` quotes the paper's section, table or sentence), ``code`` (``where`` names the public
repository and file) and ``ours`` (``where`` says why we chose it). A source may be a mapping from the
table's datasets or metrics to sources, with a ``default``. A method's exception carries the sources of
the facets it changes; they replace the table's facet by facet. Loading checks them: an unknown facet or
kind, an empty ``where``, a facet a cell depends on without a source, or a hand-set ``inferred`` /
``setup_inferred`` flag (superseded by the sources) is one FedbenchError naming the file. A cell is
inferred (``protocol["inferred"]``, printed †) when any facet it depends on is not ``stated``
(``paper_sources.inferred_facets``); a table whose protocol has no ``sources`` has none inferred.
Pure standard library.
"""
from __future__ import annotations

import json
from pathlib import Path

from bench.core.errors import FedbenchError
from bench.core.paths import REPO_ROOT
from bench.reporting.paper_sources import check_sources, inferred_facets, missing_sources, resolve_sources

PAPERS = ("fedcb", "fedbm", "fednpr", "facmic", "fstcbdg")
CELL_KEYS = ("dataset", "partition", "method", "metric", "mean", "std", "setting")


def _resolve_root(root: str | Path) -> Path:
    path = Path(root)
    if not path.is_absolute() and not path.exists() and (REPO_ROOT / path).exists():
        path = REPO_ROOT / path  # default works from any working directory
    return path


def load_paper_numbers(paper: str | None = None, root: str = "results/paper") -> list[dict]:
    """Flat list of cell dicts, each with ``paper``, ``table`` (table id), ``table_kind``, ``protocol`` added.

    ``paper=None`` loads every ``*.json`` under ``root`` (sorted by file name).
    """
    base = _resolve_root(root)
    if paper is None:
        files = sorted(base.glob("*.json"))
    else:
        files = [base / f"{paper}.json"]
        if not files[0].exists():
            known = ", ".join(sorted(p.stem for p in base.glob("*.json")))
            raise FileNotFoundError(f"no transcription for paper {paper!r} in {base} (have: {known})")
    cells: list[dict] = []
    for f in files:
        doc = json.loads(f.read_text(encoding="utf-8"))
        for table in doc["tables"]:
            check_table_sources(table, f"{f} (table {table['id']})")
            for c in table["cells"]:
                cell = {"paper": doc["paper"], "table": str(table["id"]), "table_kind": table.get("kind"),
                        "protocol": paper_protocol_of(table, c["method"], c["dataset"], c["partition"]), **c}
                _attach_sources(cell, f"{f} (table {table['id']}, {c['method']}, {c['dataset']})")
                cells.append(cell)
    return cells


SUPERSEDED = ("inferred", "setup_inferred")  # derived from ``sources`` now
FACET_KEYS = ("eval", "round", "model")  # a method exception changing one of these carries its source


def check_table_sources(table: dict, where: str) -> None:
    """The sources of a table's protocol and its method exceptions are well formed (paper_sources)."""
    selectors = {c["dataset"] for c in table["cells"]} | {c["metric"] for c in table["cells"]}
    has_sources = "sources" in (table.get("protocol") or {})
    records = [("protocol", table.get("protocol") or {})]
    records += [(f"method_protocols.{m}", p) for m, p in (table.get("method_protocols") or {}).items()]
    for name, proto in records:
        for key in SUPERSEDED:
            if key in proto:
                raise FedbenchError(f"{where}, {name}: {key!r} is derived from 'sources' now; mark the facet's "
                                    "source (stated / code / ours) instead.")
        if "sources" in proto:
            check_sources(proto["sources"], f"{where}, {name}", selectors)
        if has_sources and name != "protocol":
            changed = [k for k in FACET_KEYS if k in proto] + list(proto.get("setup") or {})
            lacking = [k for k in changed if k not in (proto.get("sources") or {})]
            if lacking:
                raise FedbenchError(f"{where}, {name} changes {', '.join(lacking)} without saying where from "
                                    "(add them to its 'sources').")


def _attach_sources(cell: dict, where: str) -> None:
    """Resolve the cell's sources to its dataset and metric, check every facet it depends on has one, and
    derive ``inferred`` from them."""
    proto = cell["protocol"]
    if "sources" not in proto:
        return
    proto["sources"] = resolve_sources(proto["sources"], cell["dataset"], cell["metric"])
    missing = missing_sources(proto, proto["sources"])
    if missing:
        raise FedbenchError(f"{where}: no source for {', '.join(missing)} (say where each facet comes from).")
    proto["inferred"] = bool(inferred_facets(cell))


def paper_protocol_of(table: dict, method: str, dataset: str | None = None, partition: str | None = None) -> dict:
    """How a paper table measured ``method`` (see bench/tables/protocols.py): the table's
    ``protocol``, updated by its ``method_protocols[method]`` exception; {} when the transcription
    has none. Their ``sources`` merge facet by facet.

    With a ``dataset``, the setup (``setup``: clients, rounds, local_epochs, sample_ratio, or epochs
    for a centralised model) is that dataset's: a value given per dataset (``{"bt": 100, "sc": 50}``)
    is resolved to the cell's. With a ``partition`` (the cell's column, e.g. ``dirichlet-0.1``), the
    setup also holds it as ``partition``: the partition scheme and its parameter are a setup facet."""
    proto = dict(table.get("protocol") or {})
    exception = (table.get("method_protocols") or {}).get(method) or {}
    sources = {**(proto.get("sources") or {}), **(exception.get("sources") or {})}
    proto.update(exception)
    if sources:
        proto["sources"] = sources  # facet by facet: the exception's replace the table's
    if dataset is not None and "setup" in proto:
        proto["setup"] = {k: (v.get(dataset) if isinstance(v, dict) else v) for k, v in proto["setup"].items()}
        proto["setup"] = {k: v for k, v in proto["setup"].items() if v is not None}
    if partition is not None:
        proto["setup"] = {**proto.get("setup", {}), "partition": partition}
    return proto


def lookup(cells: list[dict], *, paper: str | None = None, table: str | None = None,
           dataset: str | None = None, partition: str | None = None, method: str | None = None,
           metric: str | None = None, setting: str | None = None) -> dict | None:
    """The single cell matching every given (non-None) key, or None when nothing matches.

    Keys left as None are not filtered on (so ``setting=None`` matches any setting).
    Raises ValueError when more than one cell matches.
    """
    want = {"paper": paper, "table": table, "dataset": dataset, "partition": partition,
            "method": method, "metric": metric, "setting": setting}
    want = {k: v for k, v in want.items() if v is not None}
    if "table" in want:
        want["table"] = str(want["table"])
    hits = [c for c in cells if all(c.get(k) == v for k, v in want.items())]
    if not hits:
        return None
    if len(hits) > 1:
        keys = sorted({(c["paper"], c["table"], c["dataset"], c["partition"], c["method"], c["metric"],
                        str(c["setting"])) for c in hits})
        shown = "; ".join("/".join(k) for k in keys[:5])
        raise ValueError(f"{len(hits)} cells match {want}: {shown}{' ...' if len(keys) > 5 else ''}")
    return hits[0]
