"""A stalled rank does not hang the run: the other rank gives up after --timeout with a message
naming itself, the round, the collective (issue 14, item 5) and the rank that did not arrive (issue 27)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, cli_args

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

# seconds rank 1 stalls inside round 1: far above the 3 s timeout so that, under any load, giving up at the
# timeout and waiting for rank 1 stay apart (rank 1 ends with rank 0, so the stall costs no wall time)
SLEEP = 40.0
TIMEOUT_MINUTES = 0.05  # 3 s

STALLING_RUN = '''
import sys, time
from pathlib import Path
from lightning.fabric import Fabric
from bench.engine.federation import Federation

marks, sleep = Path(sys.argv[1]), float(sys.argv[2])
original, all_reduce = Federation.run_round, Fabric.all_reduce

def arrive(self, *args, **kwargs):  # rank 0: when it last started waiting at a collective
    if self.global_rank == 0:
        (marks / "rank0_waits").write_text(repr(time.time()))
    return all_reduce(self, *args, **kwargs)

def run_round(self, r):
    if r == 1 and self.rank == 1:
        (marks / "sleeping").write_text(repr(time.time()))
        time.sleep(sleep)
        (marks / "woke").write_text(repr(time.time()))
    return original(self, r)

Federation.run_round, Fabric.all_reduce = run_round, arrive
from bench.cli import main
code = main(sys.argv[3:])
if int(__import__("os").environ.get("LOCAL_RANK", "0")) == 0:
    (marks / "rank0_done").write_text(repr(time.time()))
sys.exit(code)
'''


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.ddp
def test_stalled_rank_ends_the_run_within_the_timeout(tiny_cfg, tmp_path):
    script = tmp_path / "stalling_run.py"
    script.write_text(STALLING_RUN)
    cfg = tiny_cfg(devices=2, **{"fed.rounds": 3})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    log = tmp_path / "stderr.txt"
    with open(log, "w") as err, open(tmp_path / "stdout.txt", "w") as out:
        proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(SLEEP), "run", *cli_args(cfg),
                                 "--timeout", str(TIMEOUT_MINUTES)],
                                cwd=REPO, env=env, stdout=out, stderr=err, start_new_session=True)
    try:
        code = proc.wait(timeout=1800)
        stalled_at = float((tmp_path / "sleeping").read_text())
        waited = float((tmp_path / "rank0_done").read_text()) - float((tmp_path / "rank0_waits").read_text())
        gave_up = float((tmp_path / "rank0_done").read_text()) - stalled_at
        woke = (tmp_path / "woke").exists()
        # rank 1 ends by itself once it wakes and finds rank 0 gone
        deadline = time.time() + SLEEP + 120
        while group_alive(proc.pid) and time.time() < deadline:
            time.sleep(0.5)
        rank1_ended = not group_alive(proc.pid)
    finally:
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert code == 2, text[-3000:]
    assert not woke and gave_up < SLEEP, f"rank 0 gave up {gave_up:.1f} s after rank 1 stalled ({SLEEP} s)"
    # at least the timeout; at most the timeout plus a generous 15 s for the error path under load (was 3 s)
    assert 60 * TIMEOUT_MINUTES - 0.5 < waited < 60 * TIMEOUT_MINUTES + 15.0, f"rank 0 waited {waited:.1f} s"
    assert ("fedbench: error: Rank 0 of 2 gave up waiting for the round's aggregation all-reduce in round 1: "
            "no answer within 0.05 min (--timeout): rank 1 did not arrive (stalled or died).") in text, text[-3000:]
    assert rank1_ended
    # issue 27: the stalled rank is named by the one that waited, and the error is printed once: rank 1,
    # started by rank 0's process, ends with it (bench/core/lifetime.py) instead of printing its own
    assert text.count("fedbench: error:") == 1 and "Rank 1 of 2 gave up" not in text
    assert "Traceback" not in text
    assert not list((tmp_path / "runs").rglob("*.json"))  # no record of a run that did not finish
