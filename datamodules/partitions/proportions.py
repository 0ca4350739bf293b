"""``proportions``: quantity skew, every class cut by the same client proportions ``client_proportions``.

FACMIC's committed ``datasplit.py`` applies one hard-coded vector per alpha to every class instead of the
per-class Dirichlet draw its paper describes.
"""
from __future__ import annotations

import numpy as np

from bench.core.errors import PartitionError
from datamodules.partitions import PARTITION_SCHEMES, SchemeInput, SchemeOutput
from datamodules.partitions._common import split_by_proportions


@PARTITION_SCHEMES.register("proportions")
def proportions(s: SchemeInput) -> SchemeOutput:
    p = np.asarray(s.client_proportions if s.client_proportions is not None else [], dtype=np.float64)
    if p.shape != (s.num_clients,) or not np.all(np.isfinite(p)) or np.any(p < 0) or not p.sum() > 0:
        raise PartitionError(
            f"The proportions partition needs partition.proportions: {s.num_clients} non-negative numbers (one per "
            f"client, normalised to sum 1), got {s.client_proportions!r}.")
    props = np.tile(p / p.sum(), (s.num_classes, 1))
    class_idx = [s.rng.permutation(np.flatnonzero(s.labels == c)) for c in range(s.num_classes)]
    return SchemeOutput(split_by_proportions(class_idx, props), props, {"proportions": props[0].tolist()})
