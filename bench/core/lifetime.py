"""Process lifetime: nothing fedbench starts outlives the process that started it.

- ``die_with_parent``: a worker (a `fedbench table --jobs` worker, a DDP rank that Fabric launched)
  asks the kernel for SIGTERM when its parent dies, by any signal including SIGKILL
  (Linux ``PR_SET_PDEATHSIG``); elsewhere a daemon thread polls the parent pid once a second.
- ``wait_for_children``: the launching rank returns only after the ranks it started have exited, so
  that `time fedbench run --devices 2` counts them and a script's next command does not overlap them.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

PR_SET_PDEATHSIG = 1


class Interrupted(BaseException):
    """SIGTERM, raised in the main thread by ``terminate_on_sigterm``'s handler so that `finally`
    blocks and worker cleanup run (Python's default for SIGTERM is to die on the spot)."""


def terminate_on_sigterm():
    """SIGTERM raises Interrupted in the main thread (the CLI ends with one line, workers stopped).
    Returns the handler it replaced (None when not on the main thread, where no handler can be set)."""
    def handler(signum, frame):
        raise Interrupted(f"signal {signum}")

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, handler)


def die_with_parent(sig: int = signal.SIGTERM, parent: int | None = None) -> str:
    """Make this process receive ``sig`` when its parent exits; returns how ("prctl" or "poll").
    ``parent``: the pid the parent had (passed down by it): a parent that died before this call is
    noticed too (otherwise: the parent at the time of the call)."""
    parent = os.getppid() if parent is None else parent
    how = "poll"
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0:
                how = "prctl"
        except (OSError, AttributeError):
            pass
    if how == "poll":
        threading.Thread(target=_poll_parent, args=(parent, sig), daemon=True, name="fedbench-parent-watch").start()
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), sig)
    return how


def _poll_parent(parent: int, sig: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), sig)


def wait_for_children(procs: list[subprocess.Popen], timeout: float = 120.0) -> list[int | None]:
    """Wait for ``procs`` to exit (each at most ``timeout`` seconds; one still running then is
    terminated); their return codes."""
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            proc.terminate()
            codes.append(None)
    return codes


def launched_by_fabric() -> bool:
    """Whether this process is a rank > 0 that Fabric's subprocess launcher started (its parent is rank 0's
    process), not one started by torchrun or SLURM (whose agents manage their ranks)."""
    if os.environ.get("LOCAL_RANK", "0") == "0" or "TORCHELASTIC_RUN_ID" in os.environ:
        return False
    return "SLURM_JOB_ID" not in os.environ or "SLURM_NTASKS" not in os.environ
