"""Starting the ranks (issue 38, item 4): a busy MASTER_PORT is one line naming it, and a rank whose
launcher is already gone exits at once."""
from __future__ import annotations

import datetime
import os
import re
import signal
import socket
import subprocess
import sys

import pytest
from conftest import REPO, digits_run_argv

from bench.assembly.ports import LAUNCHER_PID_ENV, PICKED_ENV, port_error, port_in_use, prepare_master_port

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out


@pytest.fixture
def busy_port():
    """A port another process holds: a socket listening on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


def cli(args: list[str], **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **env}
    for key in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS", PICKED_ENV):
        if key not in env:
            full.pop(key, None)
    return subprocess.run([sys.executable, "-m", "bench.cli", *args], cwd=REPO, env=full, capture_output=True,
                          text=True, timeout=1800, check=False)


def test_a_busy_master_port_the_user_set_is_one_line_naming_it(tmp_path, busy_port):
    """It used to start the ranks and end in torch's DistNetworkError (EADDRINUSE) traceback."""
    proc = cli([*digits_run_argv(tmp_path), "--devices", "2"], MASTER_PORT=str(busy_port))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "DistNetworkError" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("fedbench: error:")]
    match = re.fullmatch(rf"fedbench: error: MASTER_PORT={busy_port} is in use by another process, so the ranks "
                         r"cannot meet on it \(address already in use\)\. Set MASTER_PORT to a free port, e\.g\. "
                         r"MASTER_PORT=(\d+), or unset it to let fedbench pick one\.", line)
    assert match, line
    suggested = int(match.group(1))
    assert suggested != busy_port and not port_in_use(suggested)
    assert not (tmp_path / "runs").exists()  # refused before any work


def test_without_master_port_a_free_one_is_picked(monkeypatch, busy_port):
    monkeypatch.delenv("MASTER_PORT", raising=False)
    for key in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS", PICKED_ENV):
        monkeypatch.delenv(key, raising=False)
    port = prepare_master_port(1)
    assert os.environ["MASTER_PORT"] == os.environ[PICKED_ENV] == str(port) and not port_in_use(port)
    assert os.environ[LAUNCHER_PID_ENV] == str(os.getpid())
    # fedbench's own earlier choice, taken since by another process: another free port, no error
    monkeypatch.setenv("MASTER_PORT", str(busy_port))
    monkeypatch.setenv(PICKED_ENV, str(busy_port))
    again = prepare_master_port(1)
    assert again != busy_port and os.environ["MASTER_PORT"] == str(again) and not port_in_use(again)
    # a rank (LOCAL_RANK set) or another launcher's ranks never touch the port
    monkeypatch.setenv("MASTER_PORT", str(busy_port))
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert prepare_master_port(1) is None and os.environ["MASTER_PORT"] == str(busy_port)


def test_the_port_taken_while_the_ranks_start_is_one_line(monkeypatch, busy_port):
    """Between the check and rank 0's listen another process can take the port: torch's own error for it
    (a real DistNetworkError from TCPStore) becomes the same one line."""
    import torch.distributed as dist

    monkeypatch.delenv(PICKED_ENV, raising=False)
    with pytest.raises(Exception) as raised:
        dist.TCPStore("127.0.0.1", busy_port, is_master=True, timeout=datetime.timedelta(seconds=5))
    assert "EADDRINUSE" in str(raised.value)
    err = port_error(raised.value)
    assert str(err).startswith(f"MASTER_PORT={busy_port} is in use by another process")
    assert port_error(RuntimeError("connection refused")) is None


def test_a_rank_whose_launcher_is_already_gone_exits_at_once():
    """A rank got die_with_parent without the launcher's pid: one whose launcher died while it was still
    importing was re-parented and never got the signal (left running for 16 minutes in the issue)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    proc = cli(["list"], LOCAL_RANK="1", **{LAUNCHER_PID_ENV: str(gone.pid)})
    assert proc.returncode == -signal.SIGKILL and proc.stdout == ""
    # the launcher alive (this process, the rank's parent): the rank runs
    alive = cli(["list"], LOCAL_RANK="1", **{LAUNCHER_PID_ENV: str(os.getpid())})
    assert alive.returncode == 0 and "fedavg" in alive.stdout
