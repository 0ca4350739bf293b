"""What a table run prints (issue 39, item 6), read from one 2-rank table run (FedAvg and FedCB with the
packaged MiniLM, progress bars on): the plan once (rank 0), round bars that say which split each accuracy is
from (`val_acc=`, `test_acc=`; the bare `accuracy=` showed val, then test over it), no Lightning start-up
banner, no transformers "Loading weights" bar, and the reduced table filed under reduced/ by what was reduced."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def table_run(tmp_path_factory) -> tuple[str, Path]:
    """(stdout + stderr with bar updates as lines, the tables folder) of `fedbench table ... --seeds 0`."""
    tmp = tmp_path_factory.mktemp("noise")
    spec = {"table": "noise", "dataset": "digits", "betas": [0.5], "seeds": [0, 1], "metrics": ["accuracy"],
            "base": {"data": {"name": "digits", "cache_dir": str(tmp / "cache")},
                     "partition": {"num_clients": 4, "args": {"min_size": 10}}, "fed": {"rounds": 2},
                     "method": {"backbone": "simple-cnn"}, "threads": 1, "accelerator": "cpu", "devices": 2},
            "rows": [{"label": "FedAvg", "method": {"name": "fedavg"}},
                     {"label": "FedCB", "method": {"name": "fedcb", "args": {
                         "text_encoder": "minilm", "text_cache_dir": str(tmp / "text")}}}]}
    (tmp / "t.yaml").write_text(yaml.safe_dump(spec))
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    env |= {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "bench.cli", "table", "--config", str(tmp / "t.yaml"), "--seeds", "0",
                           "--output-dir", str(tmp / "runs"), "--tables-dir", str(tmp / "tables")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    out = (proc.stdout + proc.stderr).replace("\r", "\n")
    assert proc.returncode == 0, out[-3000:]
    return out, tmp / "tables"


def test_the_plan_is_printed_once(table_run):
    out, _ = table_run
    assert out.count("noise digits: 2 runs, 0 up to date, 2 to run") == 1  # rank 0; the rank Fabric starts is quiet


@pytest.mark.parametrize("noise", ["Initializing distributed", "distributed processes registered", "distributed_backend",
                                   "GPU available"])
def test_no_lightning_banner(table_run, noise):
    assert noise not in table_run[0]


def test_no_loading_weights_bar(table_run):
    assert "Loading weights" not in table_run[0]


def test_round_bars_name_the_split_of_each_accuracy(table_run):
    finished = [line for line in table_run[0].splitlines() if " rounds: 100%" in line]
    assert {line.split(" rounds")[0] for line in finished} == {"fedavg", "fedcb"}
    for line in finished:  # both accuracies of the round, each named by its split
        assert "val_acc=" in line and "test_acc=" in line and " accuracy=" not in line, line


def test_the_reduced_table_is_filed_by_what_was_reduced(table_run):
    out, tables = table_run
    md = tables / "reduced" / "noise_digits__seeds-0.md"
    assert md.is_file() and f"written: {md}," in out
    assert sorted(p.name for p in tables.iterdir()) == ["reduced"]  # nothing beside the full tables
