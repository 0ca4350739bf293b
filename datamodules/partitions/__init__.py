"""Partition schemes, one file each, registered by name in :data:`PARTITION_SCHEMES`.

:func:`datamodules.partition.partition` checks the labels and the client count, draws the generator
``np.random.default_rng(seed)`` and hands both, with the scheme's options, to the scheme registered under the
requested name as a :class:`SchemeInput`. A scheme declares its options (``partition.args`` of a run) as a
frozen dataclass with ``@takes(...)``: their names, types and defaults; a run's ``partition.args`` is checked
against it (unknown names and wrong types are one error) and the scheme reads ``s.options``. The scheme
returns the clients' sample indices as a :class:`SchemeOutput`: each client's indices sorted, every sample
exactly once, every random draw taken from ``s.rng`` (so the partition is a pure function of labels, scheme,
seed and options), plus the shares it used and the options worth recording. Errors are
:class:`~bench.core.errors.PartitionError` with a fix-it message.

A new scheme is one file in this folder (every module here not starting with ``_`` is imported on the
first lookup)::

    from dataclasses import dataclass

    import numpy as np

    from datamodules.partitions import PARTITION_SCHEMES, SchemeInput, SchemeOutput, takes


    @dataclass(frozen=True)
    class Stride:
        offset: int = 0  # partition.args.offset: where client 0 starts


    @PARTITION_SCHEMES.register("round-robin")
    @takes(Stride)
    def round_robin(s: SchemeInput) -> SchemeOutput:
        order = np.roll(s.rng.permutation(len(s.labels)), s.options.offset)
        return SchemeOutput([np.sort(order[k::s.num_clients]) for k in range(s.num_clients)])

The built-in schemes: ``iid`` (iid.py), ``dirichlet`` and ``dirichlet_missing`` (dirichlet.py),
``shards`` (shards.py), ``lda`` (lda.py), ``proportions`` (proportions.py), ``natural`` (natural.py).
"""
from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.core.registry import Registry


@dataclass(frozen=True)
class NoOptions:
    """The options of a scheme that takes none (iid, natural)."""


@dataclass(frozen=True)
class SchemeInput:
    """What a scheme draws from: checked int64 labels, the client and class counts, the run's generator,
    the scheme's own options (its ``@takes`` dataclass, filled from ``partition.args``), the samples' sites
    (``groups``, when the dataset has them) and how often a scheme that redraws may try."""

    labels: np.ndarray
    num_clients: int
    num_classes: int
    rng: np.random.Generator
    options: Any = field(default_factory=NoOptions)
    groups: np.ndarray | None = None
    max_tries: int = 1000


@dataclass
class SchemeOutput:
    """The clients' sample indices (each sorted), the shares used ([num_classes, num_clients], or None)
    and the options to record next to the seed (in the run record's ``partition``)."""

    clients: list[np.ndarray]
    proportions: np.ndarray | None = None
    options: dict[str, Any] = field(default_factory=dict)


Scheme = Callable[[SchemeInput], SchemeOutput]
PARTITION_SCHEMES: Registry[Scheme] = Registry("partition scheme", __name__)


def takes(options: type) -> Callable[[Scheme], Scheme]:
    """Declare the options a scheme reads from ``s.options``: a frozen dataclass (names, types, defaults)."""
    if not dataclasses.is_dataclass(options):
        raise TypeError(f"takes() wants a dataclass of the scheme's options, got {options!r}")

    def deco(scheme: Scheme) -> Scheme:
        scheme.options = options  # type: ignore[attr-defined]
        return scheme

    return deco


def options_of(scheme: str) -> type:
    """The options dataclass of the scheme registered as ``scheme`` (NoOptions when it declares none)."""
    return getattr(PARTITION_SCHEMES.get(scheme), "options", NoOptions)


def option_hints(scheme: str) -> dict[str, Any]:
    """Option name -> its type annotation, for the scheme ``scheme``."""
    return typing.get_type_hints(options_of(scheme))


def option_defaults(scheme: str) -> dict[str, Any]:
    """Option name -> its default (None for an option without one: it must be given)."""
    return {f.name: None if f.default is dataclasses.MISSING else f.default
            for f in dataclasses.fields(options_of(scheme))}
