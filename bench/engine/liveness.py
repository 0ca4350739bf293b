"""Collective timeouts: a rank that waits too long for the others gives up with one clear error.

Fabric launches the process group with a generous timeout (``SETUP_MINUTES``: ranks start, import
and decode data at different speeds); the rounds run under ``--timeout`` minutes. A collective
that fails (timed out, or a peer ended) raises :class:`CollectiveError` naming this rank, the round
and the collective it was waiting on.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch.distributed as dist

from bench.core import compat
from bench.core.errors import FedbenchError, first_line
from bench.core.ranks import Ranks

SETUP_MINUTES = 60.0  # process-group start-up and rank 0's first decode of a dataset
WAIT_FOREVER_MINUTES = 7 * 24 * 60.0  # other ranks wait while rank 0 trains a central run alone


class CollectiveError(FedbenchError):
    """A rank gave up waiting for the others (stalled or dead peer)."""


_state = {"minutes": SETUP_MINUTES, "round": None}


def launch_timeout(minutes: float) -> timedelta:
    """The process group's timeout at launch: never shorter than SETUP_MINUTES."""
    return timedelta(minutes=max(minutes, SETUP_MINUTES))


NCCL_ENV = {"TORCH_NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}


def nccl_error_handling() -> dict[str, str]:
    """Make an NCCL collective that times out raise in the waiting rank (as gloo's do), so that
    ``waiting_on`` names the rank and round: without blocking wait NCCL's watchdog thread aborts the
    process on expiry and no handler runs. (Async error handling 2, "clean up only": the watchdog
    aborts the communicators but does not kill the process.) Set before the process group starts (make_fabric), inherited
    by the ranks Fabric launches; a value the user set is kept. Returns what is now in effect."""
    import os

    for key, value in NCCL_ENV.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in NCCL_ENV}


def set_collective_timeout(fabric, minutes: float) -> None:
    """Every later collective of this process group gives up after ``minutes``."""
    _state["minutes"] = minutes
    setter = getattr(dist, "set_timeout", None)  # torch >= 2.7; before it, the launch timeout stays
    if setter is not None and fabric.world_size > 1 and dist.is_available() and dist.is_initialized():
        setter(timedelta(minutes=minutes))


@contextmanager
def collective_timeout(fabric, minutes: float) -> Iterator[None]:
    """Run the body under a ``minutes`` timeout, then restore the start-up one."""
    set_collective_timeout(fabric, minutes)
    try:
        yield
    finally:
        set_collective_timeout(fabric, SETUP_MINUTES)
        _state["round"] = None


def set_round(round_idx: int | None) -> None:
    """The round named in errors (set by the orchestrator as each round starts)."""
    _state["round"] = round_idx


def _announce(rank: int, token: str):
    """Write 'rank arrived at token' into the process group's key-value store (rank 0's TCPStore: one
    small message per collective, no collective of its own), so that a rank that gives up can name the
    ranks that never arrived. Returns the store, or None when there is none."""
    try:
        store = compat.default_store()  # torch's own store of the default group
        store.set(f"fedbench/arrived/{rank}", token)
        return store
    except Exception:  # noqa: BLE001 (no store, or it is gone: the error message just names no rank)
        return None


def _absent(store, rank: int, world: int, token: str) -> list[int]:
    """The ranks whose last announced collective is not ``token`` (they never reached it)."""
    if store is None:
        return []
    out = []
    try:
        for other in range(world):
            key = f"fedbench/arrived/{other}"
            if other != rank and (not store.check([key]) or store.get(key).decode() != token):
                out.append(other)
    except Exception:  # noqa: BLE001 (rank 0, who holds the store, may be the one that died)
        return []
    return out


def barrier(fabric, what: str) -> None:
    """Every rank waits here for the others, under the run's timeout (a rank that never arrives is named)."""
    with waiting_on(fabric, what):
        fabric.barrier()


def run_ranks(fabric) -> Ranks:
    """The run's ranks as its method sees them (bench/core/ranks.py), with this module's barrier."""
    return Ranks(fabric.global_rank, fabric.world_size, lambda what: barrier(fabric, what))


@contextmanager
def waiting_on(fabric, what: str) -> Iterator[None]:
    """Around one collective call: a failure becomes a CollectiveError naming rank, round and ``what``."""
    if fabric is None or fabric.world_size == 1:
        yield
        return
    token = f"{what}|{_state['round']}"
    store = _announce(fabric.global_rank, token)
    try:
        yield
    except RuntimeError as err:
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        where = f" in round {_state['round']}" if _state["round"] is not None else ""
        if "timed out" in text.lower() or "timeout" in text.lower():
            missing = _absent(store, fabric.global_rank, fabric.world_size, token)
            who = (f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did not arrive (stalled or died)"
                   if missing else "another rank stalled or died")
            why = (f"no answer within {_state['minutes']:g} min (--timeout): {who}. "
                   "Check that rank's output; raise --timeout if a round legitimately takes longer.")
        else:
            why = "another rank ended or lost contact; its own error is printed above."
        raise CollectiveError(f"Rank {fabric.global_rank} of {fabric.world_size} gave up waiting for {what}{where}: "
                              f"{why} ({first_line(text, 200)})") from err


ERROR_KEY = "fedbench/error/rank0"


def print_error_once(text: str, wait_seconds: float = 3.0) -> bool:
    """Whether this rank should print the error ``text``: an error every rank hits (a bad option caught
    after the ranks started) is printed once, by rank 0. Rank 0 posts its error in the process group's
    store and prints it; another rank prints its own only when rank 0 has not posted the same text within
    ``wait_seconds`` (its error is its own: a client that diverged there, a rank 0 that died)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return True
    try:
        store = compat.default_store()
        if dist.get_rank() == 0:
            store.set(ERROR_KEY, text)
            return True
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline:
            if store.check([ERROR_KEY]):
                return store.get(ERROR_KEY).decode() != text
            time.sleep(0.05)
    except Exception:  # noqa: BLE001 (no store, or rank 0 gone with it: say it here)
        return True
    return True


def post_rank_error(rank: int, text: str) -> None:
    """A rank whose client failed leaves its error in the store (before the round's all-reduce), so that
    the other ranks can raise the same error, word for word, instead of pointing at another rank's output."""
    try:
        if dist.is_available() and dist.is_initialized():
            compat.default_store().set(f"fedbench/failed/{rank}", text)
    except Exception:  # noqa: BLE001 (no store: the others say "see that rank's error")
        return


def other_rank_error(rank: int, world: int) -> str | None:
    """The error another rank posted with ``post_rank_error`` (the lowest such rank's), or None."""
    try:
        store = compat.default_store()
        for other in range(world):
            key = f"fedbench/failed/{other}"
            if other != rank and store.check([key]):
                return store.get(key).decode()
    except Exception:  # noqa: BLE001
        return None
    return None
