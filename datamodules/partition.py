"""Client partitions of a training set: which client holds which training sample.

A partition is a pure function of (labels, scheme, seed, options): every draw comes from
``np.random.default_rng(seed)`` in a fixed order. Every sample goes to exactly one client.

:func:`partition` checks what every scheme needs (labels, client and class counts) and dispatches by
name through :data:`~datamodules.partitions.PARTITION_SCHEMES`; each scheme is one file of
``datamodules/partitions/`` (``iid``, ``dirichlet``, ``dirichlet_missing``, ``shards``, ``lda``,
``proportions``, ``natural``), whose docstring says how it draws and whose ``@takes`` dataclass declares the
options it takes (a run's ``partition.args``, checked by :func:`scheme_options`). Adding a scheme is adding a
file there (see ``datamodules/partitions/__init__.py``). The heatmap of a partition is drawn by
``bench/assembly/partition_plot.py``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.core.errors import PartitionError
from bench.core.option_types import describe, matches
from datamodules.partitions import PARTITION_SCHEMES, SchemeInput, option_hints, options_of
from datamodules.partitions.shards import SHARD_MODES, check_per_class_shards

__all__ = ["SCHEMES", "SHARD_MODES", "Partition", "check_per_class_shards", "partition", "scheme_names",
           "scheme_options"]


def scheme_names() -> list[str]:
    """Every registered partition scheme (the files of datamodules/partitions and any registered since)."""
    return PARTITION_SCHEMES.names()


SCHEMES = tuple(scheme_names())  # the schemes of datamodules/partitions


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


def scheme_options(scheme: str, args: Mapping[str, Any] | None = None) -> Any:
    """The options dataclass of ``scheme`` filled from ``args`` (a run's ``partition.args``; the rest at their
    defaults). An unknown scheme, an option the scheme does not take or a value of the wrong type is one
    PartitionError naming what the scheme takes."""
    if scheme not in scheme_names():
        raise PartitionError(f"Unknown partition scheme {scheme!r}. Choose one of: {', '.join(scheme_names())}.")
    args = dict(args or {})
    hints = option_hints(scheme)
    takes = ", ".join(f"{k} ({describe(h)})" for k, h in hints.items()) or "no options"
    unknown = sorted(set(args) - set(hints))
    if unknown:
        raise PartitionError(f"partition.args for the {scheme!r} scheme has unknown option(s) {unknown}; "
                             f"{scheme!r} takes: {takes}.")
    for key, value in args.items():
        if not matches(value, hints[key]):
            raise PartitionError(f"partition.args.{key} of the {scheme!r} scheme must be {describe(hints[key])}, "
                                 f"got {value!r}.")
    return options_of(scheme)(**args)


def partition(
    labels: np.ndarray,
    scheme: str,
    num_clients: int,
    seed: int,
    *,
    groups: np.ndarray | None = None,
    max_tries: int = 1000,
    num_classes: int | None = None,
    **args: Any,
) -> Partition:
    """Split sample indices over ``num_clients`` clients by ``scheme`` (see the module docstring); ``args``:
    the scheme's own options (``beta=0.1``, ``shards_per_client=2``; checked by :func:`scheme_options`).

    Deterministic in (labels, scheme, num_clients, seed, options). ``num_classes`` defaults to
    ``labels.max() + 1`` (pass it when the last classes may have no sample). Raises
    :class:`PartitionError` with a fix-it message for impossible requests.
    """
    options = scheme_options(scheme, args)
    labels = _check_labels(labels)
    num_classes = _check_counts(labels, num_clients, num_classes)
    drawn = PARTITION_SCHEMES.get(scheme)(SchemeInput(
        labels, num_clients, num_classes, np.random.default_rng(seed), options, groups=groups, max_tries=max_tries))
    result = Partition(drawn.clients, drawn.proportions, scheme, options={"seed": int(seed), **drawn.options})
    result.class_counts = result.counts(labels, num_classes)
    return result


def _check_counts(labels: np.ndarray, num_clients: int, num_classes: int | None) -> int:
    """Check the client count against the samples and return the class count (default: labels.max() + 1)."""
    if int(num_clients) != num_clients or num_clients < 1:
        raise PartitionError(f"num_clients must be a positive integer, got {num_clients}.")
    if num_clients > len(labels):
        raise PartitionError(
            f"{num_clients} clients but only {len(labels)} samples: every client needs at least one. "
            f"Use fewer clients."
        )
    if num_classes is None:
        return int(labels.max()) + 1
    if labels.max() >= num_classes:
        raise PartitionError(f"labels go up to {labels.max()} but num_classes is {num_classes}.")
    return num_classes
