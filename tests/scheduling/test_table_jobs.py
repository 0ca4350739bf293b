"""`fedbench table --jobs N` (bench/scheduling/table_jobs.py, issue 19): independent runs in N worker
processes give the records one process gives (also when they start in another order: longest first,
issue 42), and a failing run stops the table with its name."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import REPO

from bench.scheduling.table_jobs import longest_first
from bench.scheduling.table_runner import distinct_runs, planned_table

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out


def spec(cache: str, rows: list[dict]) -> dict:
    return {"table": "jobs", "dataset": "digits",
            "base": {"data": {"name": "digits", "image_size": 16, "cache_dir": cache},
                     "partition": {"scheme": "dirichlet", "num_clients": 4, "args": {"min_size": 20}},
                     "fed": {"rounds": 2, "sample_ratio": 0.5, "batch_size": 32},
                     "method": {"backbone": "simple-cnn", "lr": 0.05}, "save_final_state": True, "threads": 1},
            "betas": [0.5], "seeds": [0, 1], "rows": rows}


def table(config, out, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "bench.cli", "table", "--config", str(config), "--output-dir",
                           str(out / "runs"), "--tables-dir", str(out / "tables"), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False)


@pytest.mark.ddp
def test_jobs_give_the_records_of_one_process(tmp_path):
    config = tmp_path / "jobs.yaml"
    rows = [{"label": "FedAvg", "method": {"name": "fedavg"}},
            {"label": "FedProx", "method": {"name": "fedprox"}, "fed": {"local_epochs": 2}}]
    config.write_text(yaml.safe_dump(spec(str(tmp_path / "cache"), rows)))
    # the jobs start the twice longer FedProx runs first, one process runs the plan's order: the same records
    runs = distinct_runs(planned_table(str(config))[3])
    assert [r.label for r in longest_first(runs)] == ["FedProx", "FedProx", "FedAvg", "FedAvg"]
    assert [r.label for r in runs] == ["FedAvg", "FedAvg", "FedProx", "FedProx"]
    serial, parallel = tmp_path / "serial", tmp_path / "parallel"
    for out, args in ((serial, ["--devices", "1"]), (parallel, ["--jobs", "2"])):
        proc = table(config, out, *args)
        assert proc.returncode == 0, proc.stderr[-4000:]
    names = sorted(p.name for p in (serial / "runs" / "jobs_digits").glob("*.json"))
    assert len(names) == 4 and names == sorted(p.name for p in (parallel / "runs" / "jobs_digits").glob("*.json"))
    for name in names:
        a, b = (json.loads((d / "runs" / "jobs_digits" / name).read_text()) for d in (serial, parallel))
        assert a["history"][-1]["metrics"] == b["history"][-1]["metrics"] and a["best"] == b["best"]
        sa, sb = (torch.load((d / "runs" / "jobs_digits" / name).with_suffix(".pt")) for d in (serial, parallel))
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
        # each job ran alone on one rank with the table's one thread, with fedbench's allocator policy
        assert (b["execution"]["ranks"], b["execution"]["threads_per_rank"]) == (1, 1)
        assert b["execution"]["allocator"]["policy"] in ("mallopt", "system")
        assert b["execution"]["allocator"]["policy"] == a["execution"]["allocator"]["policy"]
    assert (parallel / "tables" / "jobs_digits.md").exists()


@pytest.mark.ddp
def test_a_failing_job_stops_the_table_naming_the_run(tmp_path):
    config = tmp_path / "jobs.yaml"
    rows = [{"label": "Diverges", "method": {"name": "fedavg", "lr": 1.0e+6}}]
    config.write_text(yaml.safe_dump(spec(str(tmp_path / "cache"), rows)))
    proc = table(config, tmp_path, "--jobs", "2")
    assert proc.returncode == 2
    assert "row 'Diverges' (beta 0.5, seed" in proc.stderr and "NaN" in proc.stderr, proc.stderr[-3000:]
    assert not list((tmp_path / "runs" / "jobs_digits").glob("*.json"))


@pytest.mark.ddp
def test_jobs_records_carry_the_tables_overrides(tmp_path):
    """A --set run made by a job worker is recorded like one made in the table's process: in the
    __set-<hash> experiment, with its overrides in the record."""
    config = tmp_path / "jobs.yaml"
    config.write_text(yaml.safe_dump(spec(str(tmp_path / "cache"), [{"label": "FedAvg", "method": {"name": "fedavg"}}])))
    proc = table(config, tmp_path, "--jobs", "2", "--set", "fed.rounds=1")
    assert proc.returncode == 0, proc.stderr[-4000:]
    (folder,) = (tmp_path / "runs").glob("jobs_digits__set-*")
    records = [json.loads(p.read_text()) for p in folder.glob("*.json")]
    assert len(records) == 2  # two seeds
    for record in records:
        assert record["overrides"] == {"fed.rounds": 1} and len(record["history"]) == 1
