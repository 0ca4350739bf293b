"""`fedbench table --shard I/N` (issues 19 and 20): a table's runs split over machines or SLURM array tasks,
the table rendered once every run has a record, equal to the unsharded table."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bench.cli import main
from bench.scheduling.table_runner import distinct_runs, plan_runs, shard_runs
from bench.tables.table_spec import TableSpec

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out


def spec(tmp_path: Path) -> dict:
    return {"table": "shard", "dataset": "digits", "betas": [0.5], "seeds": [0, 1], "metrics": ["accuracy"],
            "base": {"data": {"name": "digits", "cache_dir": str(tmp_path / "cache")},
                     "partition": {"num_clients": 4, "args": {"min_size": 10}}, "fed": {"rounds": 2},
                     "method": {"backbone": "simple-cnn"}, "threads": 1, "accelerator": "cpu"},
            "rows": [{"label": "FedAvg", "method": {"name": "fedavg"}},
                     {"label": "FedProx", "method": {"name": "fedprox"}}]}


def command(tmp_path: Path, out: str, *extra: str) -> list[str]:
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec(tmp_path)))
    return ["table", "--config", str(path), "--output-dir", str(tmp_path / out / "runs"),
            "--tables-dir", str(tmp_path / out / "tables"), *extra]


def cells(folder: Path) -> dict:
    table = json.loads((folder / "shard_digits.json").read_text())
    return {(c["method"], c["metric"]): c["values"] for c in table["cells"]}


def test_shards_are_disjoint_and_cover_the_table(tmp_path):
    runs = distinct_runs(plan_runs(TableSpec.parse(spec(tmp_path), "t.yaml"), str(tmp_path / "runs"), check_records=False))
    for n in (1, 2, 3, 5):
        parts = [shard_runs(runs, (i, n)) for i in range(1, n + 1)]
        names = [r.cfg.run_name() for part in parts for r in part]
        assert sorted(names) == sorted(r.cfg.run_name() for r in runs) and len(set(names)) == len(runs) == 4
        assert max(map(len, parts)) - min(map(len, parts)) <= 1  # balanced by count


def test_two_shards_render_the_same_table_as_one_run(tmp_path, capsys):
    assert main(command(tmp_path, "whole")) == 0
    assert main(command(tmp_path, "sharded", "--shard", "1/2")) == 0
    out = capsys.readouterr().out
    assert "shard 1/2 done; the table waits for 2 of 4 runs" in out
    assert not (tmp_path / "sharded" / "tables").exists()  # nothing rendered from half the records
    assert len(list((tmp_path / "sharded" / "runs").rglob("*.json"))) == 2
    assert main(command(tmp_path, "sharded", "--shard", "2/2")) == 0
    assert len(list((tmp_path / "sharded" / "runs").rglob("*.json"))) == 4
    whole, sharded = cells(tmp_path / "whole" / "tables"), cells(tmp_path / "sharded" / "tables")
    assert sharded == whole and all(len(v) == 2 for v in whole.values())


@pytest.mark.parametrize(("shard", "message"), [
    ("0/2", "--shard 0/2: I must be between 1 and N"),
    ("3/2", "--shard 3/2: I must be between 1 and N"),
    ("a/b", "--shard must be I/N with whole numbers (e.g. --shard 1/4), got 'a/b'."),
])
def test_a_bad_shard_is_one_error_before_any_run(tmp_path, capsys, shard, message):
    assert main(command(tmp_path, "bad", "--shard", shard)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "bad").exists()
