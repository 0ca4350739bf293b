"""The CI regression set: each entry of configs/regression.yaml rerun and compared with its reference
(results/reference/<name>.json), and a deliberately broken loss must be caught."""
from __future__ import annotations

import pytest
from conftest import REPO

from bench.cli import main
from bench.commands.regression import compare, load_config, load_reference, run_entry
from lightning_modules.base import FederatedModule
from lightning_modules.fedavg import FedAvg

pytestmark = [pytest.mark.regression, pytest.mark.slow]

SPEC = load_config(str(REPO / "configs" / "regression.yaml"))
REFERENCES = str(REPO / "results" / "reference")


@pytest.fixture(scope="module")
def fedavg_run():
    return run_entry(SPEC, "fedavg")


def check(name: str, measured: dict) -> list[str]:
    return compare(measured, load_reference(name, REFERENCES), SPEC.tolerance_of(name))


@pytest.mark.parametrize("name", [n for n in SPEC.names if n != "fedavg"])
def test_entry_matches_reference(name):
    failures = check(name, run_entry(SPEC, name))
    assert not failures, f"{name}: " + "; ".join(failures)


def test_fedavg_matches_reference(fedavg_run):
    assert not check("fedavg", fedavg_run)


def test_changed_loss_is_detected(monkeypatch, fedavg_run):
    """FedAvg with its loss scaled by 1.5 (an lr change in disguise) fails the comparison."""
    def scaled(self, batch):
        return 1.5 * FederatedModule.training_step(self, batch)

    monkeypatch.setattr(FedAvg, "training_step", scaled)
    broken = run_entry(SPEC, "fedavg")
    failures = check("fedavg", broken)
    assert any(f.startswith("test/auc") for f in failures), failures
    assert broken["metrics"] != fedavg_run["metrics"]


def test_stale_reference_and_missing_metric_fail(fedavg_run):
    ref = load_reference("fedavg", REFERENCES)
    other = {**ref, "config": {**ref["config"], "seed": 1}}
    assert "stale reference" in compare(fedavg_run, other, SPEC.tolerance)[0]
    # a reference written before fed.protocol existed: the option counts at its default; set, the reference is stale
    unset = {k: v for k, v in ref["config"]["fed"].items() if k != "protocol"}
    assert ref["config"]["fed"]["protocol"] is None
    assert not compare(fedavg_run, {**ref, "config": {**ref["config"], "fed": unset}}, SPEC.tolerance)
    scored = {**ref, "config": {**ref["config"], "fed": {**ref["config"]["fed"], "protocol": "global"}}}
    assert "stale reference" in compare(fedavg_run, scored, SPEC.tolerance)[0]
    no_auc = {**fedavg_run, "metrics": {**fedavg_run["metrics"], "test/auc": None}}
    assert compare(no_auc, ref, SPEC.tolerance) == ["test/auc: None vs reference " + str(ref["metrics"]["test/auc"])]


def test_cli_rejects_update_without_reason_and_unknown_entries(tmp_path, capsys):
    refs = ["--reference-dir", str(tmp_path)]
    assert main(["regression", "--update", "--only", "fedavg", *refs]) == 2
    assert "--update needs --reason" in capsys.readouterr().err
    assert main(["regression", "--only", "fedavgg", *refs]) == 2
    assert "No regression run named 'fedavgg'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
