"""Fabric's watcher of the ranks it launched, with a grace period for ranks that were interrupted.

Fabric's subprocess launcher starts a thread in rank 0's process (``_ChildProcessObserver``) that polls
the other ranks every 5 s and, as soon as one has exited with a non-zero status, SIGKILLs every rank and
rank 0 itself, so that no rank hangs in a collective. Ctrl-C reaches the terminal's whole process group:
every rank stops with status 130 (143 for SIGTERM) and rank 0 is already ending by itself, with its one
line and its exit status. When the poll fell between rank 1's exit and rank 0's, the watcher SIGKILLed
rank 0: status -9 and Fabric's "Forcefully terminating all other processes to avoid zombies" instead of
130 (seen in `make test`: tests/test_process_lifetime.py's Ctrl-C test).

``GraceForInterrupted`` polls every ``POLL_S`` and treats ranks that ended interrupted (130 or 143 from
fedbench's handler, or killed by SIGINT/SIGTERM itself: -2, -15, e.g. while still importing) apart: rank 0
gets ``INTERRUPT_GRACE_S`` to end by itself; if it has not (its main thread blocked in a collective or a
rendezvous with a rank that is gone, where no Python handler runs: seen under load, 34 s), the observer
ends rank 0 as interrupted itself: the one line and the interrupted status, not a SIGKILL. Any other failing
status is handled at once, as Fabric does. ``install`` makes Fabric's launcher start it (Fabric has no
public option for its observer: the one private name patched is
``subprocess_script._launch_process_observer``, checked by tests/test_rank_observer.py).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable

from lightning.fabric.strategies.launchers import subprocess_script

from bench.core.lifetime import exit_interrupted

INTERRUPT_CODES = {130: 130, 143: 143, -signal.SIGINT: 130, -signal.SIGTERM: 143}  # a rank's status -> ours
INTERRUPT_GRACE_S = 5.0  # an interrupted rank 0 that can run Python ends in under a second
POLL_S = 1


class GraceForInterrupted(subprocess_script._ChildProcessObserver):
    """Fabric's observer, except that ranks which exited interrupted leave rank 0 time to end itself, after
    which ``end_interrupted(status)`` ends it (default: ``exit_interrupted``, in rank 0's own process)."""

    def __init__(self, main_pid: int, child_processes: list[subprocess.Popen], sleep_period: int = POLL_S,
                 end_interrupted: Callable[[int], None] = exit_interrupted) -> None:
        super().__init__(main_pid=main_pid, child_processes=child_processes, sleep_period=sleep_period)
        self.interrupted_at: float | None = None
        self.end_interrupted = end_interrupted

    def _run(self) -> bool:
        codes = [proc.poll() for proc in self._child_processes]
        failed = [code for code in codes if code]
        if failed and all(code in INTERRUPT_CODES for code in failed):
            self.interrupted_at = self.interrupted_at or time.monotonic()
            if time.monotonic() - self.interrupted_at < INTERRUPT_GRACE_S:
                return False  # rank 0 got the same signal: it ends by itself
            self.end_interrupted(max(INTERRUPT_CODES[code] for code in failed))
            return True
        return super()._run()


def launch_observer(child_processes: list[subprocess.Popen]) -> None:
    GraceForInterrupted(main_pid=os.getpid(), child_processes=child_processes).start()


def install() -> None:
    """Make Fabric's subprocess launcher watch its ranks with ``GraceForInterrupted``."""
    subprocess_script._launch_process_observer = launch_observer
