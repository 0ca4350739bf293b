"""Checkpoints are keyed like records, by the whole result configuration, and a run prunes only its own
round folders (issue 38, item 1): a run of another config under the same run name used to checkpoint into
the same folder and delete the other's rounds."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import REPO, kill_after, max_state_diff, run_in_process

from bench.assembly.records import find_record
from bench.assembly.run_plan import checkpoint_plan

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

A = {"fed.rounds": 8, "checkpoint_every": 1, "experiment": "shared"}
B = {"fed.rounds": 2, "method.lr": 0.02, "checkpoint_every": 1, "experiment": "shared"}




def contents(folder) -> dict[str, bytes]:
    return {f"{r.name}/{f.name}": f.read_bytes() for r in sorted(folder.iterdir()) for f in sorted(r.iterdir())}


def test_another_config_of_the_run_name_leaves_the_checkpoints_alone(tiny_cfg, capsys):
    """The issue's sequence: A (8 rounds) killed after its 4th round; B (same run name, 2 rounds, lr 0.02)
    runs to the end with checkpoints; A resumes from its own round 4 and ends where an uninterrupted A ends."""
    _, full_state = run_in_process(tiny_cfg(**{**A, "experiment": "full"}))
    kill_after(tiny_cfg, 3, **A)
    folder_a = checkpoint_plan(tiny_cfg(**A)).folder
    before = contents(folder_a)
    assert sorted({k.split("/")[0] for k in before}) == ["round_00002", "round_00003"]

    run_in_process(tiny_cfg(**B))
    assert contents(folder_a) == before  # B neither deleted nor rewrote any of A's files
    folder_b = checkpoint_plan(tiny_cfg(**B)).folder
    assert folder_b != folder_a and folder_b.parent == folder_a.parent
    assert sorted(p.name for p in folder_b.iterdir()) == ["round_00000", "round_00001"]

    capsys.readouterr()
    record, _ = run_in_process(tiny_cfg(**A, resume=True))
    assert "Cannot resume" not in capsys.readouterr().err
    state = torch.load(find_record(tiny_cfg(**A)).with_suffix(".pt"))  # B holds the bare run name
    assert record["resumed"] == {"from_round": 3, "checkpoint": str(folder_a / "round_00003"), "skipped": []}
    assert record["config"]["method"]["lr"] == 0.05 and [h["round"] for h in record["history"]] == list(range(8))
    assert max_state_diff(full_state, state) == 0.0
    # A's resumed session pruned its own older rounds, never B's
    assert sorted(p.name for p in folder_a.iterdir()) == ["round_00006", "round_00007"]
    assert sorted(p.name for p in folder_b.iterdir()) == ["round_00000", "round_00001"]


def test_resume_after_a_finished_run_of_another_config_starts_over(tiny_cfg, capsys):
    """A sweep that always passes --resume true: the next lr is a new configuration with no checkpoint of its
    own; the finished run of the previous lr is neither resumed nor a reason to refuse."""
    run_in_process(tiny_cfg(**B))
    capsys.readouterr()
    record, _ = run_in_process(tiny_cfg(**{**B, "method.lr": 0.03}, resume=True))
    err = capsys.readouterr().err
    assert "--resume: no checkpoint under" in err and "starting from round 0" in err
    assert "resumed" not in record and record["config"]["method"]["lr"] == 0.03
    assert len({p.name for p in checkpoint_plan(tiny_cfg(**B)).folder.parent.iterdir()}) == 2


def test_a_checkpoint_in_the_folder_of_the_run_name_alone_is_resumed(tiny_cfg):
    """Checkpoints written before folders were keyed by identity (<run name>/round_*) of this very setup
    are still resumed."""
    kill_after(tiny_cfg, 0, **B)
    cfg = tiny_cfg(**B, resume=True)
    folder = checkpoint_plan(cfg).folder
    legacy = folder.parent / cfg.run_name()
    folder.rename(legacy)
    record, _ = run_in_process(cfg)
    assert record["resumed"]["from_round"] == 0 and record["resumed"]["checkpoint"] == str(legacy / "round_00000")
    assert [h["round"] for h in record["history"]] == [0, 1]
    assert sorted(p.name for p in legacy.iterdir()) == ["round_00000"]  # another folder: never pruned
    assert sorted(p.name for p in folder.iterdir()) == ["round_00001"]


@pytest.mark.ddp
def test_table_rows_that_differ_in_lr_keep_their_own_checkpoints_under_jobs(tmp_path):
    """Two rows of one method that differ only in method.lr have one run name; under --jobs 2 they ran at
    once in one checkpoint folder, each deleting the other's rounds."""
    ckpt = tmp_path / "ckpt"
    config = tmp_path / "lr.yaml"
    config.write_text(yaml.safe_dump({
        "table": "lr", "dataset": "digits",
        "base": {"data": {"name": "digits", "image_size": 16, "cache_dir": str(tmp_path / "cache")},
                 "partition": {"scheme": "dirichlet", "num_clients": 4, "args": {"min_size": 20}},
                 "fed": {"rounds": 3, "sample_ratio": 0.5, "batch_size": 32},
                 "method": {"backbone": "simple-cnn", "name": "fedavg"}, "threads": 1,
                 "checkpoint_every": 1, "checkpoint_dir": str(ckpt)},
        "betas": [0.5], "seeds": [0],
        "rows": [{"label": "lr 0.05", "method": {"lr": 0.05}}, {"label": "lr 0.02", "method": {"lr": 0.02}}]}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "bench.cli", "table", "--config", str(config), "--output-dir",
                           str(tmp_path / "runs"), "--tables-dir", str(tmp_path / "tables"), "--jobs", "2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    folders = sorted(p for p in ckpt.glob("*/*") if p.is_dir())
    assert len(folders) == 2
    lrs = set()
    for folder in folders:
        assert sorted(p.name for p in folder.iterdir()) == ["round_00001", "round_00002"]
        snap = torch.load(folder / "round_00002" / "global.pt", weights_only=True)
        lrs.add(snap["binding"]["config"]["method"]["lr"])
        assert [h["round"] for h in snap["history"]] == [0, 1, 2]
    assert lrs == {0.05, 0.02}
    records = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/*.json")]
    assert sorted(r["config"]["method"]["lr"] for r in records) == [0.02, 0.05]
