"""Issue 27, part 2: nothing left running. A `fedbench table --jobs 2` whose parent is killed (SIGKILL,
SIGTERM) leaves no worker behind; SIGTERM and Ctrl-C end with one line and no traceback; `fedbench run
--devices 2` returns only after its other rank has exited. Processes are found by a marker in their
environment (inherited by every process fedbench starts)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from bench.assembly.rank_observer import INTERRUPT_GRACE_S
from bench.core.lifetime import die_with_parent, launched_by_fabric, parent_of

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out


def tagged(tag: str) -> list[int]:
    """Pids of the live processes whose environment holds FEDBENCH_TEST_TAG=tag."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"FEDBENCH_TEST_TAG={tag}".encode() in env.split(b"\0") and state != "Z":
            out.append(int(proc.name))
    return out


def wait_until(condition, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def start_table(tmp_path: Path, tag: str) -> subprocess.Popen:
    """`fedbench table --jobs 2` over 4 digits runs of 200 rounds (long enough to be killed mid-run)."""
    spec = {"table": "lifetime", "dataset": "digits", "betas": [0.5], "seeds": [0, 1], "metrics": ["accuracy"],
            "base": {"data": {"name": "digits", "cache_dir": str(tmp_path / "cache")},
                     "partition": {"num_clients": 4, "args": {"min_size": 10}}, "fed": {"rounds": 200},
                     "method": {"backbone": "simple-cnn"}, "threads": 1, "accelerator": "cpu"},
            "rows": [{"label": "FedAvg", "method": {"name": "fedavg"}}, {"label": "FedProx", "method": {"name": "fedprox"}}]}
    config = tmp_path / "t.yaml"
    config.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "FEDBENCH_TEST_TAG": tag, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    # SIGINT as a shell gives a foreground command (the test process may ignore it, and an ignored SIGINT
    # is inherited: Python then installs no KeyboardInterrupt handler)
    return subprocess.Popen([sys.executable, "-m", "bench.cli", "table", "--config", str(config), "--jobs", "2",
                             "--output-dir", str(tmp_path / "runs"), "--tables-dir", str(tmp_path / "tables")],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # noqa: PLW1509


def forked_workers(tag: str, table: int) -> tuple[int | None, list[int]]:
    """(the table's forkserver, the processes it forked) among the tagged ones."""
    server = next((pid for pid in tagged(tag) if parent_of(pid) == table
                   and b"multiprocessing.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()), None)
    return server, [pid for pid in tagged(tag) if server is not None and parent_of(pid) == server]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_killing_the_table_parent_stops_every_worker(tmp_path, sig):
    tag = uuid.uuid4().hex
    parent = start_table(tmp_path, tag)
    try:
        # the parent, its forkserver (and multiprocessing's resource tracker) are up, the workers starting
        # (generous bounds: under a load average of 8 a process's imports take ~10x their quiet wall time)
        assert wait_until(lambda: len(tagged(tag)) >= 3, 600), parent.communicate(timeout=5)
        if sig == signal.SIGKILL:  # the 2 workers training: both forked by the table's preloaded forkserver
            assert wait_until(lambda: len(forked_workers(tag, parent.pid)[1]) == 2, 600), tagged(tag)
        time.sleep(2.0)
        os.kill(parent.pid, sig)
        _, err = parent.communicate(timeout=1800)
        # far below the 200 rounds' run time: the workers were ended, they did not finish
        assert wait_until(lambda: not tagged(tag), 30), f"left running: {tagged(tag)}"
    finally:
        for pid in tagged(tag):
            os.kill(pid, signal.SIGKILL)
    assert not list((tmp_path / "runs").rglob("*.tmp*"))  # no half-written record
    if sig != signal.SIGKILL:
        assert "Traceback" not in err
        what = "Ctrl-C" if sig == signal.SIGINT else "SIGTERM"
        assert err.count(f"fedbench: interrupted ({what})") == 1
        assert parent.returncode == (130 if sig == signal.SIGINT else 143)


def test_a_forked_worker_lives_while_its_ancestor_does_and_dies_at_once_without_it():
    """die_with_ancestor (a --jobs worker forked by the table's forkserver): a process whose parent's parent
    is the ancestor keeps running; one whose ancestor is already gone gets SIGTERM at once."""
    code = ("import sys, time\nfrom bench.core.lifetime import die_with_ancestor\n"
            "print(die_with_ancestor(int(sys.argv[1])), flush=True)\ntime.sleep(float(sys.argv[2]))\nprint('alive')")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    grandparent = parent_of(os.getpid())  # this test's parent: the ancestor of the child's parent (this process)
    lives = subprocess.run([sys.executable, "-c", code, str(grandparent), "0.5"], env=env, capture_output=True,
                           text=True, timeout=120, check=False)
    assert lives.returncode == 0 and lives.stdout.split() == ["prctl", "alive"], lives.stderr
    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone.kill()
    gone.wait()
    dies = subprocess.run([sys.executable, "-c", code, str(gone.pid), "60"], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert dies.returncode == -signal.SIGTERM and "alive" not in dies.stdout


def test_a_worker_dies_with_its_parent_even_on_sigkill(tmp_path):
    """die_with_parent in a grandchild: its parent killed with SIGKILL, it gets SIGTERM at once."""
    tag = uuid.uuid4().hex
    code = ("import os, subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'from bench.core.lifetime import die_with_parent; "
            "print(die_with_parent(), flush=True); import time; time.sleep(60)'])\n"
            "time.sleep(60)\n")
    env = {**os.environ, "FEDBENCH_TEST_TAG": tag, "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: len(tagged(tag)) == 2, 300)
        assert parent.stdout.readline().strip() == ("prctl" if sys.platform.startswith("linux") else "poll")
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=60)
        assert wait_until(lambda: not tagged(tag), 30)  # the child would sleep 60 s
    finally:
        for pid in tagged(tag):
            os.kill(pid, signal.SIGKILL)
    assert callable(die_with_parent)


def test_only_ranks_fabric_started_are_tied_to_their_parent(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert not launched_by_fabric()  # rank 0 is the launcher itself
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert launched_by_fabric()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")  # torchrun's agent manages its ranks
    assert not launched_by_fabric()


@pytest.mark.ddp
def test_run_on_two_ranks_returns_after_both_have_exited(tmp_path):
    tag = uuid.uuid4().hex
    env = {**os.environ, "FEDBENCH_TEST_TAG": tag, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    argv = ["run", "--data.name", "digits", "--data.cache_dir", str(tmp_path / "cache"), "--method.backbone",
            "simple-cnn", "--fed.rounds", "2", "--partition.num_clients", "4", "--output_dir", str(tmp_path / "runs"),
            "--checkpoint_dir", str(tmp_path / "ckpt"), "--threads", "1", "--progress", "false", "--devices", "2",
            "--accelerator", "cpu"]
    done = subprocess.run([sys.executable, "-m", "bench.cli", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=1800, check=False)
    assert done.returncode == 0, done.stderr
    assert tagged(tag) == []  # rank 1 had exited when the command returned
    assert done.stdout.count("record: ") == 1  # the result and record lines once, from rank 0


@pytest.mark.ddp
def test_ctrl_c_of_a_two_rank_run_ends_both_ranks_with_one_line(tmp_path):
    """Ctrl-C reaches the terminal's whole process group (here: killpg SIGINT): rc 130 within seconds,
    one short message and no traceback, no rank left."""
    tag = uuid.uuid4().hex
    argv = ["run", "--data.name", "digits", "--data.cache_dir", str(tmp_path / "cache"), "--method.backbone",
            "simple-cnn", "--fed.rounds", "500", "--partition.num_clients", "4", "--output_dir", str(tmp_path / "runs"),
            "--checkpoint_dir", str(tmp_path / "ckpt"), "--threads", "1", "--progress", "false", "--devices", "2",
            "--accelerator", "cpu"]
    env = {**os.environ, "FEDBENCH_TEST_TAG": tag, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "bench.cli", *argv], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # noqa: PLW1509 (a shell would do it)
    try:
        launched = time.monotonic()
        assert wait_until(lambda: len(tagged(tag)) == 2, 600)  # both ranks up
        up = time.monotonic() - launched  # rank 0's imports and launch: the same load as the exit sees
        time.sleep(6.0)  # into the rounds
        os.killpg(proc.pid, signal.SIGINT)
        start = time.monotonic()
        _, err = proc.communicate(timeout=1800)
        ended = time.monotonic() - start
        # a ratio, not a wall-clock limit: the exit takes a fraction of the start-up under any load; an
        # exit that waits out the observer's grace for rank 0 (30 s when this test flaked at 34 s) takes
        # more than the start-up plus that grace
        assert ended < up + INTERRUPT_GRACE_S, (ended, up)
        assert wait_until(lambda: not tagged(tag), 60)
    finally:
        for pid in tagged(tag):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-2000:]
    assert err.count("fedbench: interrupted (Ctrl-C)") == 1 and "Traceback" not in err
    assert not list((tmp_path / "runs").rglob("*.json"))
