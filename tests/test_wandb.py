"""W&B (offline): a table's runs are grouped by the table and tagged; config, per-round metrics and a
final summary are logged; the rendered table is logged as a wandb.Table in a run with job_type "table".

The offline run files are read directly: ``run-<id>.wandb`` is a LevelDB-style log of protobuf
``Record`` messages (wandb.proto), and logged tables are written to ``files/media/table/*.table.json``.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from bench.cli import main
from bench.reporting.wandb_logger import TABLE_COLUMNS

BLOCK, HEADER = 32768, 7  # the log's block size and record header (crc32, length, type)


def wandb_records(path: Path) -> list:
    """The protobuf records of an offline run file."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"not a W&B run file: {path}"
    pos, pending, out = HEADER, b"", []
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # block trailer padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        pending += data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (1, 4):  # a FULL record, or the LAST piece of one
            rec = pb.Record()
            rec.ParseFromString(pending)
            out.append(rec)
            pending = b""
        elif kind == 0:
            pending = b""
    return out


def offline_run(run_dir: Path) -> dict:
    """group, job type, name, tags, config keys, logged history keys and summary keys of a run."""
    recs = wandb_records(next(run_dir.glob("run-*.wandb")))
    run = next(r.run for r in recs if r.WhichOneof("record_type") == "run")
    key = lambda u: u.key or "/".join(u.nested_key)
    history = [{key(i): json.loads(i.value_json) for i in r.history.item}
               for r in recs if r.WhichOneof("record_type") == "history"]
    summary = {key(u) for r in recs if r.WhichOneof("record_type") == "summary" for u in r.summary.update}
    metrics = {(m.name or m.glob_name): (m.step_metric or None) for r in recs
               if r.WhichOneof("record_type") == "metric" for m in [r.metric]}
    return {"group": run.run_group, "job_type": run.job_type, "name": run.display_name, "tags": set(run.tags),
            "config": {u.key: json.loads(u.value_json) for u in run.config.update}, "history": history,
            "summary": summary, "dir": run_dir, "metrics": metrics}


def test_table_runs_and_table_are_logged_offline(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    spec = {
        "table": "wbtest", "dataset": "digits", "betas": [0.5], "seeds": [0], "metrics": ["accuracy", "f1"],
        "base": {"data": {"name": "digits", "cache_dir": str(tmp_path / "cache")},
                 "partition": {"num_clients": 4, "min_size": 10},
                 "fed": {"rounds": 2, "batch_size": 32}, "method": {"backbone": "simple-cnn"}, "threads": 1},
        "rows": [{"label": "FedAvg", "method": {"name": "fedavg"}},
                 {"label": "FedProx", "method": {"name": "fedprox", "args": {"mu": 0.01}}}],
    }
    config = tmp_path / "wbtest.yaml"
    config.write_text(yaml.safe_dump(spec))
    wandb_dir, tables = tmp_path / "wandb", tmp_path / "tables"
    assert main(["table", "--config", str(config), "--output-dir", str(tmp_path / "runs"),
                 "--tables-dir", str(tables), "--wandb", "--wandb-dir", str(wandb_dir)]) == 0
    capsys.readouterr()

    runs = [offline_run(d) for d in sorted((wandb_dir / "wandb").glob("offline-run-*"))]
    assert len(runs) == 3
    assert {r["group"] for r in runs} == {"wbtest_digits"}
    train = {r["name"]: r for r in runs if r["job_type"] == "train"}
    # issue 32: a run is named as the table reads, and its config says which table row it fills
    assert set(train) == {"FedAvg · β=0.5 · seed 0", "FedProx · β=0.5 · seed 0"}
    fedavg, fedprox = train["FedAvg · β=0.5 · seed 0"], train["FedProx · β=0.5 · seed 0"]
    for run, row, method in ((fedavg, "FedAvg", "fedavg"), (fedprox, "FedProx", "fedprox")):
        assert {k: run["config"][k] for k in ("table", "row", "dataset", "partition_key", "beta", "seed",
                                                "protocol", "round_rule", "overridden")} == {
            "table": "wbtest", "row": row, "dataset": "digits", "partition_key": "dirichlet-0.5",
            "beta": 0.5, "seed": 0, "protocol": "global", "round_rule": "best-val-acc", "overridden": False}
        assert run["config"]["method"]["name"] == method
    assert fedavg["tags"] == {"fedavg", "digits", "dirichlet", "beta=0.5", "seed=0"}
    assert fedavg["config"]["method"]["name"] == "fedavg" and fedavg["config"]["fed"]["rounds"] == 2
    assert "code_version" in fedavg["config"]
    steps = [h["_step"] for h in fedavg["history"] if "test/accuracy" in h]
    assert steps == [0, 1]  # one history row per round
    assert {"best/test/accuracy", "final/test/accuracy", "best_round"} <= fedavg["summary"]

    (table_run,) = [r for r in runs if r["job_type"] == "table"]
    assert table_run["tags"] == {"table", "wbtest", "digits"}
    (logged,) = (table_run["dir"] / "files" / "media" / "table").glob("*.table.json")
    logged = json.loads(logged.read_text())
    assert logged["columns"] == TABLE_COLUMNS
    rendered = json.loads((tables / "wbtest_digits.json").read_text())["cells"]
    assert [row[:5] for row in logged["data"]] == [[c["method"], c["beta"], c["metric"], c["mean"], c["std"]]
                                                   for c in rendered]
    assert len(logged["data"]) == 4 and all(row[3] is not None and row[5] == 1 for row in logged["data"])
    # the paired difference to the baseline (FedAvg), as the markdown table prints it (one seed: no interval)
    paired = {(row[0], row[2]): dict(zip(TABLE_COLUMNS, row)) for row in logged["data"]}
    by_cell = {(c["method"], c["metric"]): c for c in rendered}
    for metric in ("accuracy", "f1"):
        assert paired[("FedAvg", metric)]["vs_baseline_note"] == "baseline"
        fedprox = paired[("FedProx", metric)]
        assert fedprox["vs_baseline"] == pytest.approx(by_cell[("FedProx", metric)]["mean"]
                                                       - by_cell[("FedAvg", metric)]["mean"])
        assert fedprox["vs_baseline_ci_low"] is None and fedprox["vs_baseline_note"] is None
    images = list((table_run["dir"] / "files" / "media" / "images").rglob("*.png"))
    assert len(images) == 2  # the curves and the partition heatmap


@pytest.mark.parametrize("scheme, tags", [("dirichlet", ["beta=0.1"]), ("iid", [])])
def test_run_tags(scheme, tags):
    from bench.config import RunConfig
    from bench.reporting.wandb_logger import run_tags

    cfg = RunConfig()
    cfg.partition.scheme, cfg.partition.beta, cfg.seed = scheme, 0.1, 2
    assert run_tags(cfg) == [cfg.method.name, cfg.data.name, scheme, *tags, "seed=2"]


def test_single_run_is_logged_offline(tmp_path, monkeypatch, capsys):
    """`fedbench run --wandb true`: the CLI passes the W&B observer; one train run with config, tags,
    one history row per round and the final summary (files under $WANDB_DIR)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    assert main(["run", "--data.name", "digits", "--data.cache_dir", str(tmp_path / "cache"),
                 "--method.backbone", "simple-cnn", "--fed.rounds", "2", "--partition.num_clients", "4",
                 "--output_dir", str(tmp_path / "runs"), "--checkpoint_dir", str(tmp_path / "ckpt"),
                 "--threads", "1", "--progress", "false", "--experiment", "wbrun", "--wandb", "true"]) == 0
    capsys.readouterr()
    (run,) = [offline_run(d) for d in (tmp_path / "wandb" / "wandb").glob("offline-run-*")]
    assert (run["group"], run["job_type"], run["name"]) == ("wbrun", "train", "fedavg · β=0.5 · seed 0")
    assert run["tags"] == {"fedavg", "digits", "dirichlet", "beta=0.5", "seed=0"}
    assert run["config"]["fed"]["rounds"] == 2 and "code_version" in run["config"]
    assert [h["_step"] for h in run["history"] if "test/accuracy" in h] == [0, 1]
    assert {"best/test/accuracy", "final/test/accuracy", "best_round", "protocol"} <= run["summary"]
    # issue 32: every round logged against "round", with lr, timings, clients and bytes; the summary holds
    # the metrics at the round the round rule reports (best validation accuracy for a single global run)
    rows = [h for h in run["history"] if "lr" in h]
    assert [h["round"] for h in rows] == [0, 1] and [h["_step"] for h in rows] == [0, 1]
    for h in rows:
        assert h["clients_trained"] == 4 and h["samples_trained"] > 0 and h["comm/bytes_up"] >= h["comm/bytes_down"] > 0
        assert h["time/round_seconds"] >= h["time/train_seconds"] > 0 and h["train/loss"] > 0
    assert {"test/accuracy", "val/accuracy", "reported_round", "round_rule"} <= run["summary"]
    assert run["config"]["row"] == "fedavg" and run["config"]["round_rule"] == "best-val-acc"
    # wandb's Fabric logger adds its own step key to every row (the round again): defined, hidden in the UI
    assert run["metrics"] == {"round": None, "*": "round", "trainer/global_step": None}
    assert [h["trainer/global_step"] for h in rows] == [0, 1]
    # issue 32.3: the rounds reach W&B through fabric.log_dict, which gives the CSV logger the same keys and values
    (csv_file,) = (tmp_path / "runs" / "wbrun" / "csv").glob("*/version_*/metrics.csv")
    with csv_file.open() as f:
        csv_rows = list(csv.DictReader(f))
    wandb_keys = set(rows[0]) - {"_step", "_runtime", "_timestamp", "trainer/global_step"}
    assert set(csv_rows[0]) == wandb_keys | {"step"}
    assert [int(r["step"]) for r in csv_rows] == [0, 1]
    for h, r in zip(rows, csv_rows):
        assert {k: float(r[k]) for k in wandb_keys} == pytest.approx({k: h[k] for k in wandb_keys})
