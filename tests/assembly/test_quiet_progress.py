"""`--progress false` silences every bar, the libraries' too (issue 30): the text encoder's loading bar
(transformers' "Loading weights: 100%|...") was printed although fedbench's own bars were off; since issue 39
it is never printed."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO, digits_run_argv

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out


def fedcb_run(tmp_path, progress: str) -> subprocess.CompletedProcess:
    argv = [a if a != "false" else progress for a in digits_run_argv(tmp_path)]  # --progress <progress>
    argv += ["--method.name", "fedcb", "--fed.rounds", "1", "--devices", "1",
             "--method.args", f'{{"text_cache_dir": "{tmp_path / "text"}"}}']
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"} | {"PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "bench.cli", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=1800, check=False)


def test_progress_false_prints_no_bar_at_all(tmp_path):
    quiet = fedcb_run(tmp_path / "quiet", "false")
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert "%|" not in quiet.stderr + quiet.stdout  # no tqdm bar, fedbench's or a library's
    loud = fedcb_run(tmp_path / "loud", "true")  # the same run with bars: the run's own round bar shows,
    assert loud.returncode == 0 and "fedcb rounds: 100%|" in loud.stderr  # the encoder's loading bar never
    assert "Loading weights" not in loud.stderr  # (issue 39: a second of loading is not worth a bar)
