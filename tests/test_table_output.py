"""What a table run prints (issue 39, item 6): the plan once (rank 0), round bars that say which split each
accuracy is from (`val_acc=`, `test_acc=`; the bare `accuracy=` showed test over val), no Lightning start-up
banner and no transformers "Loading weights" bar; a reduced table is filed under reduced/ by what was reduced."""
from __future__ import annotations

import os
import subprocess
import sys

import yaml
from conftest import REPO


def test_a_two_rank_table_prints_its_plan_once_and_no_library_noise(tmp_path):
    spec = {"table": "noise", "dataset": "digits", "betas": [0.5], "seeds": [0, 1], "metrics": ["accuracy"],
            "base": {"data": {"name": "digits", "cache_dir": str(tmp_path / "cache")},
                     "partition": {"num_clients": 4, "min_size": 10}, "fed": {"rounds": 2},
                     "method": {"backbone": "simple-cnn"}, "threads": 1, "accelerator": "cpu", "devices": 2},
            "rows": [{"label": "FedAvg", "method": {"name": "fedavg"}},
                     {"label": "FedCB", "method": {"name": "fedcb", "args": {
                         "text_encoder": "minilm", "text_cache_dir": str(tmp_path / "text")}}}]}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(spec))
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    env |= {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "bench.cli", "table", "--config", str(tmp_path / "t.yaml"),
                           "--seeds", "0", "--output-dir", str(tmp_path / "runs"), "--tables-dir", str(tmp_path / "tables")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    out = (proc.stdout + proc.stderr).replace("\r", "\n")
    assert proc.returncode == 0, out[-3000:]
    assert out.count("noise digits: 2 runs, 0 up to date, 2 to run") == 1  # rank 0 only, the other rank stays quiet
    for noise in ("Initializing distributed", "distributed processes registered", "distributed_backend",
                  "GPU available", "Loading weights"):
        assert noise not in out, noise
    finished = [line for line in out.splitlines() if " rounds: 100%" in line]
    assert {line.split(" rounds")[0] for line in finished} == {"fedavg", "fedcb"}
    for line in finished:  # both accuracies, each named by its split
        assert "val_acc=" in line and "test_acc=" in line and " accuracy=" not in line, line
    md = tmp_path / "tables" / "reduced" / "noise_digits__seeds-0.md"
    assert md.is_file() and f"written: {md}," in out
    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == ["reduced"]  # nothing beside the full tables
