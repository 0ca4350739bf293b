"""The README's first command is the 1-minute run (issue 39, item 5): `make quick`, i.e. `fedbench run --config
configs/experiments/quick.yaml`, and it finishes, writing the record the README names. Measured on the 2-core
CI machine under load (user + sys of every process, the load-independent part): about 34 s of CPU."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import pytest
from conftest import REPO
from test_readme_commands import make_rule, readme_commands, words

pytestmark = pytest.mark.slow

QUICK = "configs/experiments/quick.yaml"
RECORD = "results/runs/quick/fedavg_digits_dir0.5_c4_s0.json"  # as the README names it


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_the_first_readme_command_is_the_quick_run_and_it_finishes(tmp_path):
    first = words(readme_commands(("README.md",))[0])
    assert first[:2] == ["make", "quick"] and "under a minute" in readme_commands(("README.md",))[0]
    call = next(line for line in make_rule("quick").splitlines() if "$(BIN)/fedbench" in line)
    assert call.split("$(BIN)/fedbench", 1)[1].split() == ["run", "--config", QUICK, "$(ARGS)"]
    assert f"`{RECORD}`" in (REPO / "README.md").read_text()

    env = {**os.environ, "PYTHONPATH": str(REPO), "FEDBENCH_CACHE": str(tmp_path / "cache"),  # nothing decoded yet
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}
    cpu, wall = children_cpu(), time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "bench.cli", "run", "--config", QUICK,
                           "--output_dir", str(tmp_path / "runs"), "--checkpoint_dir", str(tmp_path / "ckpt")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    cpu, wall = children_cpu() - cpu, time.perf_counter() - wall
    print(f"quick run: {wall:.1f} s wall, {cpu:.1f} s CPU (user + sys, all ranks)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = tmp_path / "runs" / RECORD.removeprefix("results/runs/")
    assert f"record: {record} (new)" in proc.stdout
    rec = json.loads(record.read_text())
    assert len(rec["history"]) == 3 and rec["config"]["partition"]["num_clients"] == 4
    assert rec["best"]["test/accuracy"] > 50  # it learns (10 classes: chance is 10%)
    # "under a minute" on a 2-core laptop: at most two core-minutes of CPU, whatever else the machine runs
    assert cpu < 120, f"the quick run took {cpu:.0f} s of CPU"
