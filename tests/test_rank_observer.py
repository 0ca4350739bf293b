"""bench/rank_observer.py: Fabric's watcher of the launched ranks leaves rank 0 time to end by itself when
the ranks were interrupted (status 130/143), and SIGKILLs everything at once for any other failure, as
Fabric's own does. "rank 0" here is a sleeping stand-in process, so that the SIGKILL can be observed."""
from __future__ import annotations

import subprocess
import sys

import pytest

from bench import rank_observer
from bench.experiment import make_fabric
from bench.rank_observer import GraceForInterrupted


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


@pytest.mark.parametrize("code", [130, 143])
def test_interrupted_rank_leaves_rank0_its_grace_then_fabrics_rule(rank0, code, monkeypatch):
    child = ended(code)
    observer = GraceForInterrupted(main_pid=rank0.pid, child_processes=[child])
    assert observer._run() is False and rank0.poll() is None  # within the grace: keep watching, rank 0 lives
    assert observer._run() is False and rank0.poll() is None
    monkeypatch.setattr(rank_observer, "INTERRUPT_GRACE_S", 0.0)  # the grace is over: rank 0 is SIGKILLed
    assert observer._run() is True
    assert rank0.wait(timeout=10) == -9


def test_a_failed_rank_kills_at_once(rank0):
    observer = GraceForInterrupted(main_pid=rank0.pid, child_processes=[ended(130), ended(1)])
    assert observer._run() is True  # one rank failed otherwise: no grace, as Fabric's observer
    assert rank0.wait(timeout=10) == -9


def test_ranks_that_all_succeeded_end_the_watch(rank0):
    observer = GraceForInterrupted(main_pid=rank0.pid, child_processes=[ended(0), ended(0)])
    assert observer._run() is True and rank0.poll() is None


def test_a_multi_rank_fabric_launches_the_graceful_observer(monkeypatch, tiny_cfg):
    from lightning.fabric.strategies.launchers import subprocess_script

    monkeypatch.setattr(subprocess_script, "_launch_process_observer", subprocess_script._launch_process_observer)
    make_fabric(tiny_cfg(devices=2))
    assert subprocess_script._launch_process_observer is rank_observer.launch_observer
