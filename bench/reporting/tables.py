"""Render a table from run records: ours (mean +- std over seeds) per (row, column, metric), the paired
difference to the baseline row (FedAvg) over seeds with its 95% interval, beside each paper's number, the
difference and a Welch p-value; missing stays missing; PNG figures alongside.

What a reader can trust (bench/reporting/uncertainty.py): every row runs on the same partition per seed,
so the paired difference to FedAvg removes the partition's share of the seed-to-seed spread; the notes give
the test-set standard error of one run's accuracy; per column the best global-model federated row is in
bold with every row whose mean +- std overlaps it, never a cell at or below chance, collapsed or from one
seed (bench/reporting/cell_marks.py marks those cells, and says when the test set is class-balanced).
Paper columns that would print only "n/a" (no paper has a number there) are left out of the Markdown (the
CSV and JSON keep every field).

Ours is the test metric at the round the row's round rule picks (bench/tables/protocols.py), computed from
each record's per-round history. A paper's number is shown only where the row was measured as the
paper measured it; elsewhere its column says "protocol differs: <what>" (bench/reporting/paper_compare.py).
One column group per paper that has a cell in the table, so every number names its paper.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.assembly.records import find_record, load_record
from bench.core.atomic_io import atomic_write_text, write_json
from bench.core.errors import FedbenchError
from bench.core.paths import plain_name
from bench.reporting.cell_marks import (
    ON_GLOBAL_TEST,
    balanced_test_note,
    chance_legend,
    mark_cells,
    run_health,
)
from bench.reporting.departures import (
    cell_departures,
    departure_legend,
    id_key,
    load_departures,
    table_departures,
)
from bench.reporting.paper_compare import (
    compare,
    load_cells,
    match_table,
    row_protocols,
)
from bench.reporting.paper_sources import FACETS, inferred_facets
from bench.reporting.plots import plot_curves, plot_partitions
from bench.reporting.table_files import csv_text, table_json
from bench.reporting.table_grid import Grid, fmt, grid_header, grid_rows, markdown_blocks  # noqa: F401 (fmt: tests)
from bench.reporting.uncertainty import ALPHA, best_with_ties, binomial_se, paired_difference
from bench.tables.columns import Column, table_columns
from bench.tables.protocols import EVALS, ROUND_RULES, RowProtocol, metric_at
from bench.tables.table_overrides import REDUCED_TITLE
from bench.tables.table_spec import TableSpec

METRIC_LABELS = {"accuracy": "Acc", "f1": "F1", "balanced_accuracy": "bAcc", "auc": "AUC", "precision": "Prec"}


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None)  # one seed: no spread


def collect(spec: TableSpec, runs: list, records: dict[int, dict], columns: list[Column],
            protocols: dict[str, RowProtocol]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(row label, column id, metric) -> values over seeds, their mean/std and how many were expected.
    A derived column (``average``) holds, per seed, the mean of the row's values in the other columns."""
    cells: dict[tuple[str, str, str], dict[str, Any]] = {}
    metrics = spec.metrics
    each = repeat_word(spec)
    for run in runs:
        rec = records.get(id(run))
        rule = protocols[run.label].round
        notes, collapsed = run_health(rec, rule) if rec is not None else ([], None)
        for col_id in run.columns:
            for metric in metrics:
                cell = cells.setdefault((run.label, col_id, metric), {"values": [], "seeds": [], "expected": 0})
                cell["expected"] += 1
                value = None if rec is None else metric_at(rec, metric, rule)
                if value is not None:
                    cell["values"].append(value)
                    cell["seeds"].append(run.seed)
                    n_test = (rec.get("splits") or {}).get("test")
                    if metric == "accuracy" and n_test:
                        cell.setdefault("test_se_values", []).append(binomial_se(value, int(n_test)))
                        cell["n_test"] = int(n_test)
                    cell["warnings"] = cell.get("warnings", []) + [f"{each} {run.seed}: {w}" for w in notes]
                    if collapsed is not None:
                        cell.setdefault("collapsed", []).append([run.seed, collapsed])
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
                                  if w.startswith(f"{each} {seed}: ")]
                        if warned:  # an average over a suspect run is suspect too
                            cell["warnings"] = cell.get("warnings", []) + list(dict.fromkeys(warned))
                cells[(label, derived.id, metric)] = cell
    average_rows(runs, cells, columns, metrics)
    for cell in cells.values():
        cell["mean"], cell["std"] = mean_std(cell["values"])
    return cells


def average_rows(runs: list, cells: dict, columns: list[Column], metrics: list[str]) -> None:
    """Rows with ``average_of`` (bench/scheduling/table_runner.py): per seed and column, the mean of
    the listed rows' values where all of them have one."""
    derived = {r.label: list(r.row.average_of) for r in runs if r.row.derived}
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


def load_records(runs: list) -> dict[int, dict]:
    """id(run) -> its record, for runs that have one."""
    out = {}
    for r in runs:
        path = find_record(r.cfg)
        if path is not None:
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
        for rec in (records.get(id(r)) for r in runs if r.label == label and not r.row.derived):
            if rec is not None and label not in groups.setdefault(rec.get("backbone", "?"), []):
                groups[rec.get("backbone", "?")].append(label)
    return "Weights: " + "; ".join(f"{w} ({', '.join(rows)})" for w, rows in groups.items()) + "."


def baseline_label(spec: TableSpec, runs: list) -> str | None:
    """The row every other row is paired with: ``baseline:`` in the table config (a row label, or null for
    none), else the row labelled FedAvg, else the first row whose method is fedavg; None when there is none."""
    labels = list(dict.fromkeys(r.label for r in runs))
    if spec.baseline_given:
        label = spec.baseline
        if label is not None and label not in labels:
            raise FedbenchError(f"Table {spec.name}: baseline {label!r} is not a row label; "
                                f"rows: {labels}.")
        return label
    if "FedAvg" in labels:
        return "FedAvg"
    return next((r.label for r in runs if r.cfg.method.name == "fedavg"), None)


def reference_eval(labels: list[str], protocols: dict[str, RowProtocol], baseline: str | None) -> str:
    """What the comparable rows evaluate: the baseline's evaluation, else the most common one."""
    if baseline is not None:
        return protocols[baseline].eval
    evals = [protocols[lab].eval for lab in labels]
    return max(dict.fromkeys(evals), key=evals.count)


def add_uncertainty(cells: dict, columns: list[Column], metrics: list[str], labels: list[str], runs: list,
                    protocols: dict[str, RowProtocol], baseline: str | None) -> None:
    """Per cell: ``paired`` (the paired difference to the baseline, or None with ``paired_note`` saying why),
    ``test_se`` (the mean over seeds of the binomial standard error of a global-model accuracy) and ``best``."""
    ref = reference_eval(labels, protocols, baseline)
    independent = {r.label for r in runs if r.row.partition_independent}
    for (label, col_id, metric), cell in cells.items():
        ses = [v for v in cell.pop("test_se_values", []) if v is not None]
        cell["test_se"] = statistics.fmean(ses) if ses and protocols[label].eval == "global" else None
        cell["paired"], cell["paired_note"] = None, None
        if baseline is None:
            continue
        if label == baseline:
            cell["paired_note"] = "baseline"
        elif protocols[label].eval != protocols[baseline].eval:
            cell["paired_note"] = f"not comparable: {protocols[label].eval} evaluation"
        elif not cell["values"]:
            cell["paired_note"] = "missing"
        else:
            base = cells[(baseline, col_id, metric)]
            diff = paired_difference(cell["values"], cell["seeds"], base["values"], base["seeds"])
            cell["paired"] = diff.to_json() if diff else None
            cell["paired_note"] = None if diff else "no seed shared with the baseline"
    for col in columns:
        for metric in metrics:
            candidates = [cells[(lab, col.id, metric)] | {"label": lab} for lab in labels
                          if protocols[lab].eval == ref and lab not in independent]
            shown = [c for c in candidates if c["mean"] is not None]
            # at or below chance, collapsed or one seed: never best (cell_marks.py)
            best = best_with_ties({c["label"]: (c["mean"], c["std"]) for c in shown if c.get("bold_ok", True)}
                                  ) if len(shown) >= 2 else set()
            for lab in labels:
                cells[(lab, col.id, metric)]["best"] = lab in best


EVAL_NAMES = {"global": "global-model", "per_client": "per-client", "local_mean": "client-mean"}


def folds_run(spec: TableSpec, article: str = "the ") -> str:
    """Which folds a fold table's mean ± std is over: "the 5 folds" ("5 folds" with article=""), or with
    --folds "fold 0 of the 5 folds"."""
    folds, run = spec.folds, spec.run_folds
    if run is None:
        return f"{article}{folds} folds"
    return f"fold{'s' if len(run) > 1 else ''} {', '.join(str(k) for k in run)} of the {folds} folds"


def repeat_word(spec: TableSpec) -> str:
    """What a table repeats its runs over, as its legend and warnings name it: "fold" with ``folds``, else "seed"."""
    return "fold" if spec.folds else "seed"


def test_se_line(cells: dict) -> list[str]:
    """The legend's test-set standard error of one run's accuracy (global-model rows), if any."""
    ses = [c["test_se"] for c in cells.values() if c.get("test_se") is not None]
    n_test = sorted({c["n_test"] for c in cells.values() if c.get("test_se") is not None and c.get("n_test")})
    if not ses:
        return []
    sizes = " / ".join(str(n) for n in n_test)
    return [(f"Test-set standard error: one run's accuracy on the {sizes} test images varies by "
             f"100·sqrt(p(1 − p)/n) = {min(ses):.2f}–{max(ses):.2f} pp from the test sample alone "
             "(global-model rows; per cell in the CSV/JSON as test_se); the seed-to-seed std includes it.")]


def paper_legend(cells: dict, papers: list[str]) -> str:
    """The legend of the paper columns: what they print, where the cells come from, what † marks."""
    shown = ", ".join(papers) or "none"
    line = (f"Paper: the published mean ± std ({shown}; n/a where the paper has no such cell), "
            "Δ = ours − paper, p = two-sided Welch t-test where both sides have >= 3 runs.")
    sources = sorted({cell["papers"][p]["paper_source"] for cell in cells.values() for p in papers
                      if cell["papers"][p]["paper_source"]})
    if sources:
        line += (f" Published cells from {', '.join(sources)}; where the paper measured something else (what "
                 "is evaluated, the reporting round, the model) its column says 'protocol differs', where it "
                 "trained in another setup (clients, rounds, local epochs, client sampling, partition) 'setup "
                 "differs: <ours> vs <paper's>', and a row run with --set overrides or standing in for the "
                 "paper's data says 'not comparable'; none of them gives a Δ or a p.")
    inferred: dict[str, set[str]] = {}  # row -> the paper's facets for it that are not stated
    for (label, _, _), cell in cells.items():
        inferred.setdefault(label, set()).update(f for p in papers for f in inferred_facets(cell["papers"][p]))
    named = "; ".join(f"{lab}: {', '.join(f for f in FACETS if f in fs)}" for lab, fs in inferred.items() if fs)
    if named:
        line += (" †: the paper does not state every facet of how it measured that row; these are read from "
                 f"its public code or chosen by us ({named}; sources in results/paper).")
    return line


def legend_lines(spec: TableSpec, labels: list[str], protocols: dict[str, RowProtocol], cells: dict, papers: list[str],
                 baseline: str | None, paper_shown: bool, columns: list[Column], runs: list,
                 records: dict[int, dict] | None = None) -> list[str]:
    """The table's legend, one Markdown bullet per kind of column and mark."""
    shown = ", ".join(papers) or "none"
    each = repeat_word(spec)
    over = (f"{folds_run(spec)} (data.fold 0..{spec.folds - 1}; seed {spec.seeds[0]} in every fold)"
            if spec.folds else f"seeds {list(spec.seeds)}")
    lines = [f"Ours: mean ± sample std over {over} (%). {protocol_note(labels, protocols, spec.round_rule)}"]
    if baseline is not None:
        others = [lab for lab in labels if lab != baseline and protocols[lab].eval != protocols[baseline].eval]
        line = (f"Δ {baseline}: every row runs on the same partition per {each}, so per {each} the row minus "
                f"{baseline} (same partition, same {each}), averaged over the {each}s both have, with its 95% "
                f"interval (paired t-test, n − 1 degrees of freedom); * marks p < {ALPHA:g} (the interval "
                f"excludes 0), not corrected for the table's many comparisons.")
        if others:
            line += f" Rows evaluated otherwise ({', '.join(others)}) show —: they are not comparable with {baseline}."
        lines.append(line)
    ref = reference_eval(labels, protocols, baseline)
    independent = list(dict.fromkeys(r.label for r in runs if r.row.partition_independent))
    lines.append(f"Bold: per column, the best mean of the {EVAL_NAMES[ref]} rows"
                 + (f" (not {', '.join(independent)}, a reference)" if independent else "")
                 + ", and every such row whose mean ± std overlaps it (mean + std ≥ best mean − best std); never a "
                 "cell at or below chance, with a collapsed run or from one seed.")
    lines += chance_legend(cells)
    balanced = balanced_test_note([rec for r in runs if protocols[r.label].eval in ON_GLOBAL_TEST
                                   for rec in [(records or {}).get(id(r))] if rec is not None])
    if balanced:
        lines.append(balanced)
    lines += test_se_line(cells)
    if paper_shown:
        lines.append(paper_legend(cells, papers))
    elif papers:
        lines.append(f"No paper ({shown}) has a number for these cells: the paper columns are left out.")
    if any(c.derived for c in columns):
        lines.append(f"average: per {each}, the mean of the row's other columns.")
    lines.append("Rows without records are shown as missing, never filled.")
    return [f"- {line}" for line in lines]


def warning_lines(cells: dict, by_id: dict[str, Column]) -> list[str]:
    """The ⚠ list under the table: each run's health notes, at the round its row prints."""
    warned = {f"{label} {by_id[col_id].label}: {w}" for (label, col_id, _), cell in cells.items()
              if not by_id[col_id].derived for w in cell.get("warnings", [])}
    if not warned:
        return []
    return ["", "⚠ Runs with a health note, at the round the table prints (their numbers are shown but suspect):",
            *(f"- {w}" for w in sorted(warned))]


@dataclass
class Assembled:
    """A table's cells with what renders them: its columns and metrics, rows (labels), their protocols,
    the baseline row, the records, the papers it names and those with a cell in it (``groups``)."""

    cells: dict
    columns: list[Column]
    metrics: list[str]
    labels: list[str]
    protocols: dict[str, RowProtocol]
    baseline: str | None
    records: dict[int, dict]
    papers: list[str]
    groups: list[str]
    departures: dict[str, str] = field(default_factory=dict)  # id -> legend text, of every id a row carries


def assemble(spec: TableSpec, runs: list, papers_root: str) -> Assembled:
    """Every cell of the table: ours from the records, marked (cell_marks.py), compared with each paper's
    cell (paper_compare.py), with its paired difference to the baseline and its bold (uncertainty.py)."""
    metrics = list(spec.metrics)
    columns = table_columns(spec)
    labels = list(dict.fromkeys(r.label for r in runs))
    protocols = row_protocols(spec, runs)
    baseline = baseline_label(spec, runs)
    records = load_records(runs)
    cells = collect(spec, runs, records, columns, protocols)
    mark_cells(cells, protocols, list(records.values()))
    matches = match_table(spec, runs, columns, load_cells(spec, papers_root))
    papers = list(spec.papers)
    # one column group per paper with a cell in this table; one plain "paper" group when none has
    groups = [p for p in papers if any(m.cell is not None for ms in matches.values() for m in ms if m.paper == p)]
    for key, cell in cells.items():
        ms = {m.paper: m for m in matches.get(key, [])}
        per = {p: compare(cell, ms.get(p)) for p in papers}
        primary = next((p for p in papers if ms.get(p) is not None and ms[p].cell is not None), None)
        cell.update(per[primary] if primary else compare(cell, None))
        cell["papers"] = {p: per[p] for p in papers}
        cell["round_rule"] = protocols[key[0]].round
    add_uncertainty(cells, columns, metrics, labels, runs, protocols, baseline)
    return Assembled(cells, columns, metrics, labels, protocols, baseline, records, papers, groups,
                     mark_departures(spec, runs, protocols, cells))


def mark_departures(spec: TableSpec, runs: list, protocols: dict[str, RowProtocol], cells: dict) -> dict[str, str]:
    """Per cell: ``departures``, the ids of the departures (docs/departures.md) that can move it; returns
    id -> legend text for every id the table prints."""
    deps = load_departures()
    found = table_departures(spec.table, runs, protocols, deps)
    for (label, col_id, _), cell in cells.items():
        cell["departures"] = cell_departures(found, label, col_id)
    used = sorted({i for cell in cells.values() for i in cell["departures"]}, key=id_key)
    return {i: deps[i].text for i in used}


def setup_record(runs: list, records: dict[int, dict]) -> dict | None:
    """The record the setup line describes: a federated row's (a zero-shot or central row runs another budget)."""
    federated = [records[id(r)] for r in runs if id(r) in records and not r.row.partition_independent]
    return federated[0] if federated else next(iter(records.values()), None)


def markdown(spec: TableSpec, runs: list, a: Assembled, grid: Grid, title: str, changes: list[str] | None) -> list[str]:
    """The Markdown page: title, what a stand-in cannot show, changes, setup, legend, the grid, the ⚠
    list, the footnotes and the config's notes."""
    some = setup_record(runs, a.records)
    md = [f"# {title}", "", *([f"**What this stand-in cannot show:** {spec.cannot_show.strip()}", ""]
                              if spec.cannot_show else [])]
    if changes:
        md += [*changes, ""]
    if some is not None:
        md += [f"Setup: {setup_line(some)}.", "", weights_line(a.labels, runs, a.records), ""]
    paper_shown = any(shown for _, _, shown in grid.layout)
    legend = legend_lines(spec, a.labels, a.protocols, a.cells, a.papers, a.baseline, paper_shown, a.columns, runs,
                          a.records)
    legend += [f"- {label}: per {repeat_word(spec)}, the mean of rows {', '.join(sources)}."
               for label, sources in ((r.label, r.row.average_of) for r in runs if r.row.derived)]
    md += [*dict.fromkeys(legend), *departure_legend(a.departures), ""]
    md += markdown_blocks(grid)
    md += warning_lines(a.cells, {c.id: c for c in a.columns})
    if grid.footnotes:
        md += ["", "Protocol and setup differences (ours vs the paper's cell): "
               + " ".join(f"[{n}] {text}." for text, n in grid.footnotes.items())]
    if spec.notes:
        md += ["", spec.notes.strip()]
    return md


class LessCompleteTable(FedbenchError):
    """Rendering would replace a table with one whose cells have fewer values (records missing here)."""


def cells_lost(json_path: Path, cells: dict) -> tuple[int, int]:
    """(cells of the table already at ``json_path`` that have values, how many of them ``cells`` would
    hold fewer values in); (0, 0) when there is no readable table there."""
    try:
        old = json.loads(json_path.read_text())["cells"]
        had = {(c["method"], c["column"], c["metric"]): len(c.get("values") or []) for c in old}
    except (OSError, ValueError, KeyError, TypeError):
        return 0, 0
    filled = {k: n for k, n in had.items() if n}
    return len(filled), sum(len(cells[k]["values"]) < n for k, n in filled.items() if k in cells)


def keep_complete(json_path: Path, cells: dict) -> None:
    """Refuse (LessCompleteTable) to replace the table at ``json_path`` with ``cells`` when any cell they
    share would lose values: nothing is written then."""
    had, lost = cells_lost(json_path, cells)
    if lost:
        md = json_path.with_suffix(".md")
        raise LessCompleteTable(
            f"Not written: {md} (and its .csv, .json, figures) has {had} cells with values, and {lost} of them would "
            f"have fewer values (or say 'missing') when rendered from the run records found now (their records "
            f"are not in the output folder). Run the table without --render-only to produce them, or pass "
            f"--replace-table to overwrite it with the less complete table.")


def render_table(spec: TableSpec, runs: list, tables_dir: str = "results/tables", papers_root: str = "results/paper",
                 name: str | None = None, changes: list[str] | None = None, reduced: bool = False, title_note: str = "",
                 replace: bool = False) -> dict[str, str]:
    """Write <name>.{md,csv,json} (+ PNG figures) from the runs' records; returns the paths.
    ``papers_root``: where the papers' numbers are (results/paper). ``name`` defaults to
    <table>_<dataset>; ``changes`` (bench/tables/table_overrides.py) says how the runs differ from the
    config; ``reduced``: not the config's budget, which the title then says (``title_note``: what it says instead). A table already there is never
    replaced by a less complete one (keep_complete) unless ``replace``."""
    name = plain_name(name or spec.name, "the table's name", tables_dir)
    a = assemble(spec, runs, papers_root)
    if not replace:
        keep_complete(Path(tables_dir) / f"{name}.json", a.cells)
    grid = Grid(each=repeat_word(spec))
    grid_header(grid, a.cells, a.labels, a.columns, a.metrics, a.baseline, a.groups, a.papers, METRIC_LABELS)
    grid_rows(grid, a.cells, a.labels, a.baseline)
    title = spec.shown_title + (
        title_note or (REDUCED_TITLE if reduced else ""))
    md = markdown(spec, runs, a, grid, title, changes)
    out_dir = Path(tables_dir)
    plotted = [r for r in runs if not r.row.derived]  # derived rows have no curve of their own
    figures = {**plot_curves(spec, plotted, a.records, out_dir / f"{name}_curves.png", a.columns, baseline=a.baseline),
               **plot_partitions(spec, plotted, a.records, out_dir, name, a.columns)}
    if figures:
        md += ["", "Figures: " + ", ".join(f"[{k}]({Path(v).name})" for k, v in figures.items())]
    by_id = {c.id: c for c in a.columns}
    some = setup_record(runs, a.records)
    paths = {"md": str(out_dir / f"{name}.md"), "csv": str(out_dir / f"{name}.csv"), "json": str(out_dir / f"{name}.json")}
    atomic_write_text(paths["md"], "\n".join(md) + "\n")
    atomic_write_text(paths["csv"], csv_text(a.cells, by_id, a.baseline))
    write_json(paths["json"], table_json(
        a.cells, by_id, table=spec.table, dataset=spec.dataset, name=name, title=title,
        experiment=runs[0].cfg.experiment if runs else name, reduced=reduced, changes=changes or [], papers=a.papers,
        baseline=a.baseline, setup=setup_line(some) if some else "", figures=figures,
        columns=[c.id for c in a.columns], protocols={lab: vars(a.protocols[lab]) for lab in a.labels},
        departures=a.departures))
    return {**paths, **figures}
