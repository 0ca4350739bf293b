"""Checks and cuts shared by several schemes."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bench.core.errors import PartitionError


def betas(beta: float | Sequence[float], num_classes: int) -> np.ndarray:
    """One Dirichlet concentration per class (one number is broadcast); each finite and > 0."""
    out = np.broadcast_to(np.asarray(beta, dtype=np.float64), (num_classes,)) if np.ndim(beta) == 0 else (
        np.asarray(beta, dtype=np.float64)
    )
    if out.shape != (num_classes,):
        raise PartitionError(
            f"beta must be one number or one per class ({num_classes}), got {len(out)} values."
        )
    if not np.all(np.isfinite(out)) or np.any(out <= 0):
        raise PartitionError(f"Dirichlet beta must be > 0, got {beta}. Use e.g. partition.args.beta 0.5 "
                             f"(smaller = more heterogeneous).")
    return out


def check_min_size(min_size: int, num_clients: int, num_samples: int) -> None:
    if min_size * num_clients > num_samples:
        raise PartitionError(f"min_size {min_size} x {num_clients} clients exceeds the {num_samples} samples. "
                             "Use a smaller min_size or fewer clients.")


def split_by_proportions(class_idx: list[np.ndarray], props: np.ndarray) -> list[np.ndarray]:
    """Cut each class's (shuffled) indices at round(cumsum(p) * n_c); the last client takes the rest."""
    num_clients = props.shape[1]
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c, idx in enumerate(class_idx):
        cuts = np.round(np.cumsum(props[c])[:-1] * len(idx)).astype(np.int64)
        cuts = np.clip(np.maximum.accumulate(cuts), 0, len(idx))
        for k, chunk in enumerate(np.split(idx, cuts)):
            parts[k].append(chunk)
    return [np.sort(np.concatenate(p)) for p in parts]
