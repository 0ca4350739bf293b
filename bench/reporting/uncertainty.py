"""What in a table is real: the paired difference of a row to the baseline row (FedAvg) over seeds, the
test-set standard error of one run's accuracy, and which rows tie for best.

Every row of a table runs on the same partition for a given seed, so the difference row - baseline of
one seed removes what the partition (and the initial model, the sampled clients) adds to both. Over the
n seeds both rows have, the differences d_1..d_n give the paired t-test: mean d, its standard error
s_d / sqrt(n), t = mean / se with n - 1 degrees of freedom, the two-sided p-value and the 95% interval
mean +- t_{0.975, n-1} se. p < 0.05 exactly when that interval excludes 0.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from scipy import stats

ALPHA = 0.05  # a paired difference is marked significant when p < ALPHA (its 95% interval excludes 0)


@dataclass(frozen=True)
class PairedDifference:
    """row - baseline over the seeds both have."""

    seeds: tuple[int, ...]
    diffs: tuple[float, ...]
    mean: float
    ci_low: float | None  # None with one seed (no spread to estimate)
    ci_high: float | None
    p_value: float | None

    @property
    def significant(self) -> bool:
        return self.p_value is not None and self.p_value < ALPHA

    def to_json(self) -> dict:
        return {"seeds": list(self.seeds), "diffs": list(self.diffs), "mean": self.mean,
                "ci95": None if self.ci_low is None else [self.ci_low, self.ci_high], "p_value": self.p_value,
                "significant": self.significant}


def paired_difference(values: list[float], seeds: list[int], base_values: list[float],
                      base_seeds: list[int]) -> PairedDifference | None:
    """The paired difference of a row (``values`` at ``seeds``) to the baseline; None when no seed is shared.

    With identical differences (zero spread) the interval is the point and p is 0 when the mean is not 0,
    1 when it is (a t statistic of +-inf or 0/0)."""
    base = dict(zip(base_seeds, base_values, strict=True))
    common = [s for s in seeds if s in base]
    if not common:
        return None
    mine = dict(zip(seeds, values, strict=True))
    diffs = tuple(mine[s] - base[s] for s in common)
    n, mean = len(diffs), statistics.fmean(diffs)
    if n < 2:
        return PairedDifference(tuple(common), diffs, mean, None, None, None)
    se = statistics.stdev(diffs) / math.sqrt(n)
    if se == 0.0:
        return PairedDifference(tuple(common), diffs, mean, mean, mean, 1.0 if mean == 0 else 0.0)
    half = float(stats.t.ppf(1 - ALPHA / 2, n - 1)) * se
    p = float(2 * stats.t.sf(abs(mean / se), n - 1))
    return PairedDifference(tuple(common), diffs, mean, mean - half, mean + half, p)


def binomial_se(accuracy_percent: float, n: int) -> float | None:
    """The standard error (percentage points) of an accuracy measured on n independent test images:
    100 sqrt(p (1 - p) / n). It is the share of one run's spread that comes from the finite test set."""
    if n <= 0 or accuracy_percent is None or not math.isfinite(accuracy_percent):
        return None
    p = min(max(accuracy_percent / 100.0, 0.0), 1.0)
    return 100.0 * math.sqrt(p * (1 - p) / n)


def best_with_ties(cells: dict[str, tuple[float | None, float | None]]) -> set[str]:
    """The rows shown in bold in one column: the highest mean, and every row whose mean +- std interval
    overlaps the best row's (mean + std >= best mean - best std): with the seed-to-seed spread they
    cannot be told apart from it. ``cells``: row -> (mean, std); rows without a mean never win."""
    shown = {k: (m, s or 0.0) for k, (m, s) in cells.items() if m is not None and math.isfinite(m)}
    if not shown:
        return set()
    best, best_std = max(shown.values(), key=lambda ms: ms[0])
    return {k for k, (m, s) in shown.items() if m + s >= best - best_std}
