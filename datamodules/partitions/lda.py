"""``lda``: FedNTD's "LDA" (FST-CBDG's non-iid setting).

For each class in turn, its shuffled samples are cut (floor of cumsum(p) * n_c) by p ~ Dir(alpha * 1_N)
over the clients, where a client already holding at least (training samples) / N gets a zero share and p
is renormalised; the whole draw repeats until every client has at least ``min_size`` samples (FedNTD: 10).
``alpha`` is ``beta`` (one number).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.core.errors import PartitionError
from datamodules.partitions import PARTITION_SCHEMES, SchemeInput, SchemeOutput, takes
from datamodules.partitions._common import betas, check_min_size


@dataclass(frozen=True)
class Alpha:
    """The options of ``lda`` (``partition.args``)."""

    beta: float = 0.5  # FedNTD's alpha, one number
    min_size: int = 10  # every client holds at least this many samples (FedNTD: 10)


@PARTITION_SCHEMES.register("lda")
@takes(Alpha)
def lda(s: SchemeInput) -> SchemeOutput:
    o = s.options
    alpha = float(betas(o.beta, 1)[0]) if np.ndim(o.beta) == 0 else None
    if alpha is None:
        raise PartitionError(f"lda takes one alpha (partition.args.beta), got {o.beta!r}.")
    check_min_size(o.min_size, s.num_clients, len(s.labels))
    clients, proportions = _draw(s.labels, s.num_clients, s.rng, alpha, o.min_size, max(1, s.max_tries),
                                 s.num_classes)
    return SchemeOutput(clients, proportions, {"beta": alpha, "min_size": int(o.min_size)})


def _draw(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, alpha: float, min_size: int, max_tries: int,
    num_classes: int,
) -> tuple[list[np.ndarray], np.ndarray]:
    """The clients and the shares used [K, N] (see the module docstring)."""
    n = len(labels)
    class_idx = [np.flatnonzero(labels == c) for c in range(num_classes)]
    smallest = 0
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, dtype=np.int64)
        props = np.zeros((num_classes, num_clients))
        for c in range(num_classes):
            idx = rng.permutation(class_idx[c])
            p = rng.dirichlet(np.full(num_clients, alpha)) * (sizes < n / num_clients)
            if not p.sum() > 0:  # every open client drew a zero share (tiny alpha): redraw the partition
                break
            p = p / p.sum()
            cuts = (np.cumsum(p) * len(idx)).astype(np.int64)[:-1]
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
                sizes[k] += len(chunk)
            props[c] = p
        else:
            smallest = int(sizes.min())
            if smallest >= min_size:
                return [np.sort(np.concatenate(p)) for p in parts], props
    raise PartitionError(
        f"No LDA partition with every one of the {num_clients} clients holding >= {min_size} samples in "
        f"{max_tries} draws (smallest client: {smallest}). Use a larger alpha (partition.args.beta), fewer clients "
        "or a smaller min_size.")
