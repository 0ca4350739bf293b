"""Process lifetime: nothing fedbench starts outlives the process that started it.

- ``die_with_parent``: a worker (a `fedbench table --jobs` worker, a DDP rank that Fabric launched)
  asks the kernel for SIGTERM when its parent dies, by any signal including SIGKILL
  (Linux ``PR_SET_PDEATHSIG``); elsewhere a daemon thread polls the parent pid once a second.
  ``die_with_ancestor``: the same for a worker forked by a forkserver that its ancestor started.
- ``wait_for_children``: the launching rank returns only after the ranks it started have exited, so
  that `time fedbench run --devices 2` counts them and a script's next command does not overlap them.
- ``say_interrupted`` / ``exit_interrupted``: the one line an interrupted fedbench prints, once per process
  whichever thread gets there first (the CLI's handler, or rank 0's observer of the ranks when rank 0's
  main thread is blocked in a collective), and the exit with the interrupted status.
- ``interrupt_during_startup``: Ctrl-C while the command is still importing torch and Lightning ends it
  with that line and status 130, not an import traceback (a rank started by Fabric is still importing for
  seconds on a busy machine when the user presses Ctrl-C).
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
INTERRUPT_STATUS = {"Ctrl-C": 130, "SIGTERM": 143}
INTERRUPTED_LINE = ("fedbench: interrupted ({what}): stopped every rank and worker. Finished runs kept their records; "
                    "an unfinished run wrote none (rerun it, or resume it with --resume true if it checkpointed).")
_SAID = threading.Lock()


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


def parent_of(pid: int) -> int | None:
    """The parent pid of process ``pid`` (Linux /proc), None when unknown (gone, or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # "pid (comm) state ppid ...": comm may hold spaces


def die_with_ancestor(ancestor: int, sig: int = signal.SIGTERM) -> str:
    """``die_with_parent`` for a process whose parent is ``ancestor`` or a process that ``ancestor`` started
    and that dies with it (the `fedbench table --jobs` forkserver, which asks for that itself:
    bench/scheduling/job_preload.py; multiprocessing alone keeps a forkserver alive while its children run).
    The signal comes when the parent exits; and at once when ``ancestor`` is already gone (the parent is
    then neither ``ancestor`` nor its child)."""
    parent = os.getppid()
    how = die_with_parent(sig, parent=parent)
    if parent != ancestor and parent_of(parent) != ancestor:
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


def first_process() -> bool:
    """Whether this process is the one the user started (not a rank that Fabric, torchrun or SLURM started):
    it alone says what a command is about to do."""
    return all(os.environ.get(key, "0") == "0" for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"))


def say_interrupted(what: str) -> None:
    """Print the interrupted line (``what``: "Ctrl-C" or "SIGTERM") once per process, and only on rank 0
    (one line for the whole run, not one per rank)."""
    if not _SAID.acquire(blocking=False):
        return  # said already (by another thread of this process)
    if os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("RANK", "0") == "0":
        print(INTERRUPTED_LINE.format(what=what), file=sys.stderr, flush=True)


def exit_interrupted(status: int) -> None:
    """End this process now as interrupted: its one line, then ``os._exit(status)`` (no cleanup: for a
    process whose main thread cannot run Python, blocked in a collective or still importing)."""
    say_interrupted("SIGTERM" if status == INTERRUPT_STATUS["SIGTERM"] else "Ctrl-C")
    sys.stderr.flush()
    os._exit(status)


def _interrupted_at_startup(signum, frame) -> None:
    exit_interrupted(INTERRUPT_STATUS["Ctrl-C"])


def interrupt_during_startup() -> None:
    """Until ``end_startup()``: SIGINT ends the process with its one line and 130 (nothing has started that
    needs cleaning up). Leaves an ignored SIGINT ignored; does nothing off the main thread."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted_at_startup)


def end_startup() -> None:
    """The command's own handling takes over: SIGINT raises KeyboardInterrupt again (if we had replaced it)."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is _interrupted_at_startup:
        signal.signal(signal.SIGINT, signal.default_int_handler)
