"""Dirichlet label skew.

``dirichlet``
    per class c, proportions p_c ~ Dir(beta * 1_K) over the K clients; the class's shuffled
    samples are cut at round(cumsum(p_c) * n_c), so the last client takes the remainder
    (the FedBM / FedCB partition). Redrawn from the same stream until every client has at
    least ``min_size`` samples.
``dirichlet_missing``
    FedNPR's RSNA-ICH split (§4.5.1): per class, each client independently lacks the class
    with probability ``missing_prob`` (at least one client keeps it); the class is then spread
    over the clients keeping it with Dir(beta). Same rounding and min-size guarantee as above.

``beta`` may be one number or one per class (FedNPR draws each ICH class with its own beta).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.core.errors import PartitionError
from datamodules.partitions import PARTITION_SCHEMES, SchemeInput, SchemeOutput, takes
from datamodules.partitions._common import betas as checked_betas
from datamodules.partitions._common import check_min_size, split_by_proportions


@dataclass(frozen=True)
class Concentration:
    """The options of ``dirichlet`` (``partition.args``)."""

    beta: float | list[float] = 0.5  # the concentration: one, or one per class (smaller = more skewed)
    min_size: int = 10  # every client holds at least this many samples (redrawn until it does)


@dataclass(frozen=True)
class MissingClasses(Concentration):
    """The options of ``dirichlet_missing``: those of ``dirichlet`` and how often a client lacks a class."""

    missing_prob: float = 0.5


@PARTITION_SCHEMES.register("dirichlet")
@takes(Concentration)
def dirichlet(s: SchemeInput) -> SchemeOutput:
    return _dirichlet_scheme(s, missing=False)


@PARTITION_SCHEMES.register("dirichlet_missing")
@takes(MissingClasses)
def dirichlet_missing(s: SchemeInput) -> SchemeOutput:
    return _dirichlet_scheme(s, missing=True)


def _dirichlet_scheme(s: SchemeInput, missing: bool) -> SchemeOutput:
    """Check the options, draw, and record beta (and missing_prob) and min_size."""
    o = s.options
    betas = checked_betas(o.beta, s.num_classes)
    options = {}
    missing_prob = None
    if missing:
        if not 0.0 <= o.missing_prob < 1.0:
            raise PartitionError(f"missing_prob must be in [0, 1), got {o.missing_prob}.")
        missing_prob = float(o.missing_prob)
        options["missing_prob"] = missing_prob
    check_min_size(o.min_size, s.num_clients, len(s.labels))
    if s.max_tries < 1:
        raise PartitionError(f"max_tries must be >= 1, got {s.max_tries}.")
    clients, proportions = _draw(s.labels, s.num_clients, s.rng, betas, o.min_size, s.max_tries, missing_prob)
    options.update(beta=float(betas[0]) if np.ndim(o.beta) == 0 else betas.tolist(), min_size=int(o.min_size))
    return SchemeOutput(clients, proportions, options)


def _draw(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, betas: np.ndarray, min_size: int,
    max_tries: int, missing_prob: float | None,
) -> tuple[list[np.ndarray], np.ndarray]:
    """Redraw the per-class shares until every client holds at least ``min_size`` samples."""
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
        clients = split_by_proportions(class_idx, props)
        smallest = min(len(idx) for idx in clients)
        if smallest >= min_size:
            return clients, props
    raise PartitionError(
        f"No Dirichlet partition with every one of the {num_clients} clients holding >= {min_size} samples "
        f"in {max_tries} draws (smallest client: {smallest}). Use a larger beta, fewer clients or a smaller "
        f"min_size (partition.args.beta / partition.num_clients / partition.args.min_size)."
    )
