"""Client partitions of a training set: iid, Dirichlet, shards, natural sites, Dirichlet with missing classes.

A partition is a pure function of (labels, scheme, seed, options): every draw comes from
``np.random.default_rng(seed)`` in a fixed order. Every sample goes to exactly one client.

Schemes
-------
``iid``
    shuffle, then split into ``num_clients`` near-equal parts.
``dirichlet``
    per class c, proportions p_c ~ Dir(beta * 1_K) over the K clients; the class's shuffled
    samples are cut at round(cumsum(p_c) * n_c), so the last client takes the remainder
    (the FedBM / FedCB partition). Redrawn from the same stream until every client has at
    least ``min_size`` samples.
``shards``
    ``shard_mode="sorted"`` (default): sort by label, cut into ``num_clients * shards_per_client``
    shards, give each client ``shards_per_client`` random shards (McMahan et al.); a shard may
    straddle two classes. ``shard_mode="per_class"``: FedNTD's sharding (Lee et al. 2022,
    ``train_tools/preprocessing/datasetter.py``), which FST-CBDG follows: each class is cut into
    ``s * N / K`` near-equal shards (s shards per client, N clients, K classes; must be a whole
    number), the multiset of shard labels (each class ``s * N / K`` times) is shuffled and dealt
    out s per client, and each client takes a random remaining shard of every label it was dealt.
    A shard never straddles two classes; a client may be dealt the same class twice.
``lda``
    FedNTD's "LDA" (FST-CBDG's non-iid setting): for each class in turn, its shuffled samples are
    cut (floor of cumsum(p) * n_c) by p ~ Dir(alpha * 1_N) over the clients, where a client already
    holding at least (training samples) / N gets a zero share and p is renormalised; the whole
    draw repeats until every client has at least ``min_size`` samples (FedNTD: 10).
``proportions``
    quantity skew: every class is cut by the same client proportions ``proportions`` (FACMIC's
    committed ``datasplit.py``, which applies one hard-coded vector per alpha to every class
    instead of the per-class Dirichlet draw its paper describes).
``natural``
    one client per distinct value of ``groups`` (a site / centre id), in sorted order.
``dirichlet_missing``
    FedNPR's RSNA-ICH split (§4.5.1): per class, each client independently lacks the class
    with probability ``missing_prob`` (at least one client keeps it); the class is then spread
    over the clients keeping it with Dir(beta). Same rounding and min-size guarantee as above.

``beta`` may be one number or one per class (FedNPR draws each ICH class with its own beta).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.core.errors import PartitionError

SCHEMES = ("iid", "dirichlet", "shards", "natural", "dirichlet_missing", "lda", "proportions")
SHARD_MODES = ("sorted", "per_class")


@dataclass
class Partition:
    """The clients' sample indices (each sorted; every sample exactly once) and how they were drawn."""

    client_indices: list[np.ndarray]
    proportions: np.ndarray | None  # [num_classes, num_clients] shares used (Dirichlet, lda, proportions; else None)
    scheme: str
    class_counts: np.ndarray | None = None  # [num_clients, num_classes], filled by partition()
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    def sizes(self) -> list[int]:
        return [len(idx) for idx in self.client_indices]

    def counts(self, labels: np.ndarray, num_classes: int) -> np.ndarray:
        """Samples per client and class: int64 [num_clients, num_classes]."""
        labels = np.asarray(labels)
        return np.stack(
            [np.bincount(labels[idx], minlength=num_classes)[:num_classes] for idx in self.client_indices]
        ).astype(np.int64)

    def to_json(self) -> dict[str, Any]:
        """A compact, JSON-serialisable summary for the run record: scheme, options, sizes, counts."""
        out: dict[str, Any] = {"scheme": self.scheme, **self.options, "num_clients": self.num_clients,
                               "sizes": self.sizes()}
        if self.class_counts is not None:
            out["counts"] = self.class_counts.tolist()
        return out


# ---- validation -----------------------------------------------------------------------------------
def _check_labels(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise PartitionError(f"labels must be a non-empty 1-D array, got shape {labels.shape}.")
    if not np.issubdtype(labels.dtype, np.integer) and not np.all(np.equal(np.mod(labels, 1), 0)):
        raise PartitionError(f"labels must be integer class ids, got dtype {labels.dtype}.")
    labels = labels.astype(np.int64)
    if labels.min() < 0:
        raise PartitionError(f"labels must be >= 0, found {labels.min()}.")
    return labels


def _betas(beta: float | Sequence[float], num_classes: int) -> np.ndarray:
    betas = np.broadcast_to(np.asarray(beta, dtype=np.float64), (num_classes,)) if np.ndim(beta) == 0 else (
        np.asarray(beta, dtype=np.float64)
    )
    if betas.shape != (num_classes,):
        raise PartitionError(
            f"beta must be one number or one per class ({num_classes}), got {len(betas)} values."
        )
    if not np.all(np.isfinite(betas)) or np.any(betas <= 0):
        raise PartitionError(f"Dirichlet beta must be > 0, got {beta}. Use e.g. --partition.beta 0.5 "
                             f"(smaller = more heterogeneous).")
    return betas


# ---- schemes ----------------------------------------------------------------------------------------
def _split_by_proportions(class_idx: list[np.ndarray], props: np.ndarray) -> list[np.ndarray]:
    """Cut each class's (shuffled) indices at round(cumsum(p) * n_c); the last client takes the rest."""
    num_clients = props.shape[1]
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c, idx in enumerate(class_idx):
        cuts = np.round(np.cumsum(props[c])[:-1] * len(idx)).astype(np.int64)
        cuts = np.clip(np.maximum.accumulate(cuts), 0, len(idx))
        for k, chunk in enumerate(np.split(idx, cuts)):
            parts[k].append(chunk)
    return [np.sort(np.concatenate(p)) for p in parts]


def _dirichlet(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, betas: np.ndarray, min_size: int,
    max_tries: int, missing_prob: float | None,
) -> tuple[list[np.ndarray], np.ndarray]:
    num_classes = len(betas)
    class_idx = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    smallest = 0
    for _ in range(max_tries):
        props = np.zeros((num_classes, num_clients))
        for c in range(num_classes):
            keep = np.ones(num_clients, dtype=bool)
            if missing_prob is not None:
                keep = rng.random(num_clients) >= missing_prob
                if not keep.any():
                    keep[rng.integers(num_clients)] = True
            props[c, keep] = rng.dirichlet(np.full(int(keep.sum()), betas[c]))
        clients = _split_by_proportions(class_idx, props)
        smallest = min(len(idx) for idx in clients)
        if smallest >= min_size:
            return clients, props
    raise PartitionError(
        f"No Dirichlet partition with every one of the {num_clients} clients holding >= {min_size} samples "
        f"in {max_tries} draws (smallest client: {smallest}). Use a larger beta, fewer clients or a smaller "
        f"min_size (--partition.beta / --partition.num_clients / --partition.min_size)."
    )


def _shards(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, per_client: int
) -> list[np.ndarray]:
    num_shards = num_clients * per_client
    if num_shards > len(labels):
        raise PartitionError(
            f"shards: {num_clients} clients x {per_client} shards = {num_shards} shards but only "
            f"{len(labels)} samples. Use fewer clients or fewer shards per client."
        )
    order = rng.permutation(len(labels))
    order = order[np.argsort(labels[order], kind="stable")]  # sorted by label, random within a class
    shards = np.array_split(order, num_shards)
    assignment = rng.permutation(num_shards).reshape(num_clients, per_client)
    return [np.sort(np.concatenate([shards[s] for s in row])) for row in assignment]


def check_per_class_shards(num_clients: int, per_client: int, num_classes: int) -> None:
    """FedNTD's sharding cuts every class into s * N / K shards: s * N must be a multiple of K."""
    total = per_client * num_clients
    if total % num_classes:
        raise PartitionError(
            f"shards (per_class): {num_clients} clients x {per_client} shards = {total} shards do not divide "
            f"evenly over the {num_classes} classes (FedNTD cuts every class into s * N / K shards). Choose "
            "num_clients and shards_per_client with s * N a multiple of K, or shard_mode 'sorted'.")


def _shards_per_class(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, per_client: int, num_classes: int
) -> list[np.ndarray]:
    """FedNTD's sharding (see the module docstring)."""
    check_per_class_shards(num_clients, per_client, num_classes)
    per_class = per_client * num_clients // num_classes
    shards: list[list[np.ndarray]] = []
    for c in range(num_classes):
        idx = rng.permutation(np.flatnonzero(labels == c))
        if len(idx) < per_class:
            raise PartitionError(
                f"shards (per_class): class {c} has {len(idx)} samples, fewer than its {per_class} shards. "
                "Use fewer clients or fewer shards per client.")
        shards.append(list(np.array_split(idx, per_class)))
    dealt = rng.permutation(np.repeat(np.arange(num_classes), per_class)).reshape(num_clients, per_client)
    clients = []
    for row in dealt:
        mine = [shards[c].pop(int(rng.integers(len(shards[c])))) for c in row]
        clients.append(np.sort(np.concatenate(mine)))
    return clients


def _lda(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, alpha: float, min_size: int, max_tries: int,
    num_classes: int,
) -> tuple[list[np.ndarray], np.ndarray]:
    """FedNTD's LDA (see the module docstring); returns the clients and the shares used [K, N]."""
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
        f"{max_tries} draws (smallest client: {smallest}). Use a larger alpha (--partition.beta), fewer clients "
        "or a smaller min_size.")


def _proportions(labels: np.ndarray, num_clients: int, rng: np.random.Generator, proportions: Sequence[float] | None,
                 num_classes: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Quantity skew: every class cut by the same client proportions (see the module docstring)."""
    p = np.asarray(proportions if proportions is not None else [], dtype=np.float64)
    if p.shape != (num_clients,) or not np.all(np.isfinite(p)) or np.any(p < 0) or not p.sum() > 0:
        raise PartitionError(
            f"The proportions partition needs partition.proportions: {num_clients} non-negative numbers (one per "
            f"client, normalised to sum 1), got {proportions!r}.")
    props = np.tile(p / p.sum(), (num_classes, 1))
    class_idx = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    return _split_by_proportions(class_idx, props), props


def _natural(labels: np.ndarray, num_clients: int, groups: np.ndarray | None) -> list[np.ndarray]:
    if groups is None:
        raise PartitionError(
            "The natural partition needs a site id per sample (groups), but this dataset has none. "
            "Use a dataset with sites (e.g. Fed-ISIC2019) or another scheme (iid, dirichlet, shards)."
        )
    groups = np.asarray(groups)
    if groups.shape != labels.shape:
        raise PartitionError(
            f"groups has shape {groups.shape}, labels {labels.shape}: one group per sample needed."
        )
    sites = np.unique(groups)
    if len(sites) != num_clients:
        raise PartitionError(
            f"The natural partition has one client per site: the data has {len(sites)} sites, but "
            f"num_clients is {num_clients}. Set --partition.num_clients {len(sites)}."
        )
    return [np.flatnonzero(groups == s) for s in sites]


def partition(
    labels: np.ndarray,
    scheme: str,
    num_clients: int,
    seed: int,
    *,
    beta: float | Sequence[float] = 0.5,
    shards_per_client: int = 2,
    min_size: int = 10,
    groups: np.ndarray | None = None,
    missing_prob: float = 0.5,
    max_tries: int = 1000,
    num_classes: int | None = None,
    shard_mode: str = "sorted",
    client_proportions: Sequence[float] | None = None,
) -> Partition:
    """Split sample indices over ``num_clients`` clients by ``scheme`` (see the module docstring).

    Deterministic in (labels, scheme, num_clients, seed, options). ``num_classes`` defaults to
    ``labels.max() + 1`` (pass it when the last classes may have no sample). Raises
    :class:`PartitionError` with a fix-it message for impossible requests.
    """
    if scheme not in SCHEMES:
        raise PartitionError(f"Unknown partition scheme {scheme!r}. Choose one of: {', '.join(SCHEMES)}.")
    labels = _check_labels(labels)
    if int(num_clients) != num_clients or num_clients < 1:
        raise PartitionError(f"num_clients must be a positive integer, got {num_clients}.")
    if num_clients > len(labels):
        raise PartitionError(
            f"{num_clients} clients but only {len(labels)} samples: every client needs at least one. "
            f"Use fewer clients."
        )
    if num_classes is None:
        num_classes = int(labels.max()) + 1
    elif labels.max() >= num_classes:
        raise PartitionError(f"labels go up to {labels.max()} but num_classes is {num_classes}.")
    rng = np.random.default_rng(seed)
    proportions = None
    options: dict[str, Any] = {"seed": int(seed)}
    if scheme == "iid":
        clients = [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), num_clients)]
    elif scheme == "shards":
        if shards_per_client < 1:
            raise PartitionError(f"shards_per_client must be >= 1, got {shards_per_client}.")
        if shard_mode not in SHARD_MODES:
            raise PartitionError(f"shard_mode must be one of {', '.join(SHARD_MODES)}, got {shard_mode!r}.")
        options["shards_per_client"] = int(shards_per_client)
        if shard_mode == "per_class":
            clients = _shards_per_class(labels, num_clients, rng, shards_per_client, num_classes)
            options["shard_mode"] = shard_mode
        else:
            clients = _shards(labels, num_clients, rng, shards_per_client)
    elif scheme == "natural":
        clients = _natural(labels, num_clients, groups)
    elif scheme == "proportions":
        clients, proportions = _proportions(labels, num_clients, rng, client_proportions, num_classes)
        options["proportions"] = proportions[0].tolist()
    elif scheme == "lda":
        alpha = float(_betas(beta, 1)[0]) if np.ndim(beta) == 0 else None
        if alpha is None:
            raise PartitionError(f"lda takes one alpha (partition.beta), got {beta!r}.")
        if min_size * num_clients > len(labels):
            raise PartitionError(f"min_size {min_size} x {num_clients} clients exceeds the {len(labels)} samples. "
                                 "Use a smaller min_size or fewer clients.")
        clients, proportions = _lda(labels, num_clients, rng, alpha, min_size, max(1, max_tries), num_classes)
        options.update(beta=alpha, min_size=int(min_size))
    else:
        betas = _betas(beta, num_classes)
        missing = None
        if scheme == "dirichlet_missing":
            if not 0.0 <= missing_prob < 1.0:
                raise PartitionError(f"missing_prob must be in [0, 1), got {missing_prob}.")
            missing = float(missing_prob)
            options["missing_prob"] = missing
        if min_size * num_clients > len(labels):
            raise PartitionError(
                f"min_size {min_size} x {num_clients} clients exceeds the {len(labels)} samples. "
                f"Use a smaller min_size or fewer clients."
            )
        if max_tries < 1:
            raise PartitionError(f"max_tries must be >= 1, got {max_tries}.")
        clients, proportions = _dirichlet(labels, num_clients, rng, betas, min_size, max_tries, missing)
        options.update(beta=float(betas[0]) if np.ndim(beta) == 0 else betas.tolist(), min_size=int(min_size))
    result = Partition(clients, proportions, scheme, options=options)
    result.class_counts = result.counts(labels, num_classes)
    return result
