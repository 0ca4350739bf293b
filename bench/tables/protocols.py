"""Evaluation protocols: what is evaluated (``eval``), at which round (``round``), of which model, and
the setup it was trained in (``setup``).

A published number is comparable with ours only when both were measured the same way, in the same setup.
The measurement facets:

eval (what is scored; a run's is its method's default, or ``fed.protocol``):
    global      the global (aggregated) model on the global test set. For methods with per-client
                parts the global model has the initial ones (FedRep: the averaged body with the
                never-trained initial head, as FedETF's code tests it) and ``global_logits``
                (FedRoD: its generic head only).
    per_client  each client's model right after its local training, on that client's own test split;
                the mean over clients.
    local_mean  each client's model right after its local training, on the global test set; the mean
                over clients.
    unknown     (papers only) not stated.

round (which round's test metrics a run reports; computed at render time from the record's history):
    best-val-acc   the round with the highest validation accuracy (first such round)
    best-val-sum5  the round with the highest val accuracy + micro recall + macro precision + macro F1
                   + one-vs-rest AUC (FedBM / FedCB's public main.py; for single-label data micro
                   recall = accuracy; the first such round, as its strict '>')
    max-test-acc   the round with the highest test accuracy, every metric at that round (FACMIC's
                   "highest" test accuracy; it does not say at which round its BACC is taken)
    max-test-bacc  the round with the highest (mean per-client) test balanced accuracy, every metric
                   at that round (FedNPR's notebooks)
    final          the last evaluated round
    unknown        (papers only) not stated.
    any            (papers only) nothing trains (zero-shot CLIP): every round gives the same number.

model (papers only, optional): the methods of ours that train the paper's model for that row, e.g.
``["central"]`` for FedBM's Central Learning; an empty list when we have none (FACMIC's Centralized
fine-tunes the whole CLIP on pooled data).

setup (the whole training setup; a paper's is ``protocol.setup`` with ``setup_source`` quoting where it is
stated; values may be given per dataset):
    clients       the number of clients (1 for a centralised model)
    rounds        communication rounds
    local_epochs  local epochs per round
    sample_ratio  the share of clients sampled per round
    epochs        (centralised models) epochs on the pooled data: our rounds x local epochs
    partition     the partition scheme and its parameter, as the papers' column key (``dirichlet-0.1``,
                  ``lda-0.05``, ``shards-2``, ``iid``, ``natural``, ``dirichlet-classwise``): the cell's
                  column for the paper, the run's own partition for ours
Only the values a paper's setup records are compared (a zero-shot model records none: nothing trains).

A row is never comparable when its runs were changed on the command line (``fedbench table --set``:
another budget than the config's) or when it is a stand-in (it runs another dataset than the paper's
it is set beside, or its table config says ``stand_in``): its paper column says why.

A paper's protocol is per table in results/paper/<paper>.json (``protocol``), with per-method
exceptions (``method_protocols``); ``bench.reporting.paper_numbers`` attaches the merged one to each cell.
Each facet of a paper's protocol says where it comes from (``sources``: stated in the paper, read from its
code, or ours; bench/reporting/paper_sources.py); a cell with a facet that is not stated is printed †.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bench.core.errors import FedbenchError
from bench.engine.val_scores import VAL_SCORES, metric_sum

if TYPE_CHECKING:
    from bench.tables.table_row import TableRow
    from bench.tables.table_spec import TableSpec

EVALS = {
    "global": "the global model on the global test set",
    "per_client": "each client's model on its own test split (mean over clients)",
    "local_mean": "each client's model on the global test set (mean over clients)",
}
ROUND_RULES = {
    "best-val-acc": "test metrics at the round with the best validation accuracy",
    "best-val-sum5": ("test metrics at the round with the best val accuracy + micro recall + macro precision "
                      "+ macro F1 + AUC (FedBM's main.py)"),
    "max-test-acc": "test metrics at the round with the highest test accuracy",
    "max-test-bacc": "test metrics at the round with the highest (mean per-client) test balanced accuracy",
    "final": "test metrics at the final round",
}
NEEDS_VAL = ("best-val-acc", "best-val-sum5")
UNKNOWN = "unknown"
ANY = "any"  # (papers only) a model that does not train, e.g. zero-shot CLIP: every round is the same


_SCORES: dict[str, Callable[[dict[str, float]], float]] = {
    **VAL_SCORES,  # best-val-acc, best-val-sum5 (bench/engine/metrics.py: the orchestrator uses them too)
    "max-test-acc": lambda m: metric_sum(m, ("test/accuracy",)),
    "max-test-bacc": lambda m: metric_sum(m, ("test/balanced_accuracy",)),
}


def select_round(history: list[dict], rule: str) -> dict | None:
    """The history entry whose test metrics ``rule`` reports (None when no round was evaluated).

    Ties go to the earliest round. ``best-val-acc`` on a history without validation metrics falls
    back to the final round, as the record's own ``best`` does (bench/assembly/records.summarise).
    """
    if rule not in ROUND_RULES:
        raise FedbenchError(f"Unknown round rule {rule!r}; choose one of {', '.join(ROUND_RULES)}.")
    evaluated = [h for h in history if h.get("metrics")]
    if not evaluated:
        return None
    if rule == "final" or (rule == "best-val-acc" and not any("val/accuracy" in h["metrics"] for h in evaluated)):
        return evaluated[-1]
    score = _SCORES[rule]
    best = max(evaluated, key=lambda h: (score(h["metrics"]), -h["round"]))
    return best if math.isfinite(score(best["metrics"])) else None


def metric_at(record: dict, metric: str, rule: str) -> float | None:
    """Test ``metric`` of a run record under round ``rule``, from its per-round history."""
    entry = select_round(record.get("history") or [], rule)
    if entry is None:
        return None
    value = entry["metrics"].get(f"test/{metric}")
    return value if value is not None and math.isfinite(value) else None


SETUP_NAMES = {  # setup facet -> how a difference names it ("rounds 20 vs 200")
    "clients": "clients", "rounds": "rounds", "local_epochs": "local epochs", "sample_ratio": "client sampling",
    "epochs": "epochs", "partition": "partition",
}
SETUP_ORDER = tuple(SETUP_NAMES)
# facets that make a row never comparable, whatever the paper recorded
NOT_COMPARABLE = ("overridden", "stand-in")


class Facet(tuple):
    """One difference between a row and a paper's cell: ``(facet, explanation)`` as a pair, e.g.
    ``("setup", "rounds 20 vs 200")``, with ``kind`` the name it is counted under (``setup: rounds``;
    the facet itself for the others)."""

    kind: str

    def __new__(cls, facet: str, text: str, kind: str | None = None):
        obj = super().__new__(cls, (facet, text))
        obj.kind = kind or facet
        return obj

    @property
    def facet(self) -> str:
        return self[0]

    @property
    def text(self) -> str:
        return self[1]


@dataclass(frozen=True)
class RowProtocol:
    """How a table row is measured: derived from its run config and the table config."""

    eval: str
    round: str
    method: str  # the method that trains it (for the paper's ``model`` facet)
    # the setup its run trains in (SETUP_NAMES: clients, rounds, local_epochs, sample_ratio; clients and
    # epochs for a centralised model); empty when not derived from a run config
    setup: dict[str, Any] = field(default_factory=dict, compare=False)
    partition: str | None = None  # its run's partition as the papers' key; None: partition-independent
    overridden: str | None = None  # the command-line overrides of its runs ("--set fed.rounds=2")
    stand_in: str | None = None  # why it stands in for the paper's data, when it does

    def describe(self) -> str:
        return f"{EVALS[self.eval]}, {ROUND_RULES[self.round]}"


def default_round_rule(eval_protocol: str, table_rule: str | None) -> str:
    """A row's round rule when it sets none: the table's ``round_rule`` when the row's protocol has
    what it needs (per-client rows have no validation metrics); otherwise best-val-acc for
    global-model rows and the final round for per-client and client-mean rows."""
    if table_rule and not (table_rule in NEEDS_VAL and eval_protocol == "per_client"):
        return table_rule
    return "best-val-acc" if eval_protocol == "global" else "final"


def partition_key(cfg) -> str:
    """A run's partition as the papers' partition key: its column's (bench/tables/columns.py)."""
    from bench.tables.columns import paper_partition, run_column

    return paper_partition(run_column(cfg.partition, getattr(cfg.data, "client_split_file", None)))


def run_setup(cfg, centrally: bool) -> dict[str, Any]:
    """The setup facets of a run config: clients, rounds, local epochs and client sampling; a
    centralised run is one client trained for rounds x local_epochs epochs (bench/assembly/central.py)."""
    if centrally:
        return {"clients": 1, "epochs": cfg.fed.rounds * cfg.fed.local_epochs}
    return {"clients": cfg.partition.num_clients, "rounds": cfg.fed.rounds, "local_epochs": cfg.fed.local_epochs,
            "sample_ratio": cfg.fed.sample_ratio}


def describe_overrides(overrides: dict[str, Any] | None) -> str | None:
    """``--set KEY=VALUE ...`` of a run's command-line overrides; None when it has none."""
    if not overrides:
        return None
    import json

    return " ".join(f"--set {k}={json.dumps(v)}" for k, v in overrides.items())


def row_protocol(cfg, row: TableRow, spec: TableSpec, where: str,
                 overrides: dict[str, Any] | None = None, stand_in: str | None = None) -> RowProtocol:
    """The protocol of a row whose (first) run has config ``cfg``; ``overrides``: the command-line
    changes of its runs (bench/tables/table_overrides.py); ``stand_in``: why it is a stand-in."""
    from bench.tables.catalog import method_traits  # the method is not imported: no torch for coverage

    protocol, runs_centrally = method_traits(cfg.method.name)
    eval_protocol = cfg.scored_protocol(protocol, runs_centrally)
    rule = row.round_rule or default_round_rule(eval_protocol, spec.round_rule)
    if rule not in ROUND_RULES:
        raise FedbenchError(f"{where}: unknown round_rule {rule!r}; choose one of {', '.join(ROUND_RULES)}.")
    if rule in NEEDS_VAL and eval_protocol == "per_client":
        raise FedbenchError(f"{where}: round_rule {rule!r} needs validation metrics, which the per-client "
                            "protocol has none of; use final or max-test-bacc.")
    stand_in = stand_in or spec.stand_in
    partition = None if row.partition_independent else partition_key(cfg)
    return RowProtocol(eval_protocol, rule, cfg.method.name, run_setup(cfg, runs_centrally), partition,
                       describe_overrides(overrides), stand_in)


def _value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def setup_facets(ours: RowProtocol, paper_setup: dict[str, Any]) -> list[Facet]:
    """Each setup value ``paper_setup`` records that ``ours`` does not share: ("setup", "rounds 20 vs 200")
    (ours first). The partition is compared only where both have one (not for partition-independent rows,
    nor the papers' ``none`` / ``average`` columns); "n/a" where our row has no such value (a centralised
    row has no rounds)."""
    out = []
    for key in SETUP_ORDER:
        if key not in paper_setup:
            continue
        want = paper_setup[key]
        if key == "partition":
            if ours.partition is None or want in ("none", "average") or ours.partition == want:
                continue
            out.append(Facet("setup", f"partition {ours.partition} vs {want}", "setup: partition"))
            continue
        have = ours.setup.get(key)
        if have is None or not math.isclose(float(have), float(want)):
            out.append(Facet("setup", f"{SETUP_NAMES[key]} {'n/a' if have is None else _value(have)} vs {_value(want)}",
                             f"setup: {key}"))
    return out


def protocol_facets(ours: RowProtocol, paper: dict[str, Any]) -> list[Facet]:
    """What differs between ``ours`` and ``paper`` (a cell's protocol), as (facet, explanation) pairs;
    empty when the row measures what the paper did, in the paper's setup. An overridden or stand-in row
    is never comparable: a last facet says why (after whatever else differs, e.g. the rounds an override
    changed)."""
    never = []
    if ours.overridden:
        never.append(Facet("overridden", f"its runs were changed on the command line ({ours.overridden})"))
    if ours.stand_in:
        never.append(Facet("stand-in", f"a stand-in ({ours.stand_in})"))
    if not paper:
        return [Facet("not recorded", "the paper's protocol is not recorded in results/paper"), *never]
    return _measured_facets(ours, paper) + setup_facets(ours, paper.get("setup") or {}) + never


def _measured_facets(ours: RowProtocol, paper: dict[str, Any]) -> list[Facet]:
    """The differences in what is evaluated, at which round, of which model."""
    why = []
    note = f" ({paper['note']})" if paper.get("note") else ""
    p_eval = paper.get("eval", UNKNOWN)
    if p_eval == UNKNOWN:
        why.append(Facet("evaluation not stated", f"the paper does not state what it evaluates{note}"))
    elif p_eval != ours.eval:
        why.append(Facet("evaluation", f"evaluation (ours: {ours.eval}, paper: {p_eval})"))
    p_round = paper.get("round", UNKNOWN)
    if p_round == UNKNOWN:
        why.append(Facet("round not stated", "the paper does not state its reporting round"))
    elif p_round not in (ANY, ours.round):
        why.append(Facet("round", f"round (ours: {ours.round}, paper: {p_round})"))
    if "model" in paper and ours.method not in paper["model"]:
        what = paper.get("model_note") or ", ".join(paper["model"]) or "another model"
        why.append(Facet("model", f"model (ours: {ours.method}, paper: {what})"))
    return why


def describe_facets(facets: list[Facet], short: bool = False) -> str | None:
    """What the facets say, grouped: "protocol differs: <what>; setup differs: rounds 20 vs 200" or
    "not comparable: <why>"; ``short`` names the measurement facets without their detail (the rendered
    paper column: "protocol differs: evaluation, round"). None when there is no difference."""
    parts = []
    measured = [f for f in facets if f.facet not in NOT_COMPARABLE and f.facet != "setup"]
    if measured:
        parts.append("protocol differs: " + (", ".join(f.facet for f in measured) if short
                                             else "; ".join(f.text for f in measured)))
    setup = [f for f in facets if f.facet == "setup"]
    if setup:
        parts.append("setup differs: " + ", ".join(f.text for f in setup))
    never = [f for f in facets if f.facet in NOT_COMPARABLE]
    if never:
        parts.append("not comparable: " + "; ".join(f.text for f in never))
    return "; ".join(parts) or None


def difference_text(facets: list[Facet]) -> str | None:
    """The facets' explanations in one line: the measurement facets' ("evaluation (ours: ..., paper:
    ...); round (...)"), then "setup differs: rounds 20 vs 200, ...", then "not comparable: <why>" for
    an overridden or stand-in row. None when there is no difference."""
    measured = "; ".join(f.text for f in facets if f.facet != "setup" and f.facet not in NOT_COMPARABLE)
    rest = describe_facets([f for f in facets if f.facet == "setup" or f.facet in NOT_COMPARABLE])
    return "; ".join(p for p in (measured, rest) if p) or None


def protocol_difference(ours: RowProtocol, paper: dict[str, Any]) -> str | None:
    """None when ``ours`` measures what ``paper`` (a cell's protocol) did, in its setup; else what
    differs (difference_text)."""
    return difference_text(protocol_facets(ours, paper))
