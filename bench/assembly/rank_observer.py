"""Fabric's watcher of the ranks it launched, with a grace period for ranks that were interrupted.

Fabric's subprocess launcher starts a thread in rank 0's process (its child-process observer) that polls
the other ranks every 5 s and, as soon as one has exited with a non-zero status, SIGKILLs every rank and
rank 0 itself, so that no rank hangs in a collective. Ctrl-C reaches the terminal's whole process group:
every rank stops with status 130 (143 for SIGTERM) and rank 0 is already ending by itself, with its one
line and its exit status. When the poll fell between rank 1's exit and rank 0's, the watcher SIGKILLed
rank 0: status -9 and Fabric's "Forcefully terminating all other processes to avoid zombies" instead of
130 (seen in `make test`: tests/assembly/test_process_lifetime.py's Ctrl-C test).

``GraceForInterrupted`` is the verdict of a watcher polling every ``POLL_S``; it treats ranks that ended interrupted (130 or 143 from
fedbench's handler, or killed by SIGINT/SIGTERM itself: -2, -15, e.g. while still importing) apart: rank 0
gets ``INTERRUPT_GRACE_S`` to end by itself; if it has not (its main thread blocked in a collective or a
rendezvous with a rank that is gone, where no Python handler runs: seen under load, 34 s), the observer
ends rank 0 as interrupted itself: the one line and the interrupted status, not a SIGKILL. Any other failing
status is handled at once, as Fabric does. ``install`` makes Fabric's launcher start it (Fabric has no
public option for its observer: the private names are used in bench/core/compat.py only).
"""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from bench.core import compat
from bench.core.lifetime import exit_interrupted

INTERRUPT_CODES = {130: 130, 143: 143, -signal.SIGINT: 130, -signal.SIGTERM: 143}  # a rank's status -> ours
INTERRUPT_GRACE_S = 5.0  # an interrupted rank 0 that can run Python ends in under a second
POLL_S = 1


class GraceForInterrupted:
    """The watcher's verdict on the ranks' exit codes: ranks which exited interrupted leave rank 0 time to
    end itself, after which ``end_interrupted(status)`` ends it (default: ``exit_interrupted``, in rank 0's
    own process); None otherwise (Fabric's own rule)."""

    def __init__(self, end_interrupted: Callable[[int], None] = exit_interrupted) -> None:
        self.interrupted_at: float | None = None
        self.end_interrupted = end_interrupted

    def __call__(self, codes: list[int | None]) -> bool | None:
        failed = [code for code in codes if code]
        if failed and all(code in INTERRUPT_CODES for code in failed):
            self.interrupted_at = self.interrupted_at or time.monotonic()
            if time.monotonic() - self.interrupted_at < INTERRUPT_GRACE_S:
                return False  # rank 0 got the same signal: it ends by itself
            self.end_interrupted(max(INTERRUPT_CODES[code] for code in failed))
            return True
        return None


def launch_observer(child_processes: list) -> None:
    compat.rank_watcher(os.getpid(), child_processes, POLL_S, GraceForInterrupted()).start()


def install() -> None:
    """Make Fabric's subprocess launcher watch its ranks with ``GraceForInterrupted``."""
    compat.install_rank_watcher(launch_observer)
