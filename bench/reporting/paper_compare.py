"""Ours vs the papers for every cell of a table config: which published cell it is compared with,
whether it was measured the same way, the difference and a Welch t-test.

This is the one lookup both the table renderer (bench/reporting/tables.py) and ``fedbench coverage``
(bench/commands/coverage.py) use, so coverage is exactly what the tables print.

A table config names its paper(s) (``paper: fedbm`` or a list); each row names its method as the
paper prints it (``paper_method``, default: the row label; matched case-insensitively, so FedBM's
"FedDyn" and FedCB's "FedDYN" are one name). ``paper_method`` / ``paper_table`` / ``paper_setting``
are a string for every paper, or a mapping ``{paper: value}``; ``paper_method: {fedcb: null}``
compares the row with no FedCB cell. A cell is looked up by the papers' dataset key (the row's
``paper_dataset``, else the table's, else the row's ``data.name`` mapped by ``PAPER_DATASETS``), the
column's partition (bench/tables/columns.py; partition-independent rows fall back to the papers' ``none``,
or use their own one-client (``none``), iid, shards or natural partition), the method and the metric; comparison tables
first, then ablations, unless the row names a table or a setting.

A found cell is compared only when the row's protocol (bench/tables/protocols.py) is the paper's
and its run's setup (clients, rounds, local epochs, client sampling, partition) is the paper's;
otherwise it says ``protocol differs: <what>`` / ``setup differs: rounds 20 vs 200`` and has no
difference and no p-value. A row whose runs were changed with ``--set`` or that stands in for the
paper's data (it runs another dataset than the ``paper_dataset`` it names, or the table config says
``stand_in: <why>``) is never compared: ``not comparable: <why>``. Papers report
mean ± std over 3 runs (FedBM, FedCB) or five folds (FedNPR; ``PAPER_RUNS``); single runs (FACMIC,
FST-CBDG) have no std, hence no p-value.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bench.core.errors import FedbenchError
from bench.reporting.paper_numbers import load_paper_numbers
from bench.reporting.paper_sources import inferred_facets, source_kinds
from bench.tables.columns import Column
from bench.tables.protocols import (
    RowProtocol,
    describe_facets,
    difference_text,
    protocol_facets,
    row_protocol,
)
from bench.tables.table_row import PAPER_REF_KEYS, TableRow
from bench.tables.table_spec import TableSpec

# runs behind a paper's mean ± std (the Welch test's n): 3 seeds (FedBM, FedCB), FedNPR's five-fold CV
PAPER_RUNS = {"fedbm": 3, "fedcb": 3, "fednpr": 5}
DEFAULT_PAPER_RUNS = 3
PAPER_NAMES = {"fedbm": "FedBM", "fedcb": "FedCB", "fednpr": "FedNPR", "facmic": "FACMIC", "fstcbdg": "FST-CBDG"}
# our data.name -> the papers' dataset key, where they differ
PAPER_DATASETS = {"brain-tumor": "bt", "skin-cancer": "sc", "real-skin": "real"}
# our metric -> the papers' names for it: FedNPR's bAUC is the mean one-vs-rest AUC over the classes
# present in the test split, which is how bench/engine/metrics.py computes auc
PAPER_METRICS = {"auc": ("auc", "balanced_auc")}


def load_cells(spec: TableSpec, root: str = "results/paper") -> list[dict]:
    return [c for p in spec.papers for c in load_paper_numbers(p, root)]


def per_paper(row: TableRow, key: str, paper: str, default: Any = None) -> Any:
    """A row's ``paper_method`` / ``paper_table`` / ``paper_setting`` for one paper."""
    value = getattr(row, key)
    if value is None:
        return default
    if isinstance(value, dict):  # a mapping lists the papers the row is compared with
        return value.get(paper, None if key == "paper_method" else default)
    return value


def check_row_refs(spec: TableSpec, row: TableRow, where: str) -> None:
    """Mappings in a row's paper keys must name the table's papers."""
    papers = set(spec.papers)
    for key in PAPER_REF_KEYS:
        value = getattr(row, key)
        if isinstance(value, dict) and not set(value) <= papers:
            raise FedbenchError(f"{where}: {key} names paper(s) {sorted(set(value) - papers)} that the table "
                                f"does not compare with (paper: {sorted(papers)}).")


def own_partition_key(partition: dict[str, Any]) -> str | None:
    """The papers' partition key of a row's own partition: ``none`` for one client (centralised),
    else its column's when it is drawn without a concentration (iid, natural, shards-<s>); None otherwise."""
    from bench.tables.columns import CONCENTRATION_KINDS, column_of, run_column

    if partition.get("num_clients") == 1:
        return "none"
    if not partition.get("scheme") or partition["scheme"] in CONCENTRATION_KINDS:
        return None
    column = column_of(run_column(partition))
    return None if column is None or column.derived else column.paper_partition


@dataclass
class RowLookup:
    """What one table row (in one column) looks up in the papers, and how it is measured."""

    label: str
    row: TableRow
    dataset: str
    protocol: RowProtocol
    partitions: list[str]  # papers' partition keys to try, in order


def row_lookup(spec: TableSpec, run, column: Column) -> RowLookup:
    """The lookup of ``run``'s row in ``column`` (``run`` is the row's PlannedRun in that column)."""
    row = run.row
    where = f"Table {spec.name}, row {row.label!r}"
    check_row_refs(spec, row, where)
    dataset = row.paper_dataset or spec.paper_dataset or PAPER_DATASETS.get(
        run.cfg.data.name, run.cfg.data.name)
    own = own_partition_key(row.partition) if row.partition_independent else None
    if own is not None:
        partitions = [own]
    elif row.partition_independent:
        partitions = [column.paper_partition, "none"]
    else:
        partitions = [column.paper_partition]
    protocol = row_protocol(run.cfg, row, spec, where, getattr(run, "overrides", None), stand_in_reason(spec, run))
    return RowLookup(row.label, row, dataset, protocol, partitions)


def stand_in_reason(spec: TableSpec, run) -> str | None:
    """Why ``run``'s row stands in for a paper's data: the table config's ``stand_in``, or the row names a
    ``paper_dataset`` other than the data it runs (a transfer row, data.test_dataset, tests on another
    dataset by design); None when it runs the paper's data."""
    if spec.stand_in:
        return spec.stand_in
    named = run.row.paper_dataset or spec.paper_dataset
    own = PAPER_DATASETS.get(run.cfg.data.name, run.cfg.data.name)
    if named and named != own and not run.cfg.data.test_dataset:
        return f"it runs {run.cfg.data.name}, not the paper's {named}"
    return None


def find_cell(cells: list[dict], paper: str, dataset: str, partitions: list[str], method: str, metric: str,
              table: str | None = None, setting: str | None = None) -> dict | None:
    """The published cell of ``paper``: first partition that has one, comparison tables first."""
    name = method.casefold()
    for partition in partitions:
        metrics = PAPER_METRICS.get(metric, (metric,))
        hits = [c for c in cells if c["paper"] == paper and c["dataset"] == dataset and c["partition"] == partition
                and c["method"].casefold() == name and c["metric"] in metrics and c.get("mean") is not None
                and (table is None or c["table"] == str(table)) and (setting is None or c.get("setting") == setting)]
        if hits:
            hits.sort(key=lambda c: (c.get("table_kind") != "comparison", c.get("setting") is not None))
            return hits[0]
    return None


@dataclass
class Match:
    """One paper's side of one table cell: its published cell (or None) and whether it is comparable."""

    paper: str
    cell: dict | None
    differs: str | None = None  # why it is not comparable (difference_text); None when comparable (or no cell)
    facets: str | None = None  # its short form, as the paper column prints it ("protocol differs: evaluation,
    # round", "setup differs: rounds 20 vs 200", "not comparable: ...")
    kinds: tuple[str, ...] = ()  # what differs, one name per facet ("round", "setup: rounds", "overridden")
    reason: str | None = None  # its long form, grouped ("protocol differs: ...; setup differs: ...")

    @property
    def comparable(self) -> bool:
        return self.cell is not None and self.differs is None

    @property
    def source(self) -> str | None:
        return None if self.cell is None else f"{self.paper} Table {self.cell['table']}"


def match_row(cells: list[dict], papers: list[str], ref: RowLookup, metric: str) -> list[Match]:
    """One Match per paper for a row's cell in one column and metric."""
    out = []
    for paper in papers:
        method = per_paper(ref.row, "paper_method", paper, ref.label)
        if method is None:
            out.append(Match(paper, None))
            continue
        cell = find_cell(cells, paper, ref.dataset, ref.partitions, method, metric,
                         per_paper(ref.row, "paper_table", paper), per_paper(ref.row, "paper_setting", paper))
        facets = [] if cell is None else protocol_facets(ref.protocol, cell.get("protocol") or {})
        out.append(Match(paper, cell, difference_text(facets), describe_facets(facets, short=True),
                         tuple(f.kind for f in facets), describe_facets(facets)))
    return out


def table_lookups(spec: TableSpec, runs: list, columns: list[Column]) -> dict[tuple[str, str], RowLookup]:
    """(row label, column id) -> what that table cell looks up, for every cell the table prints."""
    out: dict[tuple[str, str], RowLookup] = {}
    for label in dict.fromkeys(r.label for r in runs):
        mine = [r for r in runs if r.label == label]
        for column in columns:
            run = mine[0] if column.derived else next((r for r in mine if column.id in r.columns), None)
            if run is not None:
                out[(label, column.id)] = row_lookup(spec, run, column)
    return out


def match_table(spec: TableSpec, runs: list, columns: list[Column], cells: list[dict] | None = None
                ) -> dict[tuple[str, str, str], list[Match]]:
    """(row label, column id, metric) -> one Match per paper of the table, for every cell it prints."""
    cells = load_cells(spec) if cells is None else cells
    papers = list(spec.papers)
    out: dict[tuple[str, str, str], list[Match]] = {}
    for (label, col_id), ref in table_lookups(spec, runs, columns).items():
        for metric in spec.metrics:
            out[(label, col_id, metric)] = match_row(cells, papers, ref, metric)
    return out


def row_protocols(spec: TableSpec, runs: list) -> dict[str, RowProtocol]:
    """label -> the protocol of the row (its first run)."""
    out = {}
    for r in runs:
        if r.label not in out:
            out[r.label] = row_protocol(r.cfg, r.row, spec, f"Table {spec.name}, row {r.label!r}",
                                        getattr(r, "overrides", None), stand_in_reason(spec, r))
    return out


def welch_p(mean1: float, std1: float, n1: int, mean2: float, std2: float, n2: int) -> float | None:
    """Two-sided Welch t-test p-value from summary statistics; None unless both sides have >= 3
    runs and a positive spread."""
    if n1 < 3 or n2 < 3 or std1 is None or std2 is None or (std1 <= 0 and std2 <= 0):
        return None
    from scipy import stats  # here, not at import: `fedbench coverage` never tests

    p = stats.ttest_ind_from_stats(mean1, std1, n1, mean2, std2, n2, equal_var=False).pvalue
    return float(p) if math.isfinite(p) else None


def compare(cell: dict, match: Match | None) -> dict:
    """Paper mean/std/source, delta = ours - paper, Welch p (None where not computable), the
    protocol difference that withholds them, and where the compared cell's protocol facets come from
    (``paper_sources``: facet -> stated / code / ours; ``protocol_inferred`` when one is not stated)."""
    if match is None or match.cell is None:
        return {"paper_mean": None, "paper_std": None, "paper_source": None, "delta": None, "p_value": None,
                "protocol_differs": None, "protocol_differs_in": None, "protocol_inferred": False,
                "paper_sources": None}
    if match.differs is not None:
        return {"paper_mean": None, "paper_std": None, "paper_source": match.source, "delta": None,
                "p_value": None, "protocol_differs": match.differs, "protocol_differs_in": match.facets,
                "protocol_inferred": False, "paper_sources": None}
    paper = match.cell
    ours = cell["mean"]
    delta = None if ours is None else ours - paper["mean"]
    p = None
    if ours is not None and paper.get("std") is not None:
        p = welch_p(ours, cell["std"], len(cell["values"]), paper["mean"], paper["std"],
                    PAPER_RUNS.get(match.paper, DEFAULT_PAPER_RUNS))
    return {"paper_mean": paper["mean"], "paper_std": paper.get("std"), "paper_source": match.source,
            "delta": delta, "p_value": p, "protocol_differs": None, "protocol_differs_in": None,
            "protocol_inferred": bool(inferred_facets(paper)), "paper_sources": source_kinds(paper) or None}
