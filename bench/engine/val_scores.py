"""The validation criteria that pick a reported round, without torch: the orchestrator (bench/engine/federation.py,
through bench/engine/metrics.py) and the table's round rules (bench/tables/protocols.py, read by `fedbench coverage`,
which imports no torch) use the same ones."""
from __future__ import annotations

import math
from collections.abc import Callable


def metric_sum(metrics: dict[str, float], keys: tuple[str, ...]) -> float:
    """The sum of ``metrics[k]`` over ``keys`` (a key may repeat); -inf when one is missing or not finite."""
    vals = [metrics.get(k) for k in keys]
    if any(v is None or not math.isfinite(v) for v in vals):
        return -math.inf
    return float(sum(vals))


# the validation criteria that pick a reported round (bench/tables/protocols.py's round rules)
VAL_SCORES: dict[str, Callable[[dict[str, float]], float]] = {
    "best-val-acc": lambda m: metric_sum(m, ("val/accuracy",)),
    # acc + micro recall (= acc) + macro precision + macro F1 + AUC
    "best-val-sum5": lambda m: metric_sum(m, ("val/accuracy", "val/accuracy", "val/precision", "val/f1", "val/auc")),
}
