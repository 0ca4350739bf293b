"""``natural``: one client per distinct value of ``groups`` (a site / centre id), in sorted order."""
from __future__ import annotations

import numpy as np

from bench.core.errors import PartitionError
from datamodules.partitions import PARTITION_SCHEMES, SchemeInput, SchemeOutput


@PARTITION_SCHEMES.register("natural")
def natural(s: SchemeInput) -> SchemeOutput:
    if s.groups is None:
        raise PartitionError(
            "The natural partition needs a site id per sample (groups), but this dataset has none. "
            "Use a dataset with sites (e.g. Fed-ISIC2019) or another scheme (iid, dirichlet, shards)."
        )
    groups = np.asarray(s.groups)
    if groups.shape != s.labels.shape:
        raise PartitionError(
            f"groups has shape {groups.shape}, labels {s.labels.shape}: one group per sample needed."
        )
    sites = np.unique(groups)
    if len(sites) != s.num_clients:
        raise PartitionError(
            f"The natural partition has one client per site: the data has {len(sites)} sites, but "
            f"num_clients is {s.num_clients}. Set --partition.num_clients {len(sites)}."
        )
    return SchemeOutput([np.flatnonzero(groups == site) for site in sites])
