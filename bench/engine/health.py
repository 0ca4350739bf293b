"""Is a run healthy? Finite client models after local training, and a global model that predicts
more than one class: what a finite loss alone does not show (Adam at a huge lr keeps a finite loss
while its BatchNorm statistics overflow, or collapses to one class)."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from bench.core.errors import FedbenchError


class NonFiniteStateError(FedbenchError):
    pass


def check_finite_state(state: dict[str, torch.Tensor], where: str, hint: str) -> None:
    """Raise if a floating tensor of ``state`` holds NaN/inf: one device sync for the whole state."""
    floats = [(k, t) for k, t in state.items() if t.is_floating_point()]
    if not floats:
        return
    flags = torch.stack([torch.isfinite(t).all() for _, t in floats])
    if bool(flags.all()):
        return
    bad = [k for (k, _), ok in zip(floats, flags.tolist()) if not ok]
    shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
    raise NonFiniteStateError(f"The model became NaN/inf {where} ({shown}) although the loss stayed finite. {hint}")


def nonfinite_hint(precision: str, lr: float, optimizer: str) -> str:
    """What to do about a model that became NaN/inf with a finite loss. Under bf16-mixed: the cause measured
    for the NaN issue 42 reported (oneDNN's bf16 weight gradient of a padded convolution whose stride exceeds
    its input, on AVX-512 CPUs) is refused before the rounds (bench/core/cpu_bf16.py), so what is left is
    bf16's rounding, which a BatchNorm on a batch of (near) zero variance amplifies by up to 1/sqrt(eps)
    (shown in a two-layer stand-in with oneDNN's AVX2 kernels, 2026-11-27); float32 suffers neither."""
    if precision == "bf16-mixed":
        return ("Under --precision bf16-mixed a possible cause is bf16 rounding amplified by a BatchNorm that sees "
                "a batch of (near) zero variance, e.g. identical images at a 1x1 feature map: its backward scales "
                "the rounding errors by up to 1/sqrt(eps) = 316, which float32 does not suffer. "
                "Use --precision 32-true (or larger, varied images).")
    return f"Lower method.lr (now {lr:g}, {optimizer})."


COLLAPSE_MARK = "predicts a single class for every test image"  # in every collapse note and warning


def method_trains(name: str) -> bool:
    """Whether method ``name`` trains anything: False for a class with ``trains = False`` (zero-shot CLIP,
    whose constant prediction is its zero-shot answer, not a collapse)."""
    from lightning_modules.base import METHODS

    return METHODS.get(name).trains


def single_class(entry: dict) -> bool:
    return (entry.get("metrics") or {}).get("test/predicted_classes") == 1


def collapse_at(record: dict, entry: dict | None) -> int | None:
    """The round a trained global-model run collapsed at, seen from history ``entry`` (the round a table
    prints): the first round of the unbroken stretch of single-class rounds that ends at ``entry``; None
    when the model predicts more than one class there, does not train, or is not a global-model run."""
    if entry is None or not single_class(entry) or record.get("protocol") != "global" \
            or record.get("num_classes", 0) < 2 or not method_trains(record["method"]):
        return None
    evaluated = [h for h in record.get("history") or [] if (h.get("metrics") or {}).get("test/predicted_classes")]
    start = entry["round"]
    for h in reversed([h for h in evaluated if h["round"] <= entry["round"]]):
        if not single_class(h):
            break
        start = h["round"]
    return start


def collapse_note(record: dict, entry: dict | None) -> str | None:
    """The health note of a collapsed run at the printed round ``entry`` (None when it has not collapsed)."""
    start = collapse_at(record, entry)
    if start is None:
        return None
    first = min(h["round"] for h in record["history"] if (h.get("metrics") or {}).get("test/predicted_classes"))
    since = ("" if start == entry["round"] else " (one class at every evaluated round since"
             + (", the first: it never predicted more than one)" if start == first else ")"))
    return (f"the global model {COLLAPSE_MARK} at round {entry['round']}, the round printed: collapsed at round "
            f"{start}{since}; its metrics are chance level (lr too high, training diverged, or a constant start "
            "it never left).")


def collapse_warnings(record: dict, trains: bool = True) -> list[str]:
    """Warnings for a trained global-protocol record whose model predicts one class on the test set at
    the best-validation round or at the final round (stored in the record; a table recomputes them at
    the round it prints, collapse_note). ``trains`` False (zero-shot CLIP): none."""
    if record.get("protocol") != "global" or not trains:
        return []
    out = []
    for which in ("best", "final"):
        if (record.get(which) or {}).get("test/predicted_classes") == 1 and record.get("num_classes", 0) > 1:
            rnd = record.get("best_round") if which == "best" else record["history"][-1]["round"]
            out.append(f"the global model {COLLAPSE_MARK} at the {which} round "
                       f"({rnd}): training collapsed (lr too high or diverged); its metrics are chance level.")
            break
    return out


def idle_option_warnings(rounds: int, lr_milestones: Sequence[int], module) -> list[str]:
    """Options that never act in a run of ``rounds`` rounds: the method's own (``idle_options``: FedBM's
    generator with gen_start >= rounds) and lr milestones at or after the last round. Printed when the run
    starts and stored in the record's warnings (tables show them beside the row's cell)."""
    out = list(module.idle_options(rounds))
    late = [m for m in lr_milestones if m >= rounds]
    if late:
        out.append(f"fed.lr_milestones {late} lie at or after the last round (fed.rounds={rounds}): they never "
                   "change the lr. Drop them or run more rounds.")
    return out
