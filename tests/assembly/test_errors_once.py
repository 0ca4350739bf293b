"""Issue 27: with --devices 2 every error is printed once, by rank 0, word for word: an error every rank
hits after the ranks started, and an error only one rank's client hit (the other ranks raise that same
error instead of pointing at the failing rank's output)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO, digits_run_argv

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

ONE_RANK_FAILS = '''
import sys
from bench.core.errors import FedbenchError
from bench.engine.federation import Federation

original = Federation.train_client

def train_client(self, c, r):
    if r == 1 and self.rank == 1:
        raise FedbenchError(f"The loss became NaN/inf in round {r}, client {c} (rank 1 only). Lower method.lr.")
    return original(self, c, r)

Federation.train_client = train_client
from bench.cli import main
sys.exit(main(sys.argv[1:]))
'''


def run(tmp_path, argv, script=None):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    head = [sys.executable, str(script)] if script else [sys.executable, "-m", "bench.cli"]
    return subprocess.run([*head, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False)


@pytest.mark.ddp
def test_an_error_every_rank_hits_after_start_is_printed_once(tmp_path):
    argv = [*digits_run_argv(tmp_path), "--devices", "2", "--accelerator", "cpu", "--method.name", "fedcb",
            "--method.args", '{"text_encoder": "bert-base-uncased"}']
    done = run(tmp_path, argv)
    assert done.returncode == 2
    assert done.stderr.count("fedbench: error: Unknown text encoder 'bert-base-uncased'") == 1, done.stderr[-2000:]


@pytest.mark.ddp
def test_an_error_of_one_ranks_client_is_printed_once_as_it_is(tmp_path):
    script = tmp_path / "one_rank_fails.py"
    script.write_text(ONE_RANK_FAILS)
    argv = [*digits_run_argv(tmp_path), "--devices", "2", "--accelerator", "cpu", "--fed.rounds", "3",
            "--partition.num_clients", "4"]
    done = run(tmp_path, argv, script)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("fedbench: error:")]
    assert len(errors) == 1, done.stderr[-3000:]
    assert "The loss became NaN/inf in round 1" in errors[0] and "(rank 1 only)" in errors[0]
    assert "see that rank's error" not in done.stderr and "Traceback" not in done.stderr
