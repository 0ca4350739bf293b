"""FedNPR's published tables as configs (issue 17): Table 3's thirteen methods on both datasets under
FedNPR's per-client protocol, and what `fedbench coverage` reports for them."""
from __future__ import annotations

import pytest

from bench.commands.coverage import coverage
from bench.reporting.paper_compare import Match, compare, welch_p
from bench.scheduling.table_runner import distinct_runs, load_table_config, plan_runs
from lightning_modules.base import METHODS

TABLE3_METHODS = {  # as FedNPR prints them -> our method
    "Local Learning": "local", "FedAvg": "fedavg", "FedProx": "fedprox", "MOON": "moon", "CReRF": "crerf",
    "FedRS": "fedrs", "FedLC": "fedlc", "BalanceFL": "balancefl", "FedREP": "fedrep", "FedRod": "fedrod",
    "FedBABU": "fedbabu", "FedNPR": "fednpr", "FedNPR-Per": "fednpr-per",
}


@pytest.fixture(scope="module")
def fednpr_coverage():
    return coverage(papers=["fednpr"])


@pytest.mark.parametrize("dataset", ["isic", "ich", "fashion-mnist"])
def test_table3_has_every_method_scored_per_client(dataset):
    spec = load_table_config(f"configs/tables/fednpr_{dataset}.yaml")
    runs = plan_runs(spec)
    by_paper_name = {}
    for r in runs:
        assert (r.cfg.fed.protocol or METHODS.get(r.cfg.method.name).protocol) == "per_client", r.label
        by_paper_name.setdefault(r.row.paper_method or r.label, set()).add(r.cfg.method.name)
    for printed, method in TABLE3_METHODS.items():
        assert by_paper_name.get(printed) == {method}, (dataset, printed, by_paper_name.get(printed))
    if dataset != "fashion-mnist":
        # the paper's five-fold cross-validation: one run per fold, each with seed 0 (tests/tables/test_folds.py)
        assert spec.round_rule == "max-test-bacc" and spec.folds == 5 and spec.seeds == (0,)
        assert sorted({r.cfg.data.fold for r in runs}) == [0, 1, 2, 3, 4]


def test_table3_is_covered_on_both_datasets_with_the_papers_protocol(fednpr_coverage):
    cells = [c for c in fednpr_coverage["cells"] if c["table"] == "3"]
    assert len(cells) == 52 and all(c["covered"] for c in cells), [c["reason"] for c in cells if not c["covered"]]
    by = {(c["dataset"], c["method"], c["metric"]): c["by"][0] for c in cells}
    assert by[("fed-isic2019", "Local Learning", "balanced_auc")]["config"].endswith("fednpr_isic.yaml")
    assert by[("rsna-ich", "FedAvg", "balanced_accuracy")]["config"].endswith("fednpr_ich.yaml")
    # every cell is †: the reporting round (best mean per-client bACC) is read from FedNPR's notebooks
    assert fednpr_coverage["summary"]["fednpr"]["tables"]["3"] == {"covered": 52, "total": 52, "inferred": 52}


def test_every_published_fednpr_cell_is_covered(fednpr_coverage):
    summary = fednpr_coverage["summary"]["fednpr"]
    assert (summary["covered"], summary["total"]) == (116, 116), [
        (c["table"], c["method"], c["setting"], c["reason"]) for c in fednpr_coverage["cells"] if not c["covered"]]
    assert {t: (s["covered"], s["total"]) for t, s in summary["tables"].items()} == {
        "3": (52, 52), "4": (16, 16), "5": (16, 16), "6": (16, 16), "7": (16, 16)}
    assert not fednpr_coverage["errors"]


@pytest.mark.parametrize("dataset, k, lam", [("isic", 4, 0.1), ("ich", 2, 0.05)])
def test_ablation_configs_run_table3s_protocol_and_share_repeated_runs(dataset, k, lam):
    table3 = load_table_config(f"configs/tables/fednpr_{dataset}.yaml")
    spec = load_table_config(f"configs/tables/fednpr-ablation_{dataset}.yaml")
    for key in ("base", "round_rule", "folds", "seeds", "metrics"):
        assert getattr(spec, key) == getattr(table3, key), key
    runs = plan_runs(spec)
    args = {r.label: r.cfg.method.args for r in runs}
    full = {"num_subclusters": k, "lam": lam}
    assert args[f"BSM + NPR K={k} = FedNPR-Per (T4)"] == args[f"FedNPR-Per K={k} (T5)"] == full
    assert args[f"FedNPR-Per lambda={lam} (T7)"] == full
    assert args["NPR K=1, no BSM (T4)"] == {"num_subclusters": 1, "lam": lam, "balanced_softmax": False}
    assert {r.cfg.method.name for r in runs if "(T6)" in r.label} == {"fednpr", "fedbabu-npr", "fedrep-npr",
                                                                       "fedrod-npr"}
    # 16 rows; the full FedNPR-Per (Tables 4, 5, 7) and K=1 (Tables 4, 5) run once each: 13 runs per fold
    assert len(distinct_runs(runs)) == 13 * spec.folds


@pytest.mark.parametrize("config", ["fednpr_isic", "fednpr_ich", "fednpr_fashion-mnist", "fednpr-ablation_isic",
                                    "fednpr-ablation_ich"])
def test_every_planned_run_passes_the_checks_before_work(config):
    """What `fedbench table` checks before the first run (bench/assembly/validation.py) holds for every row."""
    from bench.assembly.validation import validate_config

    runs = plan_runs(load_table_config(f"configs/tables/{config}.yaml"))
    for r in runs:
        validate_config(r.cfg)
    if not config.endswith("fashion-mnist"):  # FLamby's folds / FedNPR's ICH split: whole train lists train,
        # each client's own test list tests
        assert {(r.cfg.fed.client_test, r.cfg.data.val_fraction) for r in runs} == {("site", 0.0)}


def test_fednpr_numbers_are_tested_against_its_five_folds():
    """FedNPR reports mean ± std over five-fold cross-validation: the Welch test uses n = 5 for its cells
    (3 for FedBM's and FedCB's seeds)."""
    ours = {"mean": 70.0, "std": 1.0, "values": [69.0, 70.0, 71.0]}
    paper = {"mean": 72.0, "std": 1.0, "table": "3", "protocol": {}}
    got = compare(ours, Match("fednpr", paper))
    assert got["p_value"] == pytest.approx(welch_p(70.0, 1.0, 3, 72.0, 1.0, 5))
    assert got["p_value"] != pytest.approx(welch_p(70.0, 1.0, 3, 72.0, 1.0, 3))
    assert compare(ours, Match("fedbm", paper))["p_value"] == pytest.approx(welch_p(70.0, 1.0, 3, 72.0, 1.0, 3))
