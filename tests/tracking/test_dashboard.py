"""`fedbench dashboard` (issue 32.5): the W&B workspace and report of a table, built offline from its config
with wandb-workspaces (whose private serializer, pinned in requirements.lock, this covers): a section per
metric, curves over rounds grouped by row (one report panel per β), the round-rule summary per row,
training, communication and time panels, the results table; written as JSON without any network call."""
from __future__ import annotations

import json
import socket

import pytest
import yaml
from conftest import REPO

from bench.cli import main
from bench.scheduling.table_runner import distinct_runs, load_table_config, plan_runs
from bench.tracking.wandb_logger import column_key

CONFIG = REPO / "configs" / "tables" / "table2_fashion-mnist.yaml"
SECTIONS = ["test/accuracy", "test/f1", "training", "communication", "time", "results"]


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No key, no netrc, and any connection attempt fails the test."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_ENTITY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    def no_network(*args, **kwargs):
        raise AssertionError("the dashboard spec was built with a network call")

    monkeypatch.setattr(socket.socket, "connect", no_network)


def panels(section: dict) -> list[tuple[str, dict]]:
    return [(p["viewType"], p["config"]) for p in section["panels"]]


def test_dashboard_spec_offline(offline, tmp_path, capsys):
    spec = yaml.safe_load(CONFIG.read_text())
    assert main(["dashboard", "--config", str(CONFIG), "--out", str(tmp_path / "out"), "--entity", "me"]) == 0
    out = capsys.readouterr().out
    assert "Offline (no W&B API key): nothing was published" in out and "wandb sync" in out
    workspace = json.loads((tmp_path / "out" / "table2_fashion-mnist_workspace.json").read_text())
    report = json.loads((tmp_path / "out" / "table2_fashion-mnist_report.json").read_text())

    # the workspace: its runs are the table's train runs (issue 39.2: no table run as a null group), grouped
    # by config.partition_key (the column) then config.row; it shows every one of them (table2: 129 > 100)
    assert (workspace["entity"], workspace["project"]) == ("me", "fedbench")
    view = workspace["spec"]["section"]
    (runset,) = view["runSets"]
    assert runset["grouping"] == [{"section": "config", "name": "partition_key.value"},
                                  {"section": "config", "name": "row.value"}]
    assert [(f["key"]["name"], f["op"], f["value"]) for f in runset["filters"]["filters"]] == [
        ("group", "IN", ["table2_fashion-mnist"]), ("jobType", "=", "train")]
    table_runs = distinct_runs(plan_runs(load_table_config(str(CONFIG)), check_records=False))
    assert view["settings"]["maxRuns"] == len(table_runs) > 100
    assert view["settings"]["xAxis"] == "round" and view["settings"]["useRunsTableGroupingInPanels"] is True
    sections = {s["name"]: s for s in view["panelBankConfig"]["sections"]}
    assert list(sections) == SECTIONS[:-1]  # the results table is the report's (its run is not a train run)
    for metric in spec["metrics"]:  # a curve over rounds (mean ± std per group) and the round-rule summary per group
        (_, curve), (_, bars) = panels(sections[f"test/{metric}"])
        assert [kind for kind, _ in panels(sections[f"test/{metric}"])] == ["Run History Line Plot", "Bar Chart"]
        assert (curve["xAxis"], curve["metrics"], curve["groupAgg"], curve["groupArea"]) == (
            "round", [f"test/{metric}"], "mean", "stddev")
        # issue 39.2: the bars follow the runs table's grouping (column, then row): both β of a row are two bars
        assert (bars["metrics"], bars["groupBy"], bars["aggregate"], bars["groupAgg"], bars["groupArea"]) == (
            [f"test/{metric}"], None, True, "mean", "stddev")
    for name, keys in (("training", ["train/loss", "lr", "clients_trained"]),
                       ("communication", ["comm/bytes_up", "comm/bytes_down"]),
                       ("time", ["time/round_seconds", "time/train_seconds", "time/eval_seconds"])):
        assert [(c["xAxis"], c["metrics"]) for _, c in panels(sections[name])] == [("round", [k]) for k in keys]

    # the report: per metric one panel grid per column (β), its run set that column's train runs grouped by config.row
    blocks = report["spec"]["blocks"]
    headings = [b["children"][0]["text"] for b in blocks if b["type"] == "heading"]
    assert headings == SECTIONS
    grids = [b["metadata"] for b in blocks if b["type"] == "panel-grid"]
    assert len(grids) == len(spec["metrics"]) * len(spec["betas"]) + 4
    for i, grid in enumerate(grids[:len(spec["metrics"]) * len(spec["betas"])]):
        beta, metric = spec["betas"][i % 2], spec["metrics"][i // 2]
        (rs,) = grid["runSets"]
        assert rs["grouping"] == [{"section": "config", "name": "row.value"}]
        assert [(f["key"]["name"], f["value"]) for f in rs["filters"]["filters"]] == [
            ("group", ["table2_fashion-mnist"]), ("jobType", "train"), ("partition_key", f"dirichlet-{beta:g}")]
        curve, bars = (p["config"] for p in grid["panelBankSectionConfig"]["panels"])
        assert (curve["metrics"], curve["xAxis"], curve["groupBy"], bars["groupBy"]) == (
            [f"test/{metric}"], "round", "row.value", "row.value")
        assert curve["chartTitle"] == f"test/{metric} · β={beta:g}"
    (results,) = grids[-1]["runSets"]
    assert [(f["key"]["name"], f["value"]) for f in results["filters"]["filters"]] == [
        ("group", ["table2_fashion-mnist"]), ("jobType", "table")]
    (table,) = grids[-1]["panelBankSectionConfig"]["panels"]
    assert table["viewType"] == "Weave" and '"results"' in json.dumps(table)


def test_dashboard_without_entity_says_what_to_pass(offline, tmp_path, capsys):
    assert main(["dashboard", "--config", str(CONFIG), "--out", str(tmp_path)]) == 0
    assert "--entity <your entity>" in capsys.readouterr().out
    assert json.loads((tmp_path / "table2_fashion-mnist_workspace.json").read_text())["entity"] == "YOUR-ENTITY"


def test_report_has_a_grid_per_column_of_any_scheme(offline, tmp_path):
    """Issue 39.2: a table whose columns are not all Dirichlet (FST-CBDG's iid, shards and LDA) gets one report
    grid per column, filtered on config.partition_key (before: per β only, so its iid and shards runs were in
    no grid), and its workspace shows up to all of its train runs."""
    config = REPO / "configs" / "tables" / "fstcbdg_fashion-mnist.yaml"
    assert main(["dashboard", "--config", str(config), "--out", str(tmp_path), "--entity", "me"]) == 0
    report = json.loads((tmp_path / "fstcbdg_fashion-mnist_report.json").read_text())
    workspace = json.loads((tmp_path / "fstcbdg_fashion-mnist_workspace.json").read_text())
    runs = plan_runs(load_table_config(str(config)), check_records=False)
    keys = list(dict.fromkeys(column_key(r.cfg) for r in runs))  # what each train run logs as its column
    assert set(keys) == {"iid", "shards-2", "shards-10", "lda-0.1", "lda-0.5"}
    grids = [b["metadata"] for b in report["spec"]["blocks"] if b["type"] == "panel-grid"]
    metrics = yaml.safe_load(config.read_text())["metrics"]
    shown = [next(f["value"] for f in g["runSets"][0]["filters"]["filters"] if f["key"]["name"] == "partition_key")
             for g in grids[:len(metrics) * len(keys)]]
    assert shown == keys * len(metrics)
    assert workspace["spec"]["section"]["settings"]["maxRuns"] == len(distinct_runs(runs))
