"""``shards``: label-sorted shards dealt to the clients.

``shard_mode="sorted"`` (default): sort by label, cut into ``num_clients * shards_per_client``
shards, give each client ``shards_per_client`` random shards (McMahan et al.); a shard may
straddle two classes. ``shard_mode="per_class"``: FedNTD's sharding (Lee et al. 2022,
``train_tools/preprocessing/datasetter.py``), which FST-CBDG follows: each class is cut into
``s * N / K`` near-equal shards (s shards per client, N clients, K classes; must be a whole
number), the multiset of shard labels (each class ``s * N / K`` times) is shuffled and dealt
out s per client, and each client takes a random remaining shard of every label it was dealt.
A shard never straddles two classes; a client may be dealt the same class twice.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from bench.core.errors import PartitionError
from datamodules.partitions import PARTITION_SCHEMES, SchemeInput, SchemeOutput, takes

SHARD_MODES = ("sorted", "per_class")


@dataclass(frozen=True)
class Sharding:
    """The options of ``shards`` (``partition.args``)."""

    shards_per_client: int = 2
    shard_mode: Literal["sorted", "per_class"] = "sorted"  # McMahan's sorted cut, or FedNTD's per class


@PARTITION_SCHEMES.register("shards")
@takes(Sharding)
def shards(s: SchemeInput) -> SchemeOutput:
    o = s.options
    if o.shards_per_client < 1:
        raise PartitionError(f"shards_per_client must be >= 1, got {o.shards_per_client}.")
    if o.shard_mode not in SHARD_MODES:
        raise PartitionError(f"shard_mode must be one of {', '.join(SHARD_MODES)}, got {o.shard_mode!r}.")
    options = {"shards_per_client": int(o.shards_per_client)}
    if o.shard_mode == "per_class":
        clients = _per_class(s.labels, s.num_clients, s.rng, o.shards_per_client, s.num_classes)
        options["shard_mode"] = o.shard_mode
    else:
        clients = _sorted(s.labels, s.num_clients, s.rng, o.shards_per_client)
    return SchemeOutput(clients, None, options)


def _sorted(labels: np.ndarray, num_clients: int, rng: np.random.Generator, per_client: int) -> list[np.ndarray]:
    """McMahan et al.'s sharding (see the module docstring)."""
    num_shards = num_clients * per_client
    if num_shards > len(labels):
        raise PartitionError(
            f"shards: {num_clients} clients x {per_client} shards = {num_shards} shards but only "
            f"{len(labels)} samples. Use fewer clients or fewer shards per client."
        )
    order = rng.permutation(len(labels))
    order = order[np.argsort(labels[order], kind="stable")]  # sorted by label, random within a class
    cut = np.array_split(order, num_shards)
    assignment = rng.permutation(num_shards).reshape(num_clients, per_client)
    return [np.sort(np.concatenate([cut[k] for k in row])) for row in assignment]


def check_per_class_shards(num_clients: int, per_client: int, num_classes: int) -> None:
    """FedNTD's sharding cuts every class into s * N / K shards: s * N must be a multiple of K."""
    total = per_client * num_clients
    if total % num_classes:
        raise PartitionError(
            f"shards (per_class): {num_clients} clients x {per_client} shards = {total} shards do not divide "
            f"evenly over the {num_classes} classes (FedNTD cuts every class into s * N / K shards). Choose "
            "num_clients and shards_per_client with s * N a multiple of K, or shard_mode 'sorted'.")


def _per_class(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, per_client: int, num_classes: int
) -> list[np.ndarray]:
    """FedNTD's sharding (see the module docstring)."""
    check_per_class_shards(num_clients, per_client, num_classes)
    per_class = per_client * num_clients // num_classes
    by_class: list[list[np.ndarray]] = []
    for c in range(num_classes):
        idx = rng.permutation(np.flatnonzero(labels == c))
        if len(idx) < per_class:
            raise PartitionError(
                f"shards (per_class): class {c} has {len(idx)} samples, fewer than its {per_class} shards. "
                "Use fewer clients or fewer shards per client.")
        by_class.append(list(np.array_split(idx, per_class)))
    dealt = rng.permutation(np.repeat(np.arange(num_classes), per_class)).reshape(num_clients, per_client)
    clients = []
    for row in dealt:
        mine = [by_class[c].pop(int(rng.integers(len(by_class[c])))) for c in row]
        clients.append(np.sort(np.concatenate(mine)))
    return clients
