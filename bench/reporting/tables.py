"""Render a table from run records: ours (mean +- std over seeds) per (row, column, metric) beside each
paper's number, the difference and a Welch p-value; missing stays missing; PNG figures alongside.

Ours is the test metric at the round the row's round rule picks (bench/reporting/protocols.py), computed from
each record's per-round history. A paper's number is shown only where the row was measured as the
paper measured it; elsewhere its column says "protocol differs: <what>" (bench/reporting/paper_compare.py).
One column group per paper that has a cell in the table, so every number names its paper.
"""
from __future__ import annotations

import csv
import io
import math
import statistics
from pathlib import Path
from typing import Any

from bench.core.atomic_io import atomic_write_text, write_json
from bench.records import load_record, record_path
from bench.reporting.columns import Column, table_columns
from bench.reporting.paper_compare import (
    PAPER_NAMES,
    compare,
    load_cells,
    match_table,
    paper_names,
    row_protocols,
)
from bench.reporting.plots import plot_curves, plot_partitions
from bench.reporting.protocols import EVALS, ROUND_RULES, RowProtocol, metric_at

METRIC_LABELS = {"accuracy": "Acc", "f1": "F1", "balanced_accuracy": "bAcc", "auc": "AUC", "precision": "Prec"}


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def collect(spec: dict, runs: list, records: dict[int, dict], columns: list[Column],
            protocols: dict[str, RowProtocol]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(row label, column id, metric) -> values over seeds, their mean/std and how many were expected.
    A derived column (``average``) holds, per seed, the mean of the row's values in the other columns."""
    cells: dict[tuple[str, str, str], dict[str, Any]] = {}
    metrics = spec.get("metrics", ["accuracy", "f1"])
    for run in runs:
        rec = records.get(id(run))
        rule = protocols[run.label].round
        for col_id in run.columns:
            for metric in metrics:
                cell = cells.setdefault((run.label, col_id, metric), {"values": [], "seeds": [], "expected": 0})
                cell["expected"] += 1
                value = None if rec is None else metric_at(rec, metric, rule)
                if value is not None:
                    cell["values"].append(value)
                    cell["seeds"].append(run.seed)
                    cell["warnings"] = cell.get("warnings", []) + [f"seed {run.seed}: {w}"
                                                                  for w in rec.get("warnings", [])]
    ran = [c.id for c in columns if not c.derived]
    for derived in (c for c in columns if c.derived):
        for label in dict.fromkeys(r.label for r in runs):
            for metric in metrics:
                parts = [cells.get((label, c, metric)) for c in ran]
                seeds = sorted({s for r in runs if r.label == label for s in [r.seed]})
                cell = {"values": [], "seeds": [], "expected": len(seeds)}
                for seed in seeds:
                    per_col = [p["values"][p["seeds"].index(seed)] for p in parts if p and seed in p["seeds"]]
                    if len(per_col) == len(ran):
                        cell["values"].append(statistics.fmean(per_col))
                        cell["seeds"].append(seed)
                        warned = [w for p in parts if p for w in p.get("warnings", [])
                                  if w.startswith(f"seed {seed}: ")]
                        if warned:  # an average over a suspect run is suspect too
                            cell["warnings"] = cell.get("warnings", []) + list(dict.fromkeys(warned))
                cells[(label, derived.id, metric)] = cell
    average_rows(runs, cells, columns, metrics)
    for cell in cells.values():
        cell["mean"], cell["std"] = mean_std(cell["values"])
    return cells


def average_rows(runs: list, cells: dict, columns: list[Column], metrics: list[str]) -> None:
    """Rows with ``average_of`` (bench/reporting/table_runner.py): per seed and column, the mean of
    the listed rows' values where all of them have one."""
    derived = {r.label: r.row["average_of"] for r in runs if "average_of" in r.row}
    for label, sources in derived.items():
        for col in columns:
            for metric in metrics:
                parts = [cells.get((src, col.id, metric)) for src in sources]
                cell = cells.get((label, col.id, metric))
                if cell is None or any(p is None for p in parts):
                    continue
                seeds = [s for s in parts[0]["seeds"] if all(s in p["seeds"] for p in parts)]
                cell["values"] = [statistics.fmean(p["values"][p["seeds"].index(s)] for p in parts) for s in seeds]
                cell["seeds"] = seeds
                cell["expected"] = max(p["expected"] for p in parts)
                warned = [w for p in parts for w in p.get("warnings", [])]
                if warned:
                    cell["warnings"] = list(dict.fromkeys(warned))


def fmt(cell: dict) -> str:
    if cell["mean"] is None:
        return f"missing (0/{cell['expected']} seeds)"
    text = f"{cell['mean']:.2f} ± {cell['std']:.2f}"
    if len(cell["values"]) < cell["expected"]:
        text += f" ({len(cell['values'])}/{cell['expected']} seeds)"
    if cell.get("warnings"):
        text += " ⚠"
    return text


def fmt_paper(cmp: dict, footnote: int | None = None) -> list[str]:
    """The paper, delta and p-value columns of one cell (one paper); a protocol difference names
    what differs and points to its footnote."""
    if cmp["protocol_differs"] is not None:
        mark = f" [{footnote}]" if footnote is not None else ""
        return [f"protocol differs: {cmp['protocol_differs_in']}{mark}", "—", "—"]
    if cmp["paper_mean"] is None:
        return ["n/a", "n/a", "n/a"]
    paper = f"{cmp['paper_mean']:.2f}" + (f" ± {cmp['paper_std']:.2f}" if cmp["paper_std"] is not None else "")
    if cmp.get("protocol_inferred"):
        paper += " †"
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


def protocol_note(labels: list[str], protocols: dict[str, RowProtocol], table_rule: str | None) -> str:
    """What every row reports, grouped by evaluation and round rule."""
    default = table_rule or "best-val-acc"
    parts = []
    order = {"global": 0, "per_client": 1, "local_mean": 2}
    groups = dict.fromkeys((protocols[lab].eval, protocols[lab].round) for lab in labels)
    for (ev, rule) in sorted(groups, key=lambda g: order[g[0]]):
        rows = [lab for lab in labels if (protocols[lab].eval, protocols[lab].round) == (ev, rule)]
        if ev == "global" and rule == "best-val-acc" and rule == default:
            parts.append("Global-model rows: test metrics at the best-validation round (highest validation accuracy).")
        elif ev == "global" and rule == default:
            parts.append(f"Global-model rows: {ROUND_RULES[rule]}.")
        elif ev == "per_client" and rule == "final":
            parts.append(f"Per-client rows ({', '.join(rows)}): the mean over clients of each client's model on "
                         "its own test split, at the final round.")
        elif ev == "local_mean" and rule == "final":
            parts.append(f"Client-mean rows ({', '.join(rows)}): the mean over clients of each client's own "
                         "model on the global test set, at the final round.")
        else:
            parts.append(f"Rows {', '.join(rows)}: {EVALS[ev]}, {ROUND_RULES[rule]}.")
    return " ".join(parts)


def weights_line(labels: list[str], runs: list, records: dict[int, dict]) -> str:
    """Which weights each row ran with (from its records), rows with the same weights grouped."""
    groups: dict[str, list[str]] = {}
    for label in labels:
        for rec in (records.get(id(r)) for r in runs if r.label == label and "average_of" not in r.row):
            if rec is not None and label not in groups.setdefault(rec.get("backbone", "?"), []):
                groups[rec.get("backbone", "?")].append(label)
    return "Weights: " + "; ".join(f"{w} ({', '.join(rows)})" for w, rows in groups.items()) + "."


def render_table(spec: dict, runs: list, tables_dir: str = "results/tables", papers_root: str = "results/paper",
                 name: str | None = None, changes: list[str] | None = None, reduced: bool = False) -> dict[str, str]:
    """Write <name>.{md,csv,json} (+ PNG figures) from the runs' records; returns the paths.
    ``papers_root``: where the papers' numbers are (results/paper). ``name`` defaults to
    <table>_<dataset>; ``changes`` (bench/reporting/table_overrides.py) says how the runs differ from the
    config; ``reduced``: not the config's budget, which the title then says."""
    metrics = spec.get("metrics", ["accuracy", "f1"])
    columns = table_columns(spec)
    labels = list(dict.fromkeys(r.label for r in runs))
    protocols = row_protocols(spec, runs)
    records = load_records(runs)
    cells = collect(spec, runs, records, columns, protocols)
    matches = match_table(spec, runs, columns, load_cells(spec, papers_root))
    papers = paper_names(spec)
    # one column group per paper with a cell in this table; one plain "paper" group when none has
    groups = [p for p in papers if any(m.cell is not None for ms in matches.values() for m in ms if m.paper == p)]
    for key, cell in cells.items():
        ms = {m.paper: m for m in matches.get(key, [])}
        per = {p: compare(cell, ms.get(p)) for p in papers}
        primary = next((p for p in papers if ms.get(p) is not None and ms[p].cell is not None), None)
        cell.update(per[primary] if primary else compare(cell, None))
        cell["papers"] = {p: per[p] for p in papers}
        cell["round_rule"] = protocols[key[0]].round
    name = name or f"{spec['table']}_{spec['dataset']}"
    # the setup line describes a federated row's record (a zero-shot or central row runs another budget)
    federated = [records[id(r)] for r in runs if id(r) in records and not r.row.get("partition_independent")]
    some = federated[0] if federated else next(iter(records.values()), None)
    shown = ", ".join(papers) or "none"

    header = ["Method"]
    for col in columns:
        for m in metrics:
            lab = f"{col.label} {METRIC_LABELS.get(m, m)}"
            header.append(f"{lab} ours")
            if not groups:
                header += [f"{lab} paper", f"{lab} Δ", f"{lab} p"]
            for p in groups:
                tag = f" {PAPER_NAMES.get(p, p)}" if len(groups) > 1 else ""
                header += [f"{lab} {PAPER_NAMES.get(p, p)}", f"{lab} Δ{tag}", f"{lab} p{tag}"]
    footnotes: dict[str, int] = {}  # "row vs source: reason" -> its number
    rows = []
    for label in labels:
        row = [label]
        for col in columns:
            for m in metrics:
                cell = cells[(label, col.id, m)]
                row.append(fmt(cell))
                for p in groups or [None]:
                    cmp = cell["papers"][p] if p else cell
                    note = None
                    if cmp["protocol_differs"]:
                        key = f"{label} vs {cmp['paper_source']}: {cmp['protocol_differs']}"
                        note = footnotes.setdefault(key, len(footnotes) + 1)
                    row += fmt_paper(cmp, note)
        rows.append(row)

    title = spec.get("title", f"{spec['table']}_{spec['dataset']}") + (" — REDUCED RUN, not the config's budget"
                                                                      if reduced else "")
    md = [f"# {title}", ""]
    if changes:
        md += [*changes, ""]
    if some is not None:
        md += [f"Setup: {setup_line(some)}.", "", weights_line(labels, runs, records), ""]
    legend = (f"Ours: mean ± sample std over seeds {spec['seeds']} (%). "
              f"{protocol_note(labels, protocols, spec.get('round_rule'))} "
              f"Paper: the published mean ± std ({shown}; n/a where the paper has no such cell), Δ = ours − paper, "
              "p = two-sided Welch t-test where both sides have >= 3 runs. Rows without records are shown as "
              "missing, never filled.")
    sources = sorted({cell["papers"][p]["paper_source"] for cell in cells.values() for p in papers
                      if cell["papers"][p]["paper_source"]})
    if sources:
        legend += (f" Published cells from {', '.join(sources)}; where the paper measured something else (what "
                   "is evaluated, the reporting round, the model) its column says 'protocol differs' and gives "
                   "no Δ and no p.")
    if any(cell["papers"][p].get("protocol_inferred") for cell in cells.values() for p in papers):
        legend += (" †: the paper does not state how it measured that row; its protocol is inferred from the code "
                   "it was produced with (see the notes in results/paper).")
    if any(c.derived for c in columns):
        legend += " average: per seed, the mean of the row's other columns."
    averaged = {r.label: r.row["average_of"] for r in runs if "average_of" in r.row}
    for label, sources in averaged.items():
        legend += f" {label}: per seed, the mean of rows {', '.join(sources)}."
    md += [legend, ""]
    md += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(row) + " |" for row in rows]
    by_id = {c.id: c for c in columns}
    warned = {f"{label} {by_id[col_id].label}: {w}" for (label, col_id, _), cell in cells.items()
              if not by_id[col_id].derived for w in cell.get("warnings", [])}
    if warned:
        md += ["", "⚠ Runs whose record carries a warning (their numbers are shown but suspect):"]
        md += [f"- {w}" for w in sorted(warned)]
    if footnotes:
        md += ["", "Protocol differences (ours vs the paper's cell): "
               + " ".join(f"[{n}] {text}." for text, n in footnotes.items())]
    if spec.get("notes"):
        md += ["", spec["notes"].strip()]

    out_dir = Path(tables_dir)
    plotted = [r for r in runs if "average_of" not in r.row]  # derived rows have no curve of their own
    figures = {**plot_curves(spec, plotted, records, out_dir / f"{name}_curves.png", columns),
               **plot_partitions(spec, plotted, records, out_dir, name, columns)}
    if figures:
        md += ["", "Figures: " + ", ".join(f"[{k}]({Path(v).name})" for k, v in figures.items())]

    buf = io.StringIO()
    writer = csv.writer(buf)
    cols = ["mean", "std", "paper_mean", "paper_std", "delta", "p_value", "paper_source"]
    writer.writerow(["method", "beta", "metric", *cols, "n_seeds", "expected_seeds", "values", "column",
                     "round_rule", "protocol_differs", "other_papers"])
    for (label, col_id, metric), cell in cells.items():
        beta = next(c.beta for c in columns if c.id == col_id)
        others = "; ".join(f"{v['paper_source']}: " + " ".join(fmt_paper(v)) for p, v in cell["papers"].items()
                           if v["paper_source"] and v["paper_source"] != cell["paper_source"])
        writer.writerow([label, "" if beta is None else beta, metric, *(cell[c] for c in cols), len(cell["values"]),
                         cell["expected"], " ".join(f"{v:.4f}" for v in cell["values"]), col_id, cell["round_rule"],
                         cell["protocol_differs"] or "", others])
    paths = {"md": str(out_dir / f"{name}.md"), "csv": str(out_dir / f"{name}.csv"), "json": str(out_dir / f"{name}.json")}
    atomic_write_text(paths["md"], "\n".join(md) + "\n")
    atomic_write_text(paths["csv"], buf.getvalue())
    write_json(paths["json"], {"table": spec["table"], "dataset": spec["dataset"], "name": name, "title": title,
                               "experiment": runs[0].cfg.experiment if runs else name,
                               "reduced": reduced, "changes": changes or [], "papers": papers,
                               "setup": setup_line(some) if some else "", "figures": figures,
                               "columns": [c.id for c in columns],
                               "protocols": {lab: vars(protocols[lab]) for lab in labels},
                               "cells": [{"method": k[0], "beta": by_id[k[1]].beta, "column": k[1], "metric": k[2], **v}
                                         for k, v in cells.items()]})
    return {**paths, **figures}
