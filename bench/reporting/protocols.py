"""Evaluation protocols: what is evaluated (``eval``), at which round (``round``), of which model.

A published number is comparable with ours only when both were measured the same way. Three facets:

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

A paper's protocol is per table in results/paper/<paper>.json (``protocol``), with per-method
exceptions (``method_protocols``); ``bench.reporting.paper_numbers`` attaches the merged one to each cell.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.core.errors import FedbenchError
from bench.metrics import VAL_SCORES, metric_sum

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
    **VAL_SCORES,  # best-val-acc, best-val-sum5 (bench/metrics.py: the orchestrator uses them too)
    "max-test-acc": lambda m: metric_sum(m, ("test/accuracy",)),
    "max-test-bacc": lambda m: metric_sum(m, ("test/balanced_accuracy",)),
}


def select_round(history: list[dict], rule: str) -> dict | None:
    """The history entry whose test metrics ``rule`` reports (None when no round was evaluated).

    Ties go to the earliest round. ``best-val-acc`` on a history without validation metrics falls
    back to the final round, as the record's own ``best`` does (bench/records.summarise).
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


@dataclass(frozen=True)
class RowProtocol:
    """How a table row is measured: derived from its run config and the table config."""

    eval: str
    round: str
    method: str  # the method that trains it (for the paper's ``model`` facet)

    def describe(self) -> str:
        return f"{EVALS[self.eval]}, {ROUND_RULES[self.round]}"


def default_round_rule(eval_protocol: str, table_rule: str | None) -> str:
    """A row's round rule when it sets none: the table's ``round_rule`` when the row's protocol has
    what it needs (per-client rows have no validation metrics); otherwise best-val-acc for
    global-model rows and the final round for per-client and client-mean rows."""
    if table_rule and not (table_rule in NEEDS_VAL and eval_protocol == "per_client"):
        return table_rule
    return "best-val-acc" if eval_protocol == "global" else "final"


def row_protocol(cfg, row: dict[str, Any], spec: dict[str, Any], where: str) -> RowProtocol:
    """The protocol of a row whose (first) run has config ``cfg``."""
    from lightning_modules.base import METHODS

    cls = METHODS.get(cfg.method.name)
    if cls.runs_centrally:
        eval_protocol = "global"
    else:
        eval_protocol = getattr(cfg.fed, "protocol", None) or cls.protocol
    rule = row.get("round_rule") or default_round_rule(eval_protocol, spec.get("round_rule"))
    if rule not in ROUND_RULES:
        raise FedbenchError(f"{where}: unknown round_rule {rule!r}; choose one of {', '.join(ROUND_RULES)}.")
    if rule in NEEDS_VAL and eval_protocol == "per_client":
        raise FedbenchError(f"{where}: round_rule {rule!r} needs validation metrics, which the per-client "
                            "protocol has none of; use final or max-test-bacc.")
    return RowProtocol(eval_protocol, rule, cfg.method.name)


def protocol_facets(ours: RowProtocol, paper: dict[str, Any]) -> list[tuple[str, str]]:
    """What differs between ``ours`` and ``paper`` (a cell's protocol), as (facet, explanation) pairs;
    empty when the row measures what the paper did."""
    if not paper:
        return [("not recorded", "the paper's protocol is not recorded in results/paper")]
    why = []
    note = f" ({paper['note']})" if paper.get("note") else ""
    p_eval = paper.get("eval", UNKNOWN)
    if p_eval == UNKNOWN:
        why.append(("evaluation not stated", f"the paper does not state what it evaluates{note}"))
    elif p_eval != ours.eval:
        why.append(("evaluation", f"evaluation (ours: {ours.eval}, paper: {p_eval})"))
    p_round = paper.get("round", UNKNOWN)
    if p_round == UNKNOWN:
        why.append(("round not stated", "the paper does not state its reporting round"))
    elif p_round not in (ANY, ours.round):
        why.append(("round", f"round (ours: {ours.round}, paper: {p_round})"))
    if "model" in paper and ours.method not in paper["model"]:
        what = paper.get("model_note") or ", ".join(paper["model"]) or "another model"
        why.append(("model", f"model (ours: {ours.method}, paper: {what})"))
    return why


def protocol_difference(ours: RowProtocol, paper: dict[str, Any]) -> str | None:
    """None when ``ours`` measures what ``paper`` (a cell's protocol) did; else what differs."""
    return "; ".join(text for _, text in protocol_facets(ours, paper)) or None
