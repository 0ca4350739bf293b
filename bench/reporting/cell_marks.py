"""What keeps a table, above all an offline stand-in, from reading like a finding it is not (issue 28.4).

Per cell (bench/reporting/tables.py prints them beside the number):
    at chance      an accuracy-like metric (CHANCE_METRICS) of a row scored on the global test set
                   (global-model and client-mean rows; a per-client row's own test split may lack classes,
                   so its chance level is not 100/K) whose interval mean ± (std + 1.96·SE₀) reaches
                   chance, 100/K for K classes; SE₀ = 100·sqrt(c(1 − c)/n) is the standard error of a
                   chance-level accuracy c on the n test images. "below chance" when the whole interval
                   lies below it.
    collapsed      a run whose trained global model predicts one class for every test image at the round
                   the table prints, with the round it collapsed at (bench/engine/health.py); a method that does
                   not train (zero-shot CLIP) never is.
    one seed       no spread to show: no ±.
None of these cells is ever bold: their number says nothing about which method is best.
"""
from __future__ import annotations

import math

from bench.engine.health import COLLAPSE_MARK, collapse_at, collapse_note
from bench.reporting.uncertainty import binomial_se
from bench.tables.protocols import RowProtocol, select_round

CHANCE_METRICS = ("accuracy", "balanced_accuracy")  # chance 100/K; F1, precision and AUC are not marked
ON_GLOBAL_TEST = ("global", "local_mean")  # the evaluations scored on the global test set (all K classes)
Z95 = 1.96


def run_health(rec: dict, rule: str) -> tuple[list[str], int | None]:
    """(the run's health notes, the round it collapsed at or None), at the round ``rule`` prints: the
    record's own collapse warning (written at its best and final rounds) is replaced by one at that round."""
    entry = select_round(rec.get("history") or [], rule)
    notes = [w for w in rec.get("warnings", []) if COLLAPSE_MARK not in w]
    note = collapse_note(rec, entry)
    return notes + ([note] if note else []), collapse_at(rec, entry)


def table_classes(records: list[dict]) -> int | None:
    """K, the table's number of classes (None unless its records agree on one)."""
    ks = {r.get("num_classes") or len(r.get("class_names") or []) for r in records}
    return ks.pop() if len(ks) == 1 and min(ks) >= 2 else None


def table_test_size(records: list[dict]) -> int | None:
    """n, the table's number of test images (None unless its records agree on one)."""
    sizes = {(r.get("splits") or {}).get("test") for r in records}
    return sizes.pop() if len(sizes) == 1 else None


def chance_interval(cell: dict, chance: float, n_test: int | None) -> tuple[float, float]:
    """mean ± (std + 1.96·SE₀): the seed-to-seed spread plus the test-set sampling of a chance-level model
    (SE₀ = 0 when ``n_test`` is None: not a global-model row, or an unknown test size)."""
    se0 = (binomial_se(chance, int(n_test)) or 0.0) if n_test else 0.0
    half = (cell["std"] or 0.0) + Z95 * se0
    return cell["mean"] - half, cell["mean"] + half


def chance_mark(cell: dict, metric: str, k: int | None, n_test: int | None) -> str | None:
    """"at chance" / "below chance" for an accuracy-like cell whose interval reaches / lies below 100/K."""
    if k is None or metric not in CHANCE_METRICS or cell["mean"] is None or not math.isfinite(cell["mean"]):
        return None
    chance = 100.0 / k
    low, high = chance_interval(cell, chance, n_test)
    if high < chance:
        return "below chance"
    return "at chance" if low <= chance else None


def collapse_mark(cell: dict) -> str | None:
    """"collapsed at round 3" (every collapsed seed's round; "(1/3 seeds)" when not all of them)."""
    collapsed = cell.get("collapsed") or []
    if not collapsed:
        return None
    rounds = sorted({r for _, r in collapsed})
    text = f"collapsed at round{'s' if len(rounds) > 1 else ''} {', '.join(str(r) for r in rounds)}"
    n = len(cell["values"])
    return text + (f" in {len(collapsed)}/{n} seeds" if len(collapsed) < n else "")


def mark_cells(cells: dict, protocols: dict[str, RowProtocol], records: list[dict]) -> None:
    """Per cell: ``chance`` (100/K or None), ``marks`` (what fmt prints beside it) and ``bold_ok``
    (False for a cell at or below chance, with a collapsed seed or with a single seed)."""
    k, n_test = table_classes(records), table_test_size(records)
    for (label, _, metric), cell in cells.items():
        on_global = protocols[label].eval in ON_GLOBAL_TEST
        cell["chance"] = 100.0 / k if k is not None and metric in CHANCE_METRICS and on_global else None
        marks = [chance_mark(cell, metric, k, cell.get("n_test") or n_test) if on_global else None,
                 collapse_mark(cell)]
        cell["marks"] = [m for m in marks if m]
        cell["bold_ok"] = not cell["marks"] and len(cell["values"]) >= 2


def balanced_test_note(records: list[dict]) -> str | None:
    """The legend's note when the global test set is class-balanced, so that Acc equals balanced Acc:
    from the records' per-class test counts, or (records written before they kept them) from Acc ==
    bAcc at every evaluated round of every global-model run. ``records``: those of the rows scored on
    the global test set (none: no note)."""
    if not records:
        return None
    counts = [r.get("test_class_counts") for r in records]
    if all(counts):
        if any(len(set(c)) != 1 for c in counts) or len({c[0] for c in counts}) != 1:
            return None
        return (f"The global test set is class-balanced ({counts[0][0]} images in each of its {len(counts[0])} "
                "classes), so on it accuracy equals balanced accuracy (Acc = bAcc).")
    pairs = [(m["test/accuracy"], m["test/balanced_accuracy"]) for r in records if r.get("protocol") == "global"
             for m in (h.get("metrics") or {} for h in r.get("history") or [])
             if "test/accuracy" in m and "test/balanced_accuracy" in m]
    if pairs and all(abs(a - b) < 1e-6 for a, b in pairs):
        return ("Acc equals bAcc at every evaluated round of every global-model run, as on a class-balanced test "
                "set (these records predate per-class test counts).")
    return None


def chance_legend(cells: dict) -> list[str]:
    """The legend lines of the marks this table prints."""
    lines = []
    chances = sorted({c["chance"] for c in cells.values() if c.get("chance")})
    if chances:
        lines.append(f"at chance: an Acc or bAcc cell whose interval mean ± (std + 1.96·SE₀) reaches chance, "
                     f"100/K = {', '.join(f'{c:.2f}' for c in chances)}%, where SE₀ = 100·sqrt(c(1 − c)/n) is the "
                     "test-set standard error of a chance-level accuracy c on the n test images; below chance: "
                     "the whole interval lies below it. Neither is ever bold. Only rows scored on the global test "
                     "set are marked (a client's own test split may lack classes: its chance is not 100/K).")
    if any(c.get("collapsed") for c in cells.values()):
        lines.append("collapsed at round r: the trained global model predicts one class for every test image "
                     "at the round printed, as at every evaluated round since round r (its numbers are chance "
                     "level; never bold). A model that does not train (zero-shot CLIP) is never called collapsed.")
    if any(len(c["values"]) == 1 for c in cells.values()):
        lines.append("A cell from one seed has no spread to show: no ±, never bold.")
    return lines
