"""Published numbers of the five reproduced papers, transcribed from their tables.

The data lives in ``results/paper/<paper>.json`` (one file per paper, see the files for the
per-table notes on how garbled tables were reconstructed).  Each file looks like::

    {"paper": "fedbm", "title": ..., "source": ..., "tables": [
        {"id": "I", "caption": ..., "kind": "comparison" | "ablation", "note": ...,  # note optional
         "cells": [{"dataset", "partition", "method", "metric", "mean", "std", "setting", ...}]}]}

Cells are unique by ``(paper, table, dataset, partition, method, metric, setting)``.
Pure standard library.
"""
from __future__ import annotations

import json
from pathlib import Path

from bench.core.paths import REPO_ROOT

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
            for c in table["cells"]:
                cells.append({"paper": doc["paper"], "table": str(table["id"]),
                              "table_kind": table.get("kind"),
                              "protocol": paper_protocol_of(table, c["method"], c["dataset"], c["partition"]), **c})
    return cells


def paper_protocol_of(table: dict, method: str, dataset: str | None = None, partition: str | None = None) -> dict:
    """How a paper table measured ``method`` (see bench/reporting/protocols.py): the table's
    ``protocol``, updated by its ``method_protocols[method]`` exception; {} when the transcription
    has none.

    With a ``dataset``, the setup (``setup``: clients, rounds, local_epochs, sample_ratio, or epochs
    for a centralised model) is that dataset's: a value given per dataset (``{"bt": 100, "sc": 50}``)
    is resolved to the cell's. With a ``partition`` (the cell's column, e.g. ``dirichlet-0.1``), the
    setup also holds it as ``partition``: the partition scheme and its parameter are a setup facet."""
    proto = dict(table.get("protocol") or {})
    proto.update((table.get("method_protocols") or {}).get(method) or {})
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
