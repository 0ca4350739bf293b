"""bench/assembly/rank_observer.py: Fabric's watcher of the launched ranks leaves rank 0 time to end by itself when
the ranks were interrupted (status 130/143, or killed by SIGINT/SIGTERM), then ends it as interrupted (its
line and status, never a SIGKILL); any other failure SIGKILLs everything at once, as Fabric's own does.
"rank 0" here is a sleeping stand-in process, so that a SIGKILL can be observed. And bench/core/lifetime.py:
the interrupted line is printed once per process, and a Ctrl-C while the command still imports torch ends
it with that line and 130, not a traceback."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from bench.assembly import rank_observer
from bench.assembly.experiment import make_fabric
from bench.assembly.rank_observer import POLL_S, GraceForInterrupted
from bench.core import compat


def watcher(rank0_pid: int, children: list[subprocess.Popen], **kwargs):
    """Fabric's watcher (bench/core/compat.py) with the graceful verdict, as launch_observer starts it."""
    return compat.rank_watcher(rank0_pid, children, POLL_S, GraceForInterrupted(**kwargs))


def ended(code: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", f"import sys; sys.exit({code})"])
    proc.wait()
    return proc


@pytest.fixture
def rank0():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def killed_by(sig: int) -> subprocess.Popen:
    code = f"import os, signal; signal.signal({sig}, signal.SIG_DFL); os.kill(os.getpid(), {sig})"
    proc = subprocess.Popen([sys.executable, "-c", code])
    proc.wait()
    return proc


@pytest.mark.parametrize(("child", "status"), [(lambda: ended(130), 130), (lambda: ended(143), 143),
                                               (lambda: killed_by(signal.SIGINT), 130),
                                               (lambda: killed_by(signal.SIGTERM), 143)])
def test_interrupted_rank_leaves_rank0_its_grace_then_ends_it_as_interrupted(rank0, child, status, monkeypatch):
    ended_with = []
    observer = watcher(rank0.pid, [child()], end_interrupted=ended_with.append)
    assert observer.poll_once() is False and rank0.poll() is None  # within the grace: keep watching, rank 0 lives
    assert observer.poll_once() is False and rank0.poll() is None and not ended_with
    monkeypatch.setattr(rank_observer, "INTERRUPT_GRACE_S", 0.0)  # the grace is over: rank 0 ends as interrupted
    assert observer.poll_once() is True
    assert ended_with == [status] and rank0.poll() is None  # its own status and line, not Fabric's SIGKILL


def test_the_observer_polls_often_enough_for_a_prompt_exit():
    observer = watcher(os.getpid(), [])
    assert observer.sleep_period + rank_observer.INTERRUPT_GRACE_S <= 7  # an interrupted run ends within ~7 s


def test_a_failed_rank_kills_at_once(rank0):
    observer = watcher(rank0.pid, [ended(130), ended(1)])
    assert observer.poll_once() is True  # one rank failed otherwise: no grace, as Fabric's observer
    assert rank0.wait(timeout=10) == -9


def test_ranks_that_all_succeeded_end_the_watch(rank0):
    observer = watcher(rank0.pid, [ended(0), ended(0)])
    assert observer.poll_once() is True and rank0.poll() is None


def test_a_multi_rank_fabric_launches_the_graceful_observer(monkeypatch, tiny_cfg):
    from lightning.fabric.strategies.launchers import subprocess_script

    monkeypatch.setattr(subprocess_script, "_launch_process_observer", subprocess_script._launch_process_observer)
    make_fabric(tiny_cfg(devices=2))
    assert subprocess_script._launch_process_observer is rank_observer.launch_observer
    assert compat.rank_watcher_launcher() is rank_observer.launch_observer


def run_python(code: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          check=False, timeout=1800, **kwargs)


def test_exit_interrupted_says_its_line_once_and_exits_with_the_status():
    """The observer thread and the main thread may both get there: one line, the status, nothing else."""
    done = run_python("""
        import threading
        from bench.core import lifetime
        lifetime.say_interrupted("Ctrl-C")
        t = threading.Thread(target=lifetime.exit_interrupted, args=(143,))
        t.start(); t.join()
        print("not reached")
    """)
    assert done.returncode == 143 and "not reached" not in done.stdout
    assert done.stderr.count("fedbench: interrupted (Ctrl-C)") == 1 and done.stderr.count("interrupted") == 1


def test_exit_interrupted_says_nothing_on_a_rank_other_than_0():
    done = run_python("from bench.core import lifetime; lifetime.exit_interrupted(130)",
                      env={**os.environ, "LOCAL_RANK": "1", "RANK": "1"})
    assert done.returncode == 130 and done.stderr == ""


def test_ctrl_c_while_the_command_still_imports_is_one_line_and_130():
    """A rank Fabric started (or the command itself) gets Ctrl-C while importing torch: seen under load as a
    rank dying with -2 and an import traceback, then Fabric SIGKILLing rank 0 (status -9)."""
    done = run_python("""
        import os, signal, sys, threading
        sys.argv[0] = "fedbench"  # as the console script (and a rank Fabric re-executes) has it
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        import bench.cli  # torch, Lightning ...: seconds
        threading.Event().wait(30)  # (had the import been faster: still before main())
        print("not reached")
    """)
    assert done.returncode == 130, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and done.stderr.count("fedbench: interrupted (Ctrl-C)") == 1


def test_main_gives_ctrl_c_back_to_keyboard_interrupt():
    """After startup the command's own handling applies (workers stopped, finally blocks run)."""
    done = run_python("""
        import signal, sys
        sys.argv[0] = "fedbench"
        import bench.cli
        from bench.core import lifetime
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        lifetime.end_startup()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
