"""`fedbench table` checks every planned run before the first one starts (issue 14, item 7), and a
run whose model collapsed is marked in the rendered table."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench.cli import main


def table(tmp_path: Path, rows: list[dict], name: str = "t.yaml") -> list[str]:
    spec = {"table": "checks", "dataset": "digits", "betas": [0.5], "seeds": [0], "metrics": ["accuracy"],
            "base": {"data": {"name": "digits", "cache_dir": str(tmp_path / "cache")},
                     "partition": {"num_clients": 4, "args": {"min_size": 10}}, "fed": {"rounds": 2},
                     "method": {"backbone": "simple-cnn"}, "threads": 1, "accelerator": "cpu"},
            "rows": rows}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return ["table", "--config", str(path), "--output-dir", str(tmp_path / "runs"),
            "--tables-dir", str(tmp_path / "tables")]


def files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


GOOD = [{"label": "FedAvg", "method": {"name": "fedavg"}}, {"label": "FedProx", "method": {"name": "fedprox"}}]


@pytest.mark.parametrize(("last_row", "message"), [
    ({"label": "Bad", "method": {"name": "fedprox", "args": {"mu": "0.01"}}},
     "Table checks_digits, row 'Bad' (beta 0.5, seed 0): method.args.mu of 'fedprox' must be float, got '0.01' (str)."),
    ({"label": "Bad", "method": {"name": "fedprox", "args": {"muu": 0.01}}},
     "row 'Bad' (beta 0.5, seed 0): method.args for 'fedprox' has unknown option(s) ['muu']"),
    ({"label": "Bad", "method": {"name": "fedavg"}, "fed": {"rounds": "3"}},
     "row 'Bad' (beta 0.5, seed 0): fed.rounds must be int, got '3' (str)."),
    ({"label": "Bad", "method": {"name": "fedavg"}, "fed": {"lr_decay": -1}},
     "row 'Bad' (beta 0.5, seed 0): fed.lr_decay must be in (0, 1]"),
    ({"label": "Bad", "method": {"name": "fedavg"}, "data": {"name": "fashion-mnist", "root": "/nonexistent/fm"}},
     "Dataset 'fashion-mnist' not found at '/nonexistent/fm'"),
    ({"label": "Bad", "method": {"name": "fedavg"},
      "partition": {"scheme": "shards", "args": {"shard_mode": "per_class", "shards_per_client": 2}}},
     ("row 'Bad' (beta 0.5, seed 0): shards (per_class): 4 clients x 2 shards = 8 shards do not divide evenly "
      "over the 10 classes")),
], ids=["arg-type", "arg-typo", "yaml-type", "range", "missing-data", "per-class-shards"])
def test_a_bad_last_row_stops_the_table_before_any_run(tmp_path, capsys, last_row, message):
    code = main(table(tmp_path, [*GOOD, last_row]))
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and "Traceback" not in err
    assert files(tmp_path / "runs") == [] and files(tmp_path / "tables") == []


def test_collapsed_run_is_marked_in_the_table(tmp_path, capsys):
    rows = [{"label": "FedProx", "method": {"name": "fedprox"}},
            {"label": "Adam-1e6", "method": {"name": "fedavg", "optimizer": "adam", "lr": 1.0e6}}]
    assert main(table(tmp_path, rows)) == 0
    md = (tmp_path / "tables" / "checks_digits.md").read_text()
    lines = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ")}
    assert "⚠" in lines["Adam-1e6"] and "⚠" not in lines["FedProx"]
    assert "- Adam-1e6 β=0.5: seed 0: the global model predicts a single class for every test image" in md


def test_an_average_over_a_warned_run_is_marked_for_that_seed_only():
    """A derived column (``average``, main's columns) averages the row's runs per seed: the seed whose
    run carries a warning marks the average too; a row with clean runs stays unmarked."""
    from bench.assembly.config import RunConfig
    from bench.reporting.tables import collect, fmt
    from bench.scheduling.table_runner import PlannedRun
    from bench.tables.columns import parse_column
    from bench.tables.protocols import RowProtocol
    from bench.tables.table_spec import TableSpec

    columns = [parse_column(c) for c in ("dirichlet-0.5", "iid", "average")]
    runs = [PlannedRun(label, None, seed, RunConfig(), [col]) for label in ("A", "B") for col in ("dirichlet-0.5", "iid")
            for seed in (0, 1)]
    warned = {("A", "dirichlet-0.5", 1)}

    def record(run: PlannedRun) -> dict:
        acc = {"dirichlet-0.5": 60.0, "iid": 80.0}[run.columns[0]] + run.seed
        return {"history": [{"round": 0, "metrics": {"test/accuracy": acc}}],
                "warnings": ["collapsed"] if (run.label, run.columns[0], run.seed) in warned else []}

    records = {id(r): record(r) for r in runs}
    protocols = {label: RowProtocol("global", "final", "fedavg") for label in ("A", "B")}
    cells = collect(TableSpec("t", "d", (0, 1), (), {}, metrics=("accuracy",)), runs, records, columns, protocols)
    assert cells[("A", "dirichlet-0.5", "accuracy")]["warnings"] == ["seed 1: collapsed"]
    assert not cells[("A", "iid", "accuracy")].get("warnings")
    average = cells[("A", "average", "accuracy")]
    assert average["values"] == [70.0, 71.0] and average["warnings"] == ["seed 1: collapsed"]
    assert fmt(average).endswith(" ⚠") and not fmt(cells[("B", "average", "accuracy")]).endswith("⚠")


@pytest.mark.parametrize(("sets", "message"), [
    (["fed.rounds=0"], "Table checks_digits: --set fed.rounds=0: fed.rounds must be >= 1, got 0."),
    (["data.image_size=4"], "--set data.image_size=4: data.image_size must be >= 8"),
    (["fed.lr_decay=-1"], "--set fed.lr_decay=-1.0: fed.lr_decay must be in (0, 1]"),
    (["method.args.mu=abc"], "--set method.args.mu=\"abc\": method.args.mu of 'fedprox' must be float, got 'abc'"),
    (["fed.rounds=two"], "--set fed.rounds: expected int, got 'two'."),
    (["data.root=/nonexistent/digits-home", "data.name=fashion-mnist"],
     "Dataset 'fashion-mnist' not found at '/nonexistent/digits-home'"),
], ids=["rounds", "image-size", "lr-decay", "method-arg-type", "type", "missing-data"])
def test_a_bad_override_stops_the_table_before_any_run(tmp_path, capsys, sets, message):
    """`--set` values go through the same option validation as the config's own (bench/assembly/validation.py):
    one error naming the --set, before the first run, nothing written."""
    argv = table(tmp_path, GOOD)
    for item in sets:
        argv += ["--set", item]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and "Traceback" not in err and err.count("fedbench: error:") == 1
    assert files(tmp_path / "runs") == [] and files(tmp_path / "tables") == []
