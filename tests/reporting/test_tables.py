"""Tables are rendered from run records only: ours, the paper's number, the difference, Welch p."""
from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest

from bench.assembly.records import record_path
from bench.core.atomic_io import write_json
from bench.core.code_version import code_version
from bench.reporting.paper_compare import welch_p
from bench.reporting.tables import render_table
from bench.scheduling.table_runner import plan_runs, record_status
from bench.tables.table_spec import TableSpec

SPEC_YAML = {  # a table config as its YAML file holds it
    "table": "table2", "dataset": "kvasir", "paper": "fedbm", "betas": [0.05, 0.1], "seeds": [0, 1, 2],
    "metrics": ["accuracy", "f1"], "round_rule": "best-val-sum5",
    # FedBM's Kvasir setup (Sec. IV-A: 10 clients, 200 rounds x 2 local epochs, half sampled per round), so that
    # its published cells are comparable; the records below are fakes of three evaluated rounds
    "base": {"data": {"name": "kvasir"}, "partition": {"num_clients": 10},
             "fed": {"rounds": 200, "local_epochs": 2, "sample_ratio": 0.5}},
    "rows": [
        {"label": "Central", "method": {"name": "central"}, "partition_independent": True,
         "paper_method": "Central Learning"},
        {"label": "FedAvg", "method": {"name": "fedavg"}},
        {"label": "FedRep (per-client)", "method": {"name": "fedrep"}, "paper_method": "FedREP"},
        {"label": "Ours only", "method": {"name": "fedprox"}},
    ],
}
SPEC = TableSpec.parse(SPEC_YAML, "t.yaml")
# FedAvg accuracy per (beta, seed); (0.1, 2) is deliberately missing
FEDAVG = {(0.05, 0): 55.0, (0.05, 1): 58.0, (0.05, 2): 61.0, (0.1, 0): 66.0, (0.1, 1): 70.0}


def fake_record(run, acc: float, protocol: str = "global") -> dict:
    """Three rounds improving on every metric: every round rule picks the last, where test accuracy
    is ``acc`` and test F1 ``acc - 10``."""
    history = [{"round": r, "metrics": {"test/accuracy": acc * (r + 1) / 3, "test/f1": acc - 10 - (2 - r),
                                        **{f"val/{m}": acc * (r + 1) / 3 for m in ("accuracy", "precision", "f1", "auc")}}}
               for r in range(3)]
    return {"run_name": run.cfg.run_name(), "config": run.cfg.to_dict(), "code_version": code_version(run.cfg),
            "protocol": protocol, "dataset": "kvasir", "backbone": "resnet18 (from scratch)",
            "class_names": [f"c{k}" for k in range(3)],
            "partition": {"counts": [[5, 0, 1], [0, 7, 2], [3, 3, 0], [1, 0, 9]]},
            "splits": {"train": 100, "val": 20, "test": 30}, "history": history,
            "best": {"test/accuracy": acc, "test/f1": acc - 10}}


def write_fake_records(tmp_path, with_fedrep: bool = True) -> list:
    """SPEC's runs with records: FedAvg's accuracies from FEDAVG, Central 90 + seed, FedRep's rows 80 (per
    client; with_fedrep), "Ours only" none at all."""
    runs = plan_runs(SPEC, str(tmp_path / "runs"))
    for run in runs:
        if run.label == "FedAvg" and (run.beta, run.seed) in FEDAVG:
            acc = FEDAVG[(run.beta, run.seed)]
        elif run.label == "Central":
            acc = 90.0 + run.seed
        elif run.label.startswith("FedRep") and with_fedrep:
            acc = 80.0
        else:
            continue
        protocol = "per_client" if run.label.startswith("FedRep") else "global"
        write_json(record_path(run.cfg.output_dir, run.cfg.experiment, run.cfg.run_name()),
                   fake_record(run, acc, protocol))
    return runs


@pytest.fixture
def rendered(tmp_path):
    runs = write_fake_records(tmp_path)
    paths = render_table(SPEC, runs, str(tmp_path / "tables"))
    return runs, paths


def cells_of(paths) -> dict:
    data = json.loads(Path(paths["json"]).read_text())
    return {(c["method"], c["beta"], c["metric"]): c for c in data["cells"]}


def test_mean_std_and_missing(rendered):
    _, paths = rendered
    cells = cells_of(paths)
    a = cells[("FedAvg", 0.05, "accuracy")]
    assert a["mean"] == pytest.approx(58.0) and a["std"] == pytest.approx(3.0)
    b = cells[("FedAvg", 0.1, "accuracy")]
    assert b["values"] == [66.0, 70.0] and b["expected"] == 3
    assert cells[("Ours only", 0.05, "accuracy")]["mean"] is None
    md = Path(paths["md"]).read_text()
    assert "| FedAvg <sup>FBM-1, FBM-3, FBM-4, FBM-10, FBM-16</sup> | 58.00 ± 3.00 |" in md  # its departures' ids
    assert "68.00 ± 2.83 (2/3 seeds)" in md
    assert "| Ours only <sup>FBM-1, FBM-3, FBM-4, FBM-10, FBM-16, FBM-19</sup> | missing (0/3 seeds) | missing | n/a |" \
        in md  # ours, Δ FedAvg, FedBM; a FedProx row: also FedProx's optimiser (FBM-19)
    # Central runs once per seed and fills both beta columns
    c = cells[("Central", 0.1, "accuracy")]
    assert c["mean"] == pytest.approx(91.0) and c["expected"] == 3


def test_paper_delta_and_welch(rendered):
    _, paths = rendered
    cells = cells_of(paths)
    a = cells[("FedAvg", 0.05, "accuracy")]  # FedBM Table II, Kvasir, beta 0.05: 60.10 ± 5.76
    assert (a["paper_mean"], a["paper_std"], a["paper_source"]) == (60.1, 5.76, "fedbm Table II")
    assert a["delta"] == pytest.approx(58.0 - 60.1)
    # Welch by hand: t = (58 - 60.1) / sqrt(9/3 + 5.76^2/3), df by Welch-Satterthwaite
    from scipy import stats

    v1, v2 = 9 / 3, 5.76**2 / 3
    t = (58.0 - 60.1) / (v1 + v2) ** 0.5
    df = (v1 + v2) ** 2 / (v1**2 / 2 + v2**2 / 2)
    assert a["p_value"] == pytest.approx(2 * stats.t.sf(abs(t), df), rel=1e-9)
    # two seeds only: no p-value, but the paper and delta are shown
    b = cells[("FedAvg", 0.1, "accuracy")]
    assert b["paper_mean"] == 67.02 and b["p_value"] is None
    # the paper's FedREP cell is found, but FedBM scored the global model: no number, no delta, no p
    rep = cells[("FedRep (per-client)", 0.1, "f1")]
    assert rep["paper_source"] == "fedbm Table II" and rep["paper_mean"] is None and rep["delta"] is None
    assert rep["protocol_differs"] == "evaluation (ours: per_client, paper: global); round (ours: final, paper: best-val-sum5)"
    assert cells[("Central", 0.1, "accuracy")]["paper_mean"] is not None
    assert cells[("Ours only", 0.05, "accuracy")]["paper_mean"] is None  # FedBM has no such row name
    md = Path(paths["md"]).read_text()
    # † : FedBM's round rule (best-val-sum5) is read from its main.py, not stated in the paper
    assert f"| FedAvg <sup>FBM-1, FBM-3, FBM-4, FBM-10, FBM-16</sup> | 58.00 ± 3.00 | (reference) | 60.10 ± 5.76 † | -2.10 | {a['p_value']:.3f} |" in md


def test_welch_p_known_values():
    # identical summaries: p = 1; a large separation: p tiny; fewer than 3 runs: none
    assert welch_p(10.0, 1.0, 3, 10.0, 1.0, 3) == pytest.approx(1.0)
    assert welch_p(10.0, 0.1, 5, 20.0, 0.1, 5) < 1e-8
    assert welch_p(10.0, 1.0, 2, 12.0, 1.0, 3) is None
    # textbook check against the t-test on raw samples
    from scipy import stats

    x, y = [1.0, 2.0, 4.0, 7.0], [3.0, 5.0, 8.0, 9.0, 12.0]
    raw = stats.ttest_ind(x, y, equal_var=False).pvalue
    assert welch_p(statistics.fmean(x), statistics.stdev(x), 4, statistics.fmean(y), statistics.stdev(y), 5) \
        == pytest.approx(raw)


def test_csv_agrees_with_json_and_protocol_is_stated(rendered):
    _, paths = rendered
    cells = cells_of(paths)
    with open(paths["csv"]) as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(cells)
    for row in rows:
        cell = cells[(row["method"], float(row["beta"]), row["metric"])]
        assert (row["mean"] == "") == (cell["mean"] is None)
        if cell["mean"] is not None:
            assert float(row["mean"]) == pytest.approx(cell["mean"])
        assert int(row["n_seeds"]) == len(cell["values"])
    md = Path(paths["md"]).read_text()
    assert "Per-client rows (FedRep (per-client))" in md and "final round" in md
    assert "val accuracy + micro recall + macro precision + macro F1 + AUC (FedBM's main.py)" in md
    assert "| protocol differs: evaluation, round [1] | — | — |" in md
    assert ("[1] FedRep (per-client) vs fedbm Table II: evaluation (ours: per_client, paper: global); "
            "round (ours: final, paper: best-val-sum5).") in md


def test_figures_written(rendered):
    _, paths = rendered
    for key in ("curves", "partition β=0.05", "partition β=0.1"):
        data = Path(paths[key]).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_stale_records_are_rerun(tmp_path, monkeypatch):
    runs = plan_runs(SPEC, str(tmp_path / "runs"))
    run = runs[1]
    path = record_path(run.cfg.output_dir, run.cfg.experiment, run.cfg.run_name())
    assert record_status(run.cfg) == (None, "no record")
    rec = fake_record(run, 50.0)
    write_json(path, rec)
    assert record_status(run.cfg)[1] == "up to date"
    run.cfg.devices = 4  # where a run executes does not change its numbers
    assert record_status(run.cfg)[1] == "up to date"
    run.cfg.fed.rounds = 5
    assert record_status(run.cfg)[1] == "config changed"
    run.cfg.fed.rounds = SPEC.base["fed"]["rounds"]
    old = {**rec, "config": {**rec["config"], "fed": {k: v for k, v in rec["config"]["fed"].items() if k != "protocol"}}}
    write_json(path, old)  # a record from before fed.protocol existed: the option counts at its default
    assert record_status(run.cfg)[1] == "up to date"
    run.cfg.fed.protocol = "local_mean"  # scored another way: another record
    assert record_status(run.cfg) == (None, "no record")
    run.cfg.fed.protocol = None
    write_json(path, {**rec, "code_version": "0123456789ab"})
    assert record_status(run.cfg)[1] == f"code changed (0123456789ab -> {code_version(run.cfg)})"
