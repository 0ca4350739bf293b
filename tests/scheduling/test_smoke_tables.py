"""The table smoke run (tests/smoke_tables.py, `make smoke-tables`): every config gets a small, offline
budget; a config that cannot run fails loudly; the rendered-table check catches incomplete tables."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO
from smoke_tables import check_table, run_config, smoke_command, smoke_sets

from bench.assembly.experiment import method_arg_names
from bench.assembly.validation import known_class_count
from bench.scheduling.table_runner import load_table_config, plan_runs
from bench.tables.table_overrides import TableOverrides
from datamodules.data_home import DATA_HOME_ENV
from lightning_modules.base import METHODS

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

CONFIGS = sorted((REPO / "configs" / "tables").glob("*.yaml"))


# the fewest clients >= 3 for which every shards-s column of the config cuts each class into whole shards
PER_CLASS_SHARD_CLIENTS = {"fstcbdg_cifar10": 10, "fstcbdg_cifar100": 10, "fstcbdg_cinic10": 5,
                           "fstcbdg_fashion-mnist": 5, "fstcbdg_sigma_cifar10": 5, "fstcbdg_sigma_fashion-mnist": 5}


def test_a_cross_validation_config_smokes_its_first_fold(tmp_path):
    """A ``folds: K`` table (FedNPR's) runs fold 0 only, as the others run their first seed: every row once."""
    fold_configs = 0
    for config in CONFIGS:
        spec = load_table_config(str(config))
        argv = smoke_command(config, tmp_path, tmp_path)
        if not spec.folds:
            assert "--folds" not in argv, config.name
            continue
        fold_configs += 1
        assert argv[argv.index("--folds") + 1] == "0", config.name
        overrides = TableOverrides.parse(spec, [], argv[argv.index("--seeds") + 1], None, "0")
        runs = plan_runs(overrides.select(spec), str(tmp_path / "runs"))
        assert {r.cfg.data.fold for r in runs} == {0} and {r.cfg.data.folds for r in runs} == {spec.folds}
        assert len(runs) == len(plan_runs(spec, str(tmp_path / "runs"))) // spec.folds, config.name
    assert fold_configs == 4  # fednpr_ich, fednpr_isic and their ablations


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_config_gets_a_small_offline_budget(config, tmp_path):
    spec = load_table_config(str(config))
    sets = smoke_sets(config, tmp_path / "cache")
    overrides = TableOverrides.parse(spec, [f"{k}={v}" for k, v in sets.items()], str(spec.seeds[0]), None)
    runs = plan_runs(overrides.select(spec), str(tmp_path / "runs"))
    overrides.apply(runs)
    assert {r.label for r in runs} == set(spec.labels)  # every row, one seed
    assert {r.cfg.seed for r in runs} == {spec.seeds[0]}
    for run in runs:
        c = run.cfg
        assert (c.fed.rounds, c.fed.local_epochs, c.data.image_size, c.threads) == (2, 1, 16, 1)
        # never the full records: the overrides' own experiment (after a row's record_tag, if any)
        # (a derived average_of row is its first source row's run, so it carries that row's tag)
        source = next((r for r in spec.rows if r.label == run.row.average_of[0]), run.row) \
            if run.row.derived else run.row
        tag = source.record_tag
        assert c.experiment.startswith(f"{spec.name}{'-' + tag if tag else ''}__set-")
        own = next(r for r in spec.rows if r.label == run.label).partition
        scheme = own.get("scheme", spec.base_partition.get("scheme"))
        # natural partitions keep their sites; FedNTD's per-class shards (FST-CBDG) need s * N to be a multiple
        # of the classes: shards-2 of 10 classes -> 5 clients, shards-3 -> 10, shards-10 of CIFAR-100's 100 -> 10
        expected = (spec.base_partition["num_clients"] if scheme == "natural"
                    else PER_CLASS_SHARD_CLIENTS.get(config.stem, 3))
        assert c.partition.num_clients == expected, run.label
        if c.partition.args.get("shard_mode") == "per_class" and c.partition.scheme == "shards":
            assert c.partition.args["shards_per_client"] * expected % known_class_count(c) == 0, run.label
        accepts = method_arg_names(METHODS.get(c.method.name))
        if "text_encoder" in accepts:
            assert c.method.args["text_encoder"] == "minilm", run.label
        if "clip" in accepts:
            assert c.method.args["clip"] == "tiny-random", run.label
        assert c.method.backbone == ("efficientnet_lite0" if c.method.pretrained else "simple-cnn")


def test_a_config_that_cannot_run_offline_fails_loudly(tmp_path, monkeypatch):
    """No Kvasir in the data home: the config fails with the missing-data message, it is not skipped."""
    monkeypatch.delenv(DATA_HOME_ENV, raising=False)
    (tmp_path / "home").mkdir()
    result = run_config(REPO / "configs" / "tables" / "table2_kvasir.yaml", tmp_path / "home", tmp_path)
    assert not result.ok and result.table == ""
    assert "exit code 2" in result.problem
    assert f"Dataset 'kvasir' not found: looked for '{tmp_path / 'home' / 'kvasir-dataset-v2'}'" in result.problem


def test_a_tiny_config_runs_and_its_table_is_checked(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_HOME_ENV, raising=False)
    config = tmp_path / "tiny_digits.yaml"
    config.write_text(json.dumps({
        "table": "tiny", "dataset": "digits", "betas": [0.5], "seeds": [3, 4], "metrics": ["accuracy"],
        "base": {"data": {"name": "digits", "max_train_samples": 300, "max_test_samples": 100},
                 "partition": {"scheme": "dirichlet", "num_clients": 10}, "fed": {"rounds": 5}},
        "rows": [{"label": "FedAvg", "method": {"name": "fedavg", "backbone": "resnet18"}},
                 {"label": "FedCB", "method": {"name": "fedcb", "args": {"text_encoder": "bert"}}}]}))
    (tmp_path / "home").mkdir()
    result = run_config(config, tmp_path / "home", tmp_path)
    assert result.ok, result.problem
    assert result.runs == 2 and Path(result.table).name.startswith("tiny_digits__set-")
    assert Path(result.table).parent.name == "reduced"
    records = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/*.json")]
    assert sorted(r["backbone"] for r in records) == ["simple-cnn (from scratch)",
                                                       "simple-cnn (from scratch) + text encoder minilm"]
    assert {r["config"]["seed"] for r in records} == {3} and {len(r["history"]) for r in records} == {2}
    assert {r["partition"]["num_clients"] for r in records} == {3}


def test_check_table_names_every_gap(tmp_path):
    config = tmp_path / "t.yaml"
    config.write_text(json.dumps({"table": "t", "dataset": "d", "betas": [0.5], "seeds": [0],
                                  "rows": [{"label": "A", "method": {"name": "fedavg"}},
                                           {"label": "B", "method": {"name": "fedavg"}},
                                           {"label": "C", "method": {"name": "fedavg"}}]}))
    md = tmp_path / "t.md"
    md.write_text("# t\n\nWeights: simple-cnn (from scratch) (A, B).\n\n| Method | β=0.5 Acc ours |\n|---|---|\n"
                  "| A | 50.00 ± 0.00 |\n| B | missing (0/1 seeds) |\n")
    problem = check_table(config, md, {"method.args.text_encoder": "minilm"})
    assert problem == ("row 'C' missing from the table; row 'B' has a missing cell; the title does not say it "
                       "is a reduced run; the table does not name the stand-in 'text encoder minilm'")
