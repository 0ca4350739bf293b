"""Render a table from run records: ours (mean +- std over seeds) per (row, beta, metric) beside the
paper's number, the difference and a Welch p-value; missing stays missing; PNG figures alongside."""
from __future__ import annotations

import csv
import io
import math
import statistics
from pathlib import Path
from typing import Any

from bench.paper_compare import compare, load_cells, paper_cell, paper_names
from bench.plots import plot_curves, plot_partitions
from bench.records import atomic_write_text, load_record, record_path, write_json

METRIC_LABELS = {"accuracy": "Acc", "f1": "F1", "balanced_accuracy": "bAcc", "auc": "AUC", "precision": "Prec"}


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def metric_of(record: dict, metric: str) -> float | None:
    """Test metric at the best-validation round (global protocol) or the final round (per-client)."""
    best = record.get("best") or {}
    return best.get(f"test/{metric}")


def collect(spec: dict, runs: list, records: dict[int, dict]) -> dict[tuple[str, float, str], dict[str, Any]]:
    """(row label, beta, metric) -> values over seeds, their mean/std and how many were expected."""
    cells: dict[tuple[str, float, str], dict[str, Any]] = {}
    for run in runs:
        rec = records.get(id(run))
        for beta in run.columns:
            for metric in spec.get("metrics", ["accuracy", "f1"]):
                cell = cells.setdefault((run.label, beta, metric), {"values": [], "seeds": [], "expected": 0})
                cell["expected"] += 1
                if rec is not None and metric_of(rec, metric) is not None:
                    cell["values"].append(metric_of(rec, metric))
                    cell["seeds"].append(run.seed)
    for cell in cells.values():
        cell["mean"], cell["std"] = mean_std(cell["values"])
    return cells


def fmt(cell: dict) -> str:
    if cell["mean"] is None:
        return f"missing (0/{cell['expected']} seeds)"
    text = f"{cell['mean']:.2f} ± {cell['std']:.2f}"
    if len(cell["values"]) < cell["expected"]:
        text += f" ({len(cell['values'])}/{cell['expected']} seeds)"
    return text


def fmt_paper(cmp: dict) -> list[str]:
    """The paper, delta and p-value columns of one cell."""
    if cmp["paper_mean"] is None:
        return ["n/a", "n/a", "n/a"]
    paper = f"{cmp['paper_mean']:.2f}" + (f" ± {cmp['paper_std']:.2f}" if cmp["paper_std"] is not None else "")
    delta = "missing" if cmp["delta"] is None else f"{cmp['delta']:+.2f}"
    p = "n/a" if cmp["p_value"] is None else f"{cmp['p_value']:.3f}"
    return [paper, delta, p]


def load_records(runs: list) -> dict[int, dict]:
    """id(run) -> its record, for runs that have one."""
    out = {}
    for r in runs:
        path = record_path(r.cfg.output_dir, r.cfg.experiment, r.cfg.run_name())
        if path.exists():
            out[id(r)] = load_record(path)
    return out


def setup_line(rec: dict) -> str:
    c = rec["config"]
    return (f"{c['partition']['num_clients']} clients, {c['fed']['rounds']} rounds x {c['fed']['local_epochs']} local "
            f"epoch(s), sampling {c['fed']['sample_ratio']:g}, batch {c['fed']['batch_size']}, {rec['backbone']}, "
            f"image {c['data']['image_size'] or 'default'} px, train samples {rec['splits']['train']}, "
            f"test samples {rec['splits']['test']}")


def protocol_note(labels: list[str], runs: list, records: dict[int, dict]) -> str:
    def rows_with(protocol: str) -> list[str]:
        return [lab for lab in labels
                if any(records.get(id(r), {}).get("protocol") == protocol for r in runs if r.label == lab)]

    note = "Global-model rows: test metrics at the best-validation round (FedBM's rule)."
    if per_client := rows_with("per_client"):
        note += (f" Per-client rows ({', '.join(per_client)}): the mean over clients of each client's model on "
                 "its own test split, at the final round.")
    if client_mean := rows_with("local_mean"):
        note += (f" Client-mean rows ({', '.join(client_mean)}): the mean over clients of each client's own "
                 "model on the global test set, at the final round.")
    return note


def weights_line(labels: list[str], runs: list, records: dict[int, dict]) -> str:
    """Which weights each row ran with (from its records), rows with the same weights grouped."""
    groups: dict[str, list[str]] = {}
    for label in labels:
        for rec in (records.get(id(r)) for r in runs if r.label == label):
            if rec is not None and label not in groups.setdefault(rec.get("backbone", "?"), []):
                groups[rec.get("backbone", "?")].append(label)
    return "Weights: " + "; ".join(f"{w} ({', '.join(rows)})" for w, rows in groups.items()) + "."


def render_table(spec: dict, runs: list, tables_dir: str = "results/tables", name: str | None = None,
                 changes: list[str] | None = None, reduced: bool = False) -> dict[str, str]:
    """Write <name>.{md,csv,json} (+ PNG figures) from the runs' records; returns the paths. ``name``
    defaults to <table>_<dataset>; ``changes`` (bench/table_overrides.py) says how the runs differ from
    the config; ``reduced``: not the config's budget, which the title then says."""
    metrics = spec.get("metrics", ["accuracy", "f1"])
    betas = spec["betas"]
    labels = list(dict.fromkeys(r.label for r in runs))
    paper_key = {r["label"]: (r.get("paper_method", r["label"]), r.get("paper_table"), r.get("paper_setting"))
                 for r in spec["rows"]}
    records = load_records(runs)
    cells = collect(spec, runs, records)
    paper_cells = load_cells(spec)
    for (label, beta, metric), cell in cells.items():
        method, table, setting = paper_key[label]
        cell.update(compare(cell, paper_cell(paper_cells, spec["dataset"], beta, method, metric, table, setting)))
    name = name or f"{spec['table']}_{spec['dataset']}"
    some = next(iter(records.values()), None)
    papers = ", ".join(paper_names(spec)) or "none"

    header = ["Method"]
    for b in betas:
        for m in metrics:
            lab = f"β={b:g} {METRIC_LABELS.get(m, m)}"
            header += [f"{lab} ours", f"{lab} paper", f"{lab} Δ", f"{lab} p"]
    rows = []
    for label in labels:
        row = [label]
        for b in betas:
            for m in metrics:
                cell = cells[(label, b, m)]
                row += [fmt(cell)] + fmt_paper(cell)
        rows.append(row)

    title = spec.get("title", f"{spec['table']}_{spec['dataset']}") + (" — REDUCED RUN, not the config's budget" if reduced else "")
    md = [f"# {title}", ""]
    if changes:
        md += [*changes, ""]
    if some is not None:
        md += [f"Setup: {setup_line(some)}.", "", weights_line(labels, runs, records), ""]
    legend = (f"Ours: mean ± sample std over seeds {spec['seeds']} (%). {protocol_note(labels, runs, records)} "
              f"Paper: the published mean ± std ({papers}; n/a where the paper has no such cell), Δ = ours − paper, "
              "p = two-sided Welch t-test where both sides have >= 3 runs. Rows without records are shown as "
              "missing, never filled.")
    md += [legend, ""]
    md += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(row) + " |" for row in rows]
    if spec.get("notes"):
        md += ["", spec["notes"].strip()]

    out_dir = Path(tables_dir)
    figures = {**plot_curves(spec, runs, records, out_dir / f"{name}_curves.png"),
               **plot_partitions(spec, runs, records, out_dir, name)}
    if figures:
        md += ["", "Figures: " + ", ".join(f"[{k}]({Path(v).name})" for k, v in figures.items())]

    buf = io.StringIO()
    writer = csv.writer(buf)
    cols = ["mean", "std", "paper_mean", "paper_std", "delta", "p_value", "paper_source"]
    writer.writerow(["method", "beta", "metric", *cols, "n_seeds", "expected_seeds", "values"])
    for (label, beta, metric), cell in cells.items():
        writer.writerow([label, beta, metric, *(cell[c] for c in cols), len(cell["values"]), cell["expected"],
                         " ".join(f"{v:.4f}" for v in cell["values"])])
    paths = {"md": str(out_dir / f"{name}.md"), "csv": str(out_dir / f"{name}.csv"), "json": str(out_dir / f"{name}.json")}
    atomic_write_text(paths["md"], "\n".join(md) + "\n")
    atomic_write_text(paths["csv"], buf.getvalue())
    write_json(paths["json"], {"table": spec["table"], "dataset": spec["dataset"], "name": name, "title": title,
                               "experiment": runs[0].cfg.experiment if runs else name,
                               "reduced": reduced, "changes": changes or [], "papers": paper_names(spec),
                               "setup": setup_line(some) if some else "", "figures": figures,
                               "cells": [{"method": k[0], "beta": k[1], "metric": k[2], **v} for k, v in cells.items()]})
    return {**paths, **figures}
