"""``iid``: shuffle, then split into ``num_clients`` near-equal parts."""
from __future__ import annotations

import numpy as np

from datamodules.partitions import PARTITION_SCHEMES, SchemeInput, SchemeOutput


@PARTITION_SCHEMES.register("iid")
def iid(s: SchemeInput) -> SchemeOutput:
    return SchemeOutput([np.sort(part) for part in np.array_split(s.rng.permutation(len(s.labels)), s.num_clients)])
