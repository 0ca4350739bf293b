"""Ours vs the paper for one table cell: the published number, the difference, a Welch t-test.

A table config names its paper(s) (``paper: fedbm`` or a list) and each row its method as printed
in the paper (``paper_method``, default: the row label). A cell is looked up in the papers'
comparison tables (results/paper/*.json) by dataset, partition ``dirichlet-<beta>`` and metric;
ablation tables are used only when no comparison table has the cell, or when the row names its
``paper_table`` / ``paper_setting``. Papers report mean ± std
over 3 runs (FedBM, FedCB, FedNPR; ``PAPER_RUNS`` when a transcription says otherwise).
"""
from __future__ import annotations

import math

from scipy import stats

from bench.reporting.paper_numbers import load_paper_numbers

PAPER_RUNS = 3


def paper_names(spec: dict) -> list[str]:
    papers = spec.get("paper") or []
    return [papers] if isinstance(papers, str) else list(papers)


def load_cells(spec: dict) -> list[dict]:
    return [c for p in paper_names(spec) for c in load_paper_numbers(p)]


def paper_cell(cells: list[dict], dataset: str, beta: float, method: str, metric: str,
               table: str | None = None, setting: str | None = None) -> dict | None:
    """The published cell, comparison tables first; None when the papers have none. ``table`` and
    ``setting`` (a row's ``paper_table`` / ``paper_setting``, e.g. "lambda_div=0.1") narrow the
    search to one table or one ablation setting."""
    partition = f"dirichlet-{beta:g}"
    hits = [c for c in cells if c["dataset"] == dataset and c["partition"] == partition
            and c["method"] == method and c["metric"] == metric and c.get("mean") is not None
            and (table is None or c["table"] == str(table)) and (setting is None or c.get("setting") == setting)]
    hits.sort(key=lambda c: (c.get("table_kind") != "comparison", c.get("setting") is not None))
    return hits[0] if hits else None


def welch_p(mean1: float, std1: float, n1: int, mean2: float, std2: float, n2: int) -> float | None:
    """Two-sided Welch t-test p-value from summary statistics; None unless both sides have >= 3
    runs and a positive spread."""
    if n1 < 3 or n2 < 3 or std1 is None or std2 is None or (std1 <= 0 and std2 <= 0):
        return None
    p = stats.ttest_ind_from_stats(mean1, std1, n1, mean2, std2, n2, equal_var=False).pvalue
    return float(p) if math.isfinite(p) else None


def compare(cell: dict, paper: dict | None) -> dict:
    """paper mean/std/source, delta = ours - paper, Welch p (None where not computable)."""
    if paper is None:
        return {"paper_mean": None, "paper_std": None, "paper_source": None, "delta": None, "p_value": None}
    ours = cell["mean"]
    delta = None if ours is None else ours - paper["mean"]
    p = None
    if ours is not None and paper.get("std") is not None:
        p = welch_p(ours, cell["std"], len(cell["values"]), paper["mean"], paper["std"], PAPER_RUNS)
    return {"paper_mean": paper["mean"], "paper_std": paper.get("std"),
            "paper_source": f"{paper['paper']} Table {paper['table']}", "delta": delta, "p_value": p}
