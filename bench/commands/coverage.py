"""`fedbench coverage`: which published cell of results/paper/*.json our table configs reproduce.

For every published cell it prints the config, row and column whose number is printed beside it
(found with the same lookup the table renderer uses, bench/paper_compare.match_table, so coverage
is exactly what the rendered tables show), or ``uncovered: <reason>``:
  - ``protocol differs: ...`` when a row finds the cell but was not measured as the paper measured it,
    ``setup differs: rounds 20 vs 200`` when it trained in another setup (clients, rounds, local epochs,
    client sampling, partition), ``not comparable: ...`` when it is a stand-in;
  - a reason a config gives next to what it concerns (``uncovered: [{paper, table, method, ...,
    reason}]`` in the table config, e.g. "the paper does not state the prompts");
  - else an automatic one: no config compares with that paper / dataset, no column for that
    partition, the metric is not in the config, no row names the method, or rows name it but look up
    another table or setting.
Then a per-paper, per-table summary X/Y, and how many uncovered cells differ by which facet (a cell
counts once per facet of the row closest to the paper's protocol), and per protocol facet how many published
cells have it stated in the paper, read from code or chosen by us (bench/reporting/paper_sources.py).
``--json`` prints all of it as JSON.

    fedbench coverage [--paper [fedbm,fedcb]] [--json] [--uncovered-only]
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.core.errors import FedbenchError
from bench.core.paths import shipped
from bench.reporting.paper_compare import (
    PAPER_METRICS,
    PAPER_NAMES,
    match_row,
    per_paper,
    table_lookups,
)
from bench.reporting.paper_numbers import load_paper_numbers
from bench.reporting.paper_sources import FACETS, KINDS, source_kinds
from bench.scheduling.table_runner import load_table_config, plan_runs
from bench.tables.columns import table_columns
from bench.tables.flags import CommandParser

CELL_ID = ("paper", "table", "dataset", "partition", "method", "metric", "setting")


def cell_key(cell: dict) -> tuple:
    return tuple(cell.get(k) for k in CELL_ID)


@dataclass
class Claim:
    """A table cell of one config that looks up a published cell."""

    config: str
    row: str
    column: str
    metric: str
    differs: str | None
    inferred: bool = False  # the paper's protocol for that cell is inferred, not stated
    kinds: tuple[str, ...] = ()  # what differs ("round", "setup: rounds", ...), when it differs
    reason: str | None = None  # the difference, grouped ("protocol differs: ...; setup differs: ...")


@dataclass
class ConfigIndex:
    """What one table config looks up, for the automatic reasons."""

    path: str
    papers: list[str]
    metrics: list[str]
    lookups: list[tuple[str, str, list[str], dict[str, str | None]]] = field(default_factory=list)
    # (dataset, label, partitions, {paper: method name as printed or None})
    uncovered: list[dict] = field(default_factory=list)


def scan_config(path: Path, cells: list[dict], claims: dict[tuple, list[Claim]]) -> ConfigIndex:
    """Add the claims of one table config; return its index."""
    spec = load_table_config(str(path))
    runs = plan_runs(spec, check_records=False)  # which cells a config claims: its records are not read
    columns = table_columns(spec)
    papers = list(spec.papers)
    mine = [c for c in cells if c["paper"] in papers]
    index = ConfigIndex(str(path), papers, list(spec.metrics), uncovered=list(spec.uncovered))
    for (label, col_id), ref in table_lookups(spec, runs, columns).items():
        names = {p: per_paper(ref.row, "paper_method", p, ref.label) for p in papers}
        index.lookups.append((ref.dataset, label, ref.partitions, names))
        for metric in index.metrics:
            for m in match_row(mine, papers, ref, metric):
                if m.cell is not None:
                    inferred = bool((m.cell.get("protocol") or {}).get("inferred"))
                    claims[cell_key(m.cell)].append(Claim(str(path), label, col_id, metric, m.differs, inferred,
                                                          m.kinds, m.reason))
    return index


def _entry_matches(entry: dict, cell: dict) -> bool:
    for k in ("paper", "table", "dataset", "partition", "metric", "setting"):
        if k in entry and str(entry[k]) != str(cell.get(k)):
            return False
    return "method" not in entry or str(entry["method"]).casefold() == cell["method"].casefold()


def automatic_reason(cell: dict, indexes: list[ConfigIndex]) -> str:
    """Why no config row looks up ``cell``, from what the configs do look up."""
    paper, ds, part, method, metric = cell["paper"], cell["dataset"], cell["partition"], cell["method"], cell["metric"]
    with_paper = [ix for ix in indexes if paper in ix.papers]
    if not with_paper:
        return f"no table config compares with {paper}"
    with_ds = [ix for ix in with_paper if any(lk[0] == ds for lk in ix.lookups)]
    if not with_ds:
        return f"no table config with {paper} has {ds} data"
    names = ", ".join(Path(ix.path).name for ix in with_ds)
    with_part = [ix for ix in with_ds if any(lk[0] == ds and part in lk[2] for lk in ix.lookups)]
    if not with_part:
        return f"no {part} column for {ds} in {names}"
    with_metric = [ix for ix in with_part if any(metric in PAPER_METRICS.get(m, (m,)) for m in ix.metrics)]
    if not with_metric:
        return f"metric {metric} is not in {', '.join(Path(ix.path).name for ix in with_part)}"
    rows = [(ix, lk) for ix in with_metric for lk in ix.lookups
            if lk[0] == ds and part in lk[2] and (lk[3].get(paper) or "").casefold() == method.casefold()]
    if not rows:
        return f"no row for {method} ({paper}) in {', '.join(Path(ix.path).name for ix in with_metric)}"
    want = f"paper_table {cell['table']}" + (f" and paper_setting {cell['setting']}" if cell.get("setting") else "")
    ix, lk = rows[0]
    return (f"row {lk[1]!r} of {Path(ix.path).name} looks up another {method} cell (another table or setting); "
            f"a row with {want} would print this one")


def coverage(config_dir: str = "configs/tables", papers_root: str = "results/paper",
             papers: list[str] | None = None) -> dict[str, Any]:
    """Every published cell with what covers it or why nothing does, and the per-table summary."""
    cells = load_paper_numbers(None, papers_root)
    claims: dict[tuple, list[Claim]] = defaultdict(list)
    indexes, errors = [], []
    configs = sorted(shipped(config_dir).glob("*.yaml"))  # the checkout's or the installed ones
    if not configs:
        raise FedbenchError(f"No table configs (*.yaml) in {config_dir}.")
    for path in configs:
        try:
            indexes.append(scan_config(path, cells, claims))
        except FedbenchError as err:
            errors.append({"config": str(path), "error": str(err)})
    wanted = [c for c in cells if papers is None or c["paper"] in papers]
    out_cells = []
    for cell in wanted:
        found = claims.get(cell_key(cell), [])
        ok = [c for c in found if c.differs is None]
        entry = {k: cell.get(k) for k in CELL_ID} | {"mean": cell["mean"], "std": cell.get("std")}
        entry["covered"] = bool(ok)
        entry["protocol_inferred"] = bool(ok) and ok[0].inferred
        entry["by"] = [{k: v for k, v in vars(c).items() if k not in ("kinds", "reason")} for c in ok]
        entry["differs_in"] = []
        if ok:
            entry["reason"] = None
        elif found:  # the claim closest to the paper's protocol (fewest differences)
            c = min(found, key=lambda c: len(c.kinds))
            entry["reason"] = f"{c.reason} ({Path(c.config).name}, row {c.row!r})"
            entry["differs_in"] = list(dict.fromkeys(c.kinds))
        else:
            given = [(ix, e) for ix in indexes for e in ix.uncovered if _entry_matches(e, cell)]
            if given:
                ix, e = given[0]
                entry["reason"] = f"{e['reason']} ({Path(ix.path).name})"
            else:
                entry["reason"] = automatic_reason(cell, indexes)
        out_cells.append(entry)
    summary: dict[str, dict] = {}
    facets: dict[str, int] = {}  # facet -> uncovered cells whose closest row differs in it
    for e in out_cells:
        for kind in e["differs_in"]:
            facets[kind] = facets.get(kind, 0) + 1
        p = summary.setdefault(e["paper"], {"covered": 0, "total": 0, "inferred": 0, "tables": {}})
        t = p["tables"].setdefault(e["table"], {"covered": 0, "total": 0, "inferred": 0})
        for bucket in (p, t):
            bucket["total"] += 1
            bucket["covered"] += e["covered"]
            bucket["inferred"] += e["protocol_inferred"]
    return {"configs": [str(p) for p in configs], "errors": errors, "summary": summary,
            "differs_by": dict(sorted(facets.items(), key=lambda kv: (-kv[1], kv[0]))),
            "sources": count_sources(wanted), "cells": out_cells}


def count_sources(cells: list[dict]) -> dict[str, dict[str, int]]:
    """facet -> {kind: published cells whose protocol has that facet from that kind of source}."""
    out: dict[str, dict[str, int]] = {}
    for cell in cells:
        for facet, kind in source_kinds(cell).items():
            out.setdefault(facet, dict.fromkeys(KINDS, 0))[kind] += 1
    return {f: out[f] for f in FACETS if f in out}


def pct(covered: int, total: int) -> str:
    return f"{covered}/{total} ({100 * covered / total:.1f}%)" if total else "0/0"


def format_report(result: dict[str, Any], uncovered_only: bool = False) -> str:
    lines = []
    for err in result["errors"]:
        lines.append(f"config error: {err['config']}: {err['error']}")
    for e in result["cells"]:
        if uncovered_only and e["covered"]:
            continue
        what = (f"{e['paper']} {e['table']} | {e['dataset']} {e['partition']} | {e['method']} | {e['metric']}"
                + (f" | {e['setting']}" if e["setting"] else "") + f" = {e['mean']:g}")
        if e["covered"]:
            b = e["by"][0]
            more = f" (+{len(e['by']) - 1} more)" if len(e["by"]) > 1 else ""
            inferred = " (paper's protocol inferred)" if e["protocol_inferred"] else ""
            lines.append(f"{what}: {Path(b['config']).name} row {b['row']!r} column {b['column']}{more}{inferred}")
        else:
            lines.append(f"{what}: uncovered: {e['reason']}")
    lines += ["", ("Coverage (published cells with our number beside them, measured the same way; 'inferred' (†): "
                   "a facet of the paper's protocol for those cells is read from code or chosen by us, not stated):")]
    total_c = total_n = total_i = 0
    for paper, s in result["summary"].items():
        lines.append(f"  {PAPER_NAMES.get(paper, paper)}: {pct(s['covered'], s['total'])}"
                     + (f", {s['inferred']} inferred" if s["inferred"] else ""))
        for table, t in s["tables"].items():
            lines.append(f"    Table {table}: {t['covered']}/{t['total']}"
                         + (f" ({t['inferred']} inferred)" if t["inferred"] else ""))
        total_c, total_n, total_i = total_c + s["covered"], total_n + s["total"], total_i + s["inferred"]
    lines.append(f"  all: {pct(total_c, total_n)}" + (f", {total_i} inferred" if total_i else ""))
    differing = sum(1 for e in result["cells"] if e["differs_in"])
    lines += ["", (f"Not comparable although a row finds the cell: {differing} cells; by facet (a cell counts once "
                   "per facet it differs in; 'setup: ...' = clients, rounds, local epochs, client sampling, partition):")]
    lines += [f"  {kind}: {n}" for kind, n in result["differs_by"].items()] or ["  none"]
    lines += ["", ("Where the papers' protocol facets come from (published cells per facet: stated in the paper / "
                   "read from its public code / chosen by us; docs/departures.md):")]
    lines += [f"  {facet}: " + ", ".join(f"{kind} {n}" for kind, n in kinds.items())
              for facet, kinds in result["sources"].items()] or ["  no sources recorded"]
    return "\n".join(lines)


def build_parser() -> CommandParser:
    parser = CommandParser(prog="fedbench coverage", description=__doc__)
    parser.add_argument("--configs", default="configs/tables", help="directory of table configs")
    parser.add_argument("--papers-root", default="results/paper", help="directory of the papers' numbers")
    parser.add_argument("--paper", type=list[str] | None, default=None,
                        help="only these papers, e.g. --paper [fedbm,fedcb]; default: all")
    parser.add_argument("--json", type=bool, default=False, help="print the result as JSON")
    parser.add_argument("--uncovered-only", type=bool, default=False, help="list only the uncovered cells")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    result = coverage(args.configs, args.papers_root, args.paper)
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(format_report(result, args.uncovered_only))
    return 0
