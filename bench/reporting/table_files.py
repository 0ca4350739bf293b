"""The CSV and JSON files of a rendered table: every cell with every field (ours, its values per seed,
the paired difference to the baseline with its interval and p, each paper's number, the protocol
status), whatever the Markdown shows."""
from __future__ import annotations

import csv
import io
from typing import Any

from bench.reporting.table_grid import fmt_paper
from bench.tables.columns import Column

CELL_FIELDS = ["mean", "std", "paper_mean", "paper_std", "delta", "p_value", "paper_source"]
CSV_HEADER = ["method", "beta", "metric", *CELL_FIELDS, "n_seeds", "expected_seeds", "values", "column",
              "round_rule", "protocol_differs", "other_papers", "baseline", "paired_mean", "paired_ci95_low",
              "paired_ci95_high", "paired_p", "paired_n", "test_se", "best", "departures"]


def csv_row(label: str, col: Column, metric: str, cell: dict, baseline: str | None) -> list[Any]:
    others = "; ".join(f"{v['paper_source']}: " + " ".join(fmt_paper(v)) for v in cell["papers"].values()
                       if v["paper_source"] and v["paper_source"] != cell["paper_source"])
    diff = cell["paired"] or {}
    ci = diff.get("ci95") or [None, None]
    return [label, "" if col.beta is None else col.beta, metric, *(cell[c] for c in CELL_FIELDS), len(cell["values"]),
            cell["expected"], " ".join(f"{v:.4f}" for v in cell["values"]), col.id, cell["round_rule"],
            cell["protocol_differs"] or "", others, baseline or "",
            *("" if v is None else v for v in (diff.get("mean"), *ci, diff.get("p_value"))),
            len(diff.get("diffs") or []) or "", "" if cell["test_se"] is None else cell["test_se"], int(cell["best"]),
            " ".join(cell.get("departures") or [])]


def csv_text(cells: dict, by_id: dict[str, Column], baseline: str | None) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(CSV_HEADER)
    for (label, col_id, metric), cell in cells.items():
        writer.writerow(csv_row(label, by_id[col_id], metric, cell, baseline))
    return buf.getvalue()


def table_json(cells: dict, by_id: dict[str, Column], **about: Any) -> dict[str, Any]:
    """The JSON document: ``about`` (table, dataset, name, title, setup, protocols, ...) then every cell."""
    return {**about, "cells": [{"method": k[0], "beta": by_id[k[1]].beta, "column": k[1], "metric": k[2], **v}
                               for k, v in cells.items()]}
