"""Partition schemes, one file each, registered by name in :data:`PARTITION_SCHEMES`.

:func:`datamodules.partition.partition` checks the labels and the client count, draws the generator
``np.random.default_rng(seed)`` and hands both, with the options, to the scheme registered under the
requested name as a :class:`SchemeInput`. The scheme returns the clients' sample indices as a
:class:`SchemeOutput`: each client's indices sorted, every sample exactly once, every random draw taken
from ``s.rng`` (so the partition is a pure function of labels, scheme, seed and options), plus the shares
it used and the options worth recording. Errors are :class:`~bench.core.errors.PartitionError` with a
fix-it message.

A new scheme is one file in this folder (every module here not starting with ``_`` is imported on the
first lookup)::

    import numpy as np

    from datamodules.partitions import PARTITION_SCHEMES, SchemeInput, SchemeOutput


    @PARTITION_SCHEMES.register("round-robin")
    def round_robin(s: SchemeInput) -> SchemeOutput:
        order = s.rng.permutation(len(s.labels))
        return SchemeOutput([np.sort(order[k::s.num_clients]) for k in range(s.num_clients)])

The built-in schemes: ``iid`` (iid.py), ``dirichlet`` and ``dirichlet_missing`` (dirichlet.py),
``shards`` (shards.py), ``lda`` (lda.py), ``proportions`` (proportions.py), ``natural`` (natural.py).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.core.registry import Registry


@dataclass(frozen=True)
class SchemeInput:
    """What a scheme draws from: checked int64 labels, the client and class counts, the run's generator
    and every option of :func:`~datamodules.partition.partition` (a scheme reads the ones it needs)."""

    labels: np.ndarray
    num_clients: int
    num_classes: int
    rng: np.random.Generator
    beta: float | Sequence[float] = 0.5
    shards_per_client: int = 2
    min_size: int = 10
    groups: np.ndarray | None = None
    missing_prob: float = 0.5
    max_tries: int = 1000
    shard_mode: str = "sorted"
    client_proportions: Sequence[float] | None = None


@dataclass
class SchemeOutput:
    """The clients' sample indices (each sorted), the shares used ([num_classes, num_clients], or None)
    and the options to record next to the seed (in the run record's ``partition``)."""

    clients: list[np.ndarray]
    proportions: np.ndarray | None = None
    options: dict[str, Any] = field(default_factory=dict)


Scheme = Callable[[SchemeInput], SchemeOutput]
PARTITION_SCHEMES: Registry[Scheme] = Registry("partition scheme", __name__)
