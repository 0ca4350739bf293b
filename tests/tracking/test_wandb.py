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
from bench.tracking.wandb_logger import TEXT_COLUMNS

pytestmark = pytest.mark.slow  # end-to-end (>= 6 s): make test-fast leaves this file out

BLOCK, HEADER = 32768, 7  # the log's block size and record header (crc32, length, type)


def wandb_records(path: Path) -> list:
    """The protobuf records of an offline run file, up to the first one not wholly written yet: wandb's service may
    be appending to the file while a test polls it (``settled``), and a piece read before its last bytes landed
    is the tail of a file still being written, not a record (reading it failed a suite once, 2026-11-29)."""
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
        if pos + HEADER + length > len(data):  # still being written
            break
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
    summary = {key(u): json.loads(u.value_json) for r in recs if r.WhichOneof("record_type") == "summary"
               for u in r.summary.update}
    metrics = {(m.name or m.glob_name): (m.step_metric or None) for r in recs
               if r.WhichOneof("record_type") == "metric" for m in [r.metric]}
    return {"id": run.run_id, "group": run.run_group, "job_type": run.job_type, "name": run.display_name,
            "tags": set(run.tags),
            "config": {u.key: json.loads(u.value_json) for u in run.config.update}, "history": history,
            "summary": set(summary), "summary_values": summary, "dir": run_dir, "metrics": metrics}


FEDPROX = {"FedProx μ=0.01": 0.01, "FedProx μ=0.1": 0.1}  # two rows of one method


@pytest.fixture(scope="module")
def wandb_table(tmp_path_factory):
    """A three-row table (FedAvg and FedProx at two mu values; digits, 3 clients, 2 rounds, 1 seed) run with
    --wandb offline: (config path, runs dir, tables dir, W&B dir)."""
    tmp = tmp_path_factory.mktemp("wbtable")
    spec = {
        "table": "wbtest", "dataset": "digits", "betas": [0.5], "seeds": [0], "metrics": ["accuracy", "f1"],
        "base": {"data": {"name": "digits", "cache_dir": str(tmp / "cache")},
                 "partition": {"num_clients": 3, "args": {"min_size": 10}},
                 "fed": {"rounds": 2, "batch_size": 32}, "method": {"backbone": "simple-cnn"}, "threads": 1},
        "rows": [{"label": "FedAvg", "method": {"name": "fedavg"}}]
        + [{"label": label, "method": {"name": "fedprox", "args": {"mu": mu}}} for label, mu in FEDPROX.items()],
    }
    config = tmp / "wbtest.yaml"
    config.write_text(yaml.safe_dump(spec, allow_unicode=True))
    paths = (config, tmp / "runs", tmp / "tables", tmp / "wandb")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        assert main(["table", "--config", str(config), "--output-dir", str(paths[1]), "--tables-dir", str(paths[2]),
                     "--wandb", "--wandb-dir", str(paths[3])]) == 0
    return paths


def train_runs(wandb_dir: Path) -> tuple[dict[str, dict], dict]:
    """({display name: train run}, the table run) of the offline runs under ``wandb_dir``."""
    runs = all_runs(wandb_dir)
    (table_run,) = [r for r in runs if r["job_type"] == "table"]
    assert len(runs) == 4 and {r["group"] for r in runs} == {"wbtest_digits"}
    return {r["name"]: r for r in runs if r["job_type"] == "train"}, table_run


def table_cells(tables: Path) -> dict[tuple[str, str], dict]:
    return {(c["method"], c["metric"]): c for c in json.loads((tables / "wbtest_digits.json").read_text())["cells"]}


def test_table_runs_and_table_are_logged_offline(wandb_table):
    _, _, tables, wandb_dir = wandb_table
    train, table_run = train_runs(wandb_dir)
    # issue 32: a run is named as the table reads, and its config says which table row it fills
    assert set(train) == {f"{label} · β=0.5 · seed 0" for label in ["FedAvg", *FEDPROX]}
    cells = table_cells(tables)
    for row, method in (("FedAvg", "fedavg"), *((label, "fedprox") for label in FEDPROX)):
        run = train[f"{row} · β=0.5 · seed 0"]
        assert {k: run["config"][k] for k in ("table", "row", "dataset", "partition_key", "beta", "seed",
                                                "protocol", "round_rule", "overridden")} == {
            "table": "wbtest", "row": row, "dataset": "digits", "partition_key": "dirichlet-0.5",
            "beta": 0.5, "seed": 0, "protocol": "global", "round_rule": "best-val-acc", "overridden": False}
        assert run["config"]["method"]["name"] == method and run["config"]["fed"]["rounds"] == 2
        assert run["config"]["method"]["args"] == ({"mu": FEDPROX[row]} if row in FEDPROX else {})
        assert run["tags"] == {method, "digits", "dirichlet", "beta=0.5", "seed=0"} and "code_version" in run["config"]
        # every round, with round as the step: loss, lr, seconds, bytes
        rounds = [h for h in run["history"] if "lr" in h]
        assert [h["round"] for h in rounds] == [0, 1] and [h["_step"] for h in rounds] == [0, 1]
        for h in rounds:
            assert h["train/loss"] > 0 and h["lr"] == 0.01 and h["clients_trained"] == 3
            assert h["time/round_seconds"] >= h["time/train_seconds"] > 0 and h["time/eval_seconds"] > 0
            assert h["comm/bytes_up"] == h["comm/bytes_down"] > 0 and 0 <= h["test/accuracy"] <= 100
        assert run["metrics"]["*"] == "round"
        # the summary holds the table's cell for this row and seed (one seed: the cell's mean)
        assert {"best/test/accuracy", "final/test/accuracy", "best_round"} <= run["summary"]
        for metric in ("accuracy", "f1"):
            assert run["summary_values"][f"test/{metric}"] == pytest.approx(cells[(row, metric)]["mean"], abs=1e-9)
        reported = run["summary_values"]["reported_round"]
        assert run["summary_values"]["test/accuracy"] == next(h["test/accuracy"] for h in rounds if h["round"] == reported)

    # the results table equals the CSV on disk, paired columns (Δ vs FedAvg, interval, p) included
    assert table_run["tags"] == {"table", "wbtest", "digits"}
    (logged,) = (table_run["dir"] / "files" / "media" / "table").glob("*.table.json")
    logged = json.loads(logged.read_text())
    with (tables / "wbtest_digits.csv").open() as f:
        header, *lines = list(csv.reader(f))
    assert logged["columns"] == [*header, "paired_note"]
    assert {"paired_mean", "paired_ci95_low", "paired_ci95_high", "paired_p", "paper_mean", "protocol_differs",
            "delta", "p_value"} <= set(header)
    assert len(logged["data"]) == len(lines) == 6
    for row, line in zip(logged["data"], lines):
        assert ["" if v is None else v for v in row[:len(header)]] == [
            float(x) if x and k not in TEXT_COLUMNS else (int(x) if k == "n_seeds" else x) for k, x in zip(header, line)]
    paired = {(row[0], row[2]): dict(zip(logged["columns"], row)) for row in logged["data"]}
    for metric in ("accuracy", "f1"):
        assert paired[("FedAvg", metric)]["paired_note"] == "baseline"
        for label in FEDPROX:  # one seed: a difference, no interval
            assert paired[(label, metric)]["paired_mean"] == pytest.approx(
                cells[(label, metric)]["mean"] - cells[("FedAvg", metric)]["mean"])
            assert paired[(label, metric)]["paired_ci95_low"] is None and paired[(label, metric)]["n_seeds"] == 1
    images = list((table_run["dir"] / "files" / "media" / "images").rglob("*.png"))
    assert len(images) == 2  # the curves and the partition heatmap


def test_render_only_wandb_logs_the_records_without_training(wandb_table, tmp_path, monkeypatch, capsys):
    """`fedbench table --render-only --wandb` after the fact: one train run per record with the live run's
    identity, config, per-round history and summary; nothing is run and no record is written."""
    config, runs_dir, _, live_dir = wandb_table
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    import bench.assembly.experiment

    def no_training(*args, **kwargs):
        raise AssertionError("--render-only ran an experiment")

    monkeypatch.setattr(bench.assembly.experiment, "run_experiment", no_training)
    records = {p: p.stat().st_mtime_ns for p in runs_dir.rglob("*.json")}
    assert main(["table", "--config", str(config), "--output-dir", str(runs_dir), "--tables-dir", str(tmp_path / "t"),
                 "--render-only", "--wandb", "--wandb-dir", str(tmp_path / "wandb")]) == 0
    assert "W&B: 0 train runs logged, 3 replayed from their records, 0 skipped" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in runs_dir.rglob("*.json")} == records
    live, _ = train_runs(live_dir)
    replayed, _ = train_runs(tmp_path / "wandb")
    assert set(replayed) == set(live)
    # issue 39.2: a replay is the live run under the same W&B id (wandb sync makes them one run)
    assert {n: r["id"] for n, r in replayed.items()} == {n: r["id"] for n, r in live.items()}
    def kept(d: dict) -> dict:  # without W&B's own timing keys (_runtime, _timestamp, _wandb/runtime)
        return {k: v for k, v in d.items() if not k.startswith("_") or k == "_step"}

    for name, run in replayed.items():
        assert (run["group"], run["tags"], run["config"]) == (live[name]["group"], live[name]["tags"], live[name]["config"])
        assert [kept(h) for h in run["history"]] == [kept(h) for h in live[name]["history"]]
        assert kept(run["summary_values"]) == kept(live[name]["summary_values"])
        assert run["metrics"] == live[name]["metrics"]


def settled(wandb_dir: Path, timeout: float = 120.0) -> list[Path]:
    """The offline run folders under ``wandb_dir``, once each holds its run file with its exit record: wandb's
    service writes the file after ``finish()`` returns, a moment later on a loaded machine."""
    import time

    def finished(run_dir: Path) -> bool:
        files = list(run_dir.glob("run-*.wandb"))
        return bool(files) and any(r.WhichOneof("record_type") == "exit" for r in wandb_records(files[0]))

    deadline = time.monotonic() + timeout
    while True:
        dirs = sorted((wandb_dir / "wandb").glob("offline-run-*"))
        if all(finished(d) for d in dirs) or time.monotonic() > deadline:
            return dirs
        time.sleep(0.5)


def all_runs(wandb_dir: Path) -> list[dict]:
    return [offline_run(d) for d in settled(wandb_dir)]


def offline_env(monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    import bench.assembly.experiment

    def no_training(*args, **kwargs):
        raise AssertionError("a table whose records all exist ran an experiment")

    monkeypatch.setattr(bench.assembly.experiment, "run_experiment", no_training)


def test_wandb_ids_are_the_record_identity(wandb_table):
    """Issue 39.2: a train run's W&B id is its record's identity (experiment, record name, code version),
    so that the live run, a replay of its record and a rerun are one W&B run."""
    from bench.assembly.records import find_record, load_record
    from bench.scheduling.table_runner import load_table_config, plan_runs
    from bench.tracking.wandb_logger import wandb_run_id

    config, runs_dir, _, live_dir = wandb_table
    live, _ = train_runs(live_dir)
    planned = plan_runs(load_table_config(str(config)), str(runs_dir))
    ids = {f"{r.label} · β=0.5 · seed 0": wandb_run_id(r.cfg, load_record(find_record(r.cfg))["code_version"])
           for r in planned}
    assert {n: r["id"] for n, r in live.items()} == ids and len(set(ids.values())) == 3


def test_replay_after_a_live_run_skips_its_train_runs(wandb_table, tmp_path, monkeypatch, capsys):
    """Issue 39.2: `--render-only --wandb` after `--wandb` (the same W&B folder) logs no train run again:
    all three are skipped (before: three more runs, same names, new ids, so W&B counted each seed twice);
    the table run is the same W&B run again (its id), updated."""
    import shutil

    config, runs_dir, _, live_dir = wandb_table
    offline_env(monkeypatch)
    wandb_dir = tmp_path / "wandb"
    settled(live_dir)
    shutil.copytree(live_dir, wandb_dir)
    before = all_runs(wandb_dir)
    assert main(["table", "--config", str(config), "--output-dir", str(runs_dir), "--tables-dir", str(tmp_path / "t"),
                 "--render-only", "--wandb", "--wandb-dir", str(wandb_dir)]) == 0
    assert "W&B: 0 train runs logged, 0 replayed from their records, 3 skipped (already in W&B under their ids)" \
        in capsys.readouterr().out
    after = all_runs(wandb_dir)
    train = [r for r in after if r["job_type"] == "train"]
    assert sorted(r["dir"] for r in train) == sorted(r["dir"] for r in before if r["job_type"] == "train")
    tables = [r for r in after if r["job_type"] == "table"]
    assert len(tables) == 2 and len({r["id"] for r in tables}) == 1


def test_a_wandb_table_whose_records_exist_replays_then_skips(wandb_table, tmp_path, monkeypatch, capsys):
    """Issue 39.2: `fedbench table --wandb` when every record exists (nothing to train) still logs its train
    runs, replayed from the records under their ids, and says so; a second call skips them."""
    config, runs_dir, _, live_dir = wandb_table
    offline_env(monkeypatch)
    wandb_dir = tmp_path / "wandb"
    argv = ["table", "--config", str(config), "--output-dir", str(runs_dir), "--tables-dir", str(tmp_path / "t"),
            "--wandb", "--wandb-dir", str(wandb_dir)]
    assert main(argv) == 0
    assert "W&B: 0 train runs logged, 3 replayed from their records, 0 skipped" in capsys.readouterr().out
    replayed, _ = train_runs(wandb_dir)  # (waits for wandb's files: the next call reads them)
    live, _ = train_runs(live_dir)
    assert {n: r["id"] for n, r in replayed.items()} == {n: r["id"] for n, r in live.items()}
    assert main(argv) == 0
    assert "W&B: 0 train runs logged, 0 replayed from their records, 3 skipped" in capsys.readouterr().out
    assert sorted(r["id"] for r in all_runs(wandb_dir) if r["job_type"] == "train") == sorted(
        r["id"] for r in replayed.values())


def test_live_runs_are_counted_as_logged(wandb_table, tmp_path, monkeypatch, capsys):
    """A --wandb table that trains says how many runs it logged live; rerunning one (--force) whose W&B run
    is already there skips its W&B logging instead of adding a second run of the same id."""
    config, _, _, live_dir = wandb_table
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb_dir = tmp_path / "wandb"
    base = ["table", "--config", str(config), "--tables-dir", str(tmp_path / "t"), "--wandb", "--wandb-dir",
            str(wandb_dir), "--rows", "FedAvg"]
    assert main([*base, "--output-dir", str(tmp_path / "runs")]) == 0
    assert "W&B: 1 train runs logged, 0 replayed from their records, 0 skipped" in capsys.readouterr().out
    (run,) = [r for r in all_runs(wandb_dir) if r["job_type"] == "train"]  # (waits for wandb's files)
    live, _ = train_runs(live_dir)
    assert run["id"] == live["FedAvg · β=0.5 · seed 0"]["id"]  # another output folder: the same result, one id
    assert main([*base, "--output-dir", str(tmp_path / "runs"), "--force"]) == 0
    assert "W&B: 0 train runs logged, 0 replayed from their records, 1 skipped" in capsys.readouterr().out
    assert len([r for r in all_runs(wandb_dir) if r["job_type"] == "train"]) == 1


def test_rounds_are_numbered_alike_in_every_output(wandb_table, tmp_path):
    """Issue 39.2: one round numbering (from 0, the records' own) in the curves PNG, W&B's ``round``,
    ``reported_round`` and the dashboard preview (the curves drew 1..R, the others 0..R-1)."""
    from bench.assembly.records import find_record, load_record
    from bench.commands.dashboard_preview import logged_runs, mean_std_curve
    from bench.reporting.plots import curve_of
    from bench.scheduling.table_runner import load_table_config, plan_runs

    config, runs_dir, _, live_dir = wandb_table
    live, _ = train_runs(live_dir)
    spec = load_table_config(str(config))
    planned = plan_runs(spec, str(runs_dir))
    for r, drawn in zip(planned, logged_runs(spec, planned)):
        run = live[f"{r.label} · β=0.5 · seed 0"]
        logged = [h["round"] for h in run["history"] if "test/accuracy" in h]
        assert logged == [0, 1]
        assert curve_of(load_record(find_record(r.cfg)), "test/accuracy")[0] == logged
        assert list(mean_std_curve([drawn], "test/accuracy")[0]) == logged
        assert run["summary_values"]["reported_round"] in logged


def test_one_key_rule_counts_wandb_login(tmp_path, monkeypatch):
    """Issue 39.2: a key saved by `wandb login` (netrc) sends table runs online exactly as it makes the
    dashboard publish (before: runs stayed offline, only $WANDB_API_KEY counted); WANDB_MODE decides when set."""
    from bench.commands.dashboard import has_api_key
    from bench.tracking.wandb_logger import wandb_mode

    home = tmp_path / "home"
    home.mkdir()
    for var in ("WANDB_MODE", "WANDB_API_KEY", "NETRC", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))
    assert (wandb_mode(), has_api_key()) == ("offline", False)
    (home / ".netrc").write_text(f"machine api.wandb.ai\n  login user\n  password {'k' * 40}\n")
    (home / ".netrc").chmod(0o600)
    assert (wandb_mode(), has_api_key()) == ("online", True)
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert (wandb_mode(), has_api_key()) == ("offline", False)


def test_dashboard_follows_a_reduced_table_run(wandb_table, tmp_path, monkeypatch, capsys):
    """Issue 39.2: `fedbench dashboard` takes the table's --set/--seeds/--rows and filters on the group the
    table run logged to (<table>_<dataset>__set-<hash>) and the chosen rows; its specs are named as the
    reduced table, beside the full table's."""
    config, _, _, _ = wandb_table
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    selection = ["--set", "fed.rounds=1", "--rows", "FedAvg", "--seeds", "0"]
    assert main(["table", "--config", str(config), "--output-dir", str(tmp_path / "runs"), "--tables-dir",
                 str(tmp_path / "t"), "--wandb", "--wandb-dir", str(tmp_path / "wandb"), *selection]) == 0
    (run,) = [r for r in all_runs(tmp_path / "wandb") if r["job_type"] == "train"]
    assert run["group"].startswith("wbtest_digits__set-") and run["config"]["fed"]["rounds"] == 1
    (reduced,) = (tmp_path / "t" / "reduced").glob("*.md")  # a reduced table goes to reduced/
    assert main(["dashboard", "--config", str(config), "--out", str(tmp_path / "specs"), "--entity", "me",
                 *selection]) == 0
    workspace = json.loads((tmp_path / "specs" / f"{reduced.stem}_workspace.json").read_text())
    (runset,) = workspace["spec"]["section"]["runSets"]
    assert [(f["key"]["name"], f["value"]) for f in runset["filters"]["filters"]] == [
        ("group", [run["group"]]), ("jobType", "train"), ("row", ["FedAvg"])]
    assert workspace["spec"]["section"]["settings"]["maxRuns"] == 1


@pytest.mark.parametrize("scheme, tags", [("dirichlet", ["beta=0.1"]), ("iid", [])])
def test_run_tags(scheme, tags):
    from bench.assembly.config import RunConfig
    from bench.tracking.wandb_logger import run_tags

    cfg = RunConfig()
    cfg.partition.scheme, cfg.partition.args, cfg.seed = scheme, {"beta": 0.1} if scheme == "dirichlet" else {}, 2
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
    (run,) = all_runs(tmp_path / "wandb")
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


def test_dashboard_preview_draws_what_wandb_holds(wandb_table, tmp_path, capsys):
    """`fedbench dashboard --preview`: the PNG is drawn from the records as W&B holds them (the same rows
    and summaries the live train runs logged)."""
    from bench.commands.dashboard_preview import logged_runs
    from bench.scheduling.table_runner import load_table_config, plan_runs

    config, runs_dir, _, live_dir = wandb_table
    spec = load_table_config(str(config))
    drawn = logged_runs(spec, plan_runs(spec, str(runs_dir), check_records=False))
    live, _ = train_runs(live_dir)
    assert sorted(r.row for r in drawn) == sorted(run["config"]["row"] for run in live.values())
    for r in drawn:
        run = live[f"{r.row} · β={r.beta:g} · seed 0"]
        logged = [{k: v for k, v in h.items() if not k.startswith("_") and k != "trainer/global_step"}
                  for h in run["history"]]
        assert r.rows == logged
        assert {k: run["summary_values"][k] for k in r.summary} == r.summary
    png = tmp_path / "preview.png"
    assert main(["dashboard", "--config", str(config), "--out", str(tmp_path / "specs"), "--entity", "me",
                 "--output-dir", str(runs_dir), "--preview", str(png)]) == 0
    assert f"preview of 3 runs: {png}" in capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tensorboard_without_the_package_is_one_error_before_any_run(tmp_path, monkeypatch, capsys):
    """--tensorboard (run and table) needs tensorboard or tensorboardX: without either (the locked venv has
    tensorboardX; faked away here), one error names the fix before any data is loaded or run started."""
    import lightning.fabric.loggers.tensorboard as tb

    monkeypatch.setattr(tb, "_TENSORBOARD_AVAILABLE", False)
    monkeypatch.setattr(tb, "_TENSORBOARDX_AVAILABLE", False)
    spec = {"table": "tb", "dataset": "digits", "betas": [0.5], "seeds": [0], "metrics": ["accuracy"],
            "base": {"data": {"name": "digits", "cache_dir": str(tmp_path / "cache")}, "fed": {"rounds": 1}},
            "rows": [{"label": "FedAvg", "method": {"name": "fedavg"}}]}
    config = tmp_path / "tb.yaml"
    config.write_text(yaml.safe_dump(spec))
    runs = tmp_path / "runs"
    for argv in (["table", "--config", str(config), "--output-dir", str(runs), "--tables-dir", str(tmp_path / "t"),
                  "--tensorboard"],
                 ["run", "--data.name", "digits", "--output-dir", str(runs), "--tensorboard", "true"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("fedbench: error:") == 1 and "pip install tensorboard" in err
        assert not runs.exists() and not (tmp_path / "cache").exists()
