"""``proportions``: quantity skew, every class cut by the same client shares (``proportions``).

FACMIC's committed ``datasplit.py`` applies one hard-coded vector per alpha to every class instead of the
per-class Dirichlet draw its paper describes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.core.errors import PartitionError
from datamodules.partitions import PARTITION_SCHEMES, SchemeInput, SchemeOutput, takes
from datamodules.partitions._common import split_by_proportions


@dataclass(frozen=True)
class Shares:
    """The options of ``proportions`` (``partition.args``)."""

    proportions: list[float] | None = None  # one share per client (normalised to sum 1): must be given


@PARTITION_SCHEMES.register("proportions")
@takes(Shares)
def proportions(s: SchemeInput) -> SchemeOutput:
    given = s.options.proportions
    p = np.asarray(given if given is not None else [], dtype=np.float64)
    if p.shape != (s.num_clients,) or not np.all(np.isfinite(p)) or np.any(p < 0) or not p.sum() > 0:
        raise PartitionError(
            f"The proportions partition needs partition.args.proportions: {s.num_clients} non-negative numbers (one "
            f"per client, normalised to sum 1), got {given!r}.")
    props = np.tile(p / p.sum(), (s.num_classes, 1))
    class_idx = [s.rng.permutation(np.flatnonzero(s.labels == c)) for c in range(s.num_classes)]
    return SchemeOutput(split_by_proportions(class_idx, props), props, {"proportions": props[0].tolist()})
