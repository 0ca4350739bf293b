"""The run's ranks as a method sees them: methods never import ``torch.distributed``.

During a run, ``current_ranks()`` is the run's ``Ranks`` (the engine sets it before it builds the method,
for the whole run; outside a run, in tests and tools, it is one rank): whether this process is rank 0,
and ``rank_zero_first`` for work that rank 0 does first and the other ranks then reuse (the CLIP text and
image feature caches, FedCB's prompt embeddings: one encode per machine, bit-identical on every rank).
Its barrier is the run's own (bench/engine/liveness.py: under the run's ``--timeout``, a rank that never arrives
is named in one clear error), not a raw ``torch.distributed.barrier``.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator


class Ranks:
    """This process's rank among ``world_size``; ``barrier(what)`` waits for every rank."""

    def __init__(self, rank: int = 0, world_size: int = 1, barrier: Callable[[str], None] | None = None) -> None:
        if world_size > 1 and barrier is None:
            raise ValueError("several ranks need a barrier")
        self.rank, self.world_size, self.barrier = rank, world_size, barrier

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @contextlib.contextmanager
    def rank_zero_first(self, what: str) -> Iterator[None]:
        """Rank 0 runs the block first; the others wait at a barrier, then run it (reading what rank 0 wrote)."""
        if self.world_size > 1 and self.rank != 0:
            self.barrier(what)
        yield
        if self.world_size > 1 and self.rank == 0:
            self.barrier(what)


ONE_RANK = Ranks()
_CURRENT: contextvars.ContextVar[Ranks] = contextvars.ContextVar("fedbench_ranks", default=ONE_RANK)


def current_ranks() -> Ranks:
    """The ranks of the run in progress (one rank outside a run)."""
    return _CURRENT.get()


def set_ranks(ranks: Ranks) -> None:
    """The engine: the run's ranks, until the end of the enclosing ``run_scope``."""
    _CURRENT.set(ranks)


@contextlib.contextmanager
def run_scope() -> Iterator[None]:
    """One run: ranks set inside it are gone at its end (the next run, or a test, sees its own)."""
    token = _CURRENT.set(ONE_RANK)
    try:
        yield
    finally:
        _CURRENT.reset(token)
