"""Tables that say what is real (issue 20), on the offline table2 config with fixture records: the paired
difference to FedAvg against a hand computation, the test-set standard error, bold best with ties, no
all-n/a paper columns, and the curves as small multiples."""
from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
import statistics
from pathlib import Path

import pytest
from conftest import REPO
from PIL import Image

from bench.assembly.records import record_path
from bench.core.atomic_io import write_json
from bench.core.errors import FedbenchError
from bench.reporting.paper_compare import welch_p
from bench.reporting.tables import render_table
from bench.reporting.uncertainty import best_with_ties, binomial_se, paired_difference
from bench.scheduling.table_runner import load_table_config, plan_runs

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

N_TEST = 500
# test accuracy per (row, beta) for seeds 0, 1, 2; every other row: 30 + seed, Central 80 + seed
ACC = {
    ("FedAvg", 0.05): [40.0, 50.0, 45.0],
    ("FedBM", 0.05): [46.0, 53.0, 52.0],  # FedAvg + (6, 3, 7): significant paired, not by Welch
    ("FedCB", 0.05): [41.0, 49.0, 47.0],  # FedAvg + (1, -1, 2)
    ("FedAvg", 0.1): [60.0, 62.0, 64.0],
    ("FedBM", 0.1): [70.0, 72.0],  # seed 2 has no record: paired over seeds 0 and 1
    ("FedCB", 0.1): [61.0, 63.0, 65.0],  # FedAvg + 1 on every seed: zero spread
}


def accuracy(label: str, beta: float, seed: int) -> float | None:
    if label == "Central":
        return 80.0 + seed
    values = ACC.get((label, beta), [30.0 + s for s in range(3)])
    return values[seed] if seed < len(values) else None


def record(run, acc: float) -> dict:
    """Three rounds; validation accuracy peaks at the last, where test accuracy is ``acc`` (F1 acc - 10)."""
    history = [{"round": r, "metrics": {"test/accuracy": acc - 2 * (2 - r), "test/f1": acc - 10 - (2 - r),
                                        "val/accuracy": 10.0 * (r + 1)}} for r in range(3)]
    return {"run_name": run.cfg.run_name(), "config": run.cfg.to_dict(), "dataset": "fashion-mnist",
            "backbone": "simple-cnn-w16 (from scratch)", "class_names": [f"c{k}" for k in range(10)],
            "partition": {"counts": [[3] * 10] * 10}, "splits": {"train": 2000, "val": 500, "test": N_TEST},
            "history": history, "best": {"test/accuracy": acc}}


@pytest.fixture(scope="module")
def table2(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("table2")
    spec = load_table_config(str(REPO / "configs" / "tables" / "table2_fashion-mnist.yaml"))
    runs = plan_runs(spec, str(tmp / "runs"))
    for run in runs:
        acc = accuracy(run.label, run.beta, run.seed)
        if acc is not None:
            write_json(record_path(run.cfg.output_dir, run.cfg.experiment, run.cfg.run_name()), record(run, acc))
    paths = render_table(spec, runs, str(tmp / "tables"))
    data = json.loads(Path(paths["json"]).read_text())
    cells = {(c["method"], c["beta"], c["metric"]): c for c in data["cells"]}
    return spec, runs, paths, cells


def test_paired_t_by_hand():
    # diffs 6, 3, 7: mean 16/3, sample sd sqrt(13/3), se = sd / sqrt(3), t = mean / se, 2 degrees of freedom
    d = paired_difference([46.0, 53.0, 52.0], [0, 1, 2], [40.0, 50.0, 45.0], [0, 1, 2])
    mean, sd = 16 / 3, math.sqrt(13 / 3)
    se = sd / math.sqrt(3)
    t = mean / se
    # Student t with 2 dof in closed form: P(T > t) = (1 - t / sqrt(t^2 + 2)) / 2, quantile q: (2q - 1) / sqrt(2q(1 - q))
    p = 1 - t / math.sqrt(t * t + 2)
    t975 = 0.95 / math.sqrt(2 * 0.975 * 0.025)
    assert d.mean == pytest.approx(mean, rel=1e-12) and d.diffs == (6.0, 3.0, 7.0)
    assert d.p_value == pytest.approx(p, rel=1e-9) and p == pytest.approx(0.0472, abs=1e-4)
    assert (d.ci_low, d.ci_high) == (pytest.approx(mean - t975 * se, rel=1e-9), pytest.approx(mean + t975 * se, rel=1e-9))
    assert d.ci_low == pytest.approx(0.1622, abs=1e-4) and d.significant  # the interval just excludes 0
    # the same numbers unpaired: FedAvg's seed spread (std 5) hides the difference
    assert welch_p(statistics.fmean([46, 53, 52]), statistics.stdev([46, 53, 52]), 3, 45.0, 5.0, 3) > 0.2
    # only the shared seeds pair; one shared seed: a difference without an interval
    assert paired_difference([5.0, 7.0], [0, 2], [1.0, 2.0, 3.0], [0, 1, 2]).diffs == (4.0, 4.0)
    one = paired_difference([5.0], [1], [1.0, 2.0], [0, 1])
    assert one.diffs == (3.0,) and one.ci_low is None and one.p_value is None and not one.significant
    assert paired_difference([5.0], [3], [1.0], [0]) is None


def test_binomial_se_and_best_with_ties():
    assert binomial_se(40.0, 500) == pytest.approx(100 * math.sqrt(0.4 * 0.6 / 500))  # 2.19 pp
    assert binomial_se(50.0, 100) == pytest.approx(5.0) and binomial_se(100.0, 10) == 0.0
    # best A 50 +- 4 reaches down to 46: B (44 + 3 = 47) overlaps, C (40 + 5 = 45) does not
    assert best_with_ties({"A": (50.0, 4.0), "B": (44.0, 3.0), "C": (40.0, 5.0), "D": (None, None)}) == {"A", "B"}
    assert best_with_ties({}) == set()


def test_table2_paired_columns_match_the_hand_computation(table2):
    _, _, paths, cells = table2
    bm = cells[("FedBM", 0.05, "accuracy")]["paired"]
    hand = paired_difference(ACC[("FedBM", 0.05)], [0, 1, 2], ACC[("FedAvg", 0.05)], [0, 1, 2])
    assert bm["diffs"] == [6.0, 3.0, 7.0] and bm["p_value"] == pytest.approx(hand.p_value, rel=1e-12)
    assert bm["ci95"] == [pytest.approx(hand.ci_low), pytest.approx(hand.ci_high)] and bm["significant"]
    f1 = cells[("FedBM", 0.05, "f1")]["paired"]  # F1 = accuracy - 10 in both rows: the same differences
    assert f1["diffs"] == [6.0, 3.0, 7.0]
    assert cells[("FedBM", 0.1, "accuracy")]["paired"]["seeds"] == [0, 1]  # seed 2 missing: pairs seeds 0, 1
    cb = cells[("FedCB", 0.1, "accuracy")]["paired"]
    assert cb["diffs"] == [1.0, 1.0, 1.0] and cb["ci95"] == [1.0, 1.0] and cb["p_value"] == 0.0
    assert cells[("FedAvg", 0.05, "accuracy")]["paired_note"] == "baseline"
    rep = cells[("FedRep (per-client)", 0.05, "accuracy")]
    assert rep["paired"] is None and rep["paired_note"] == "not comparable: per_client evaluation"
    md = Path(paths["md"]).read_text()
    # each row without the ids of its departures (tests/reporting/test_departures.py checks those)
    lines = {line.split(" | ")[0][2:]: line for line in re.sub(r" <sup>[^<]*</sup>", "", md).splitlines()
             if line.startswith("| ")}
    assert lines["FedBM"].startswith(f"| FedBM | **50.33 ± 3.79** | +5.33 [{hand.ci_low:+.2f}, {hand.ci_high:+.2f}] * |")
    assert lines["FedCB"].startswith("| FedCB | **45.67 ± 4.16** | +0.67 [-3.13, +4.46] | ")  # tied: bold, not significant
    assert lines["FedAvg"].startswith("| FedAvg | **45.00 ± 5.00** | (reference) |")
    assert "| FedRep (per-client) | 31.00 ± 1.00 | — |" in lines["FedRep (per-client)"]
    with open(paths["csv"]) as fh:
        row = next(r for r in csv.DictReader(fh) if (r["method"], r["beta"], r["metric"]) == ("FedBM", "0.05", "accuracy"))
    assert row["baseline"] == "FedAvg" and float(row["paired_p"]) == pytest.approx(hand.p_value)
    assert row["paired_n"] == "3" and row["best"] == "1"


def test_table2_drops_all_na_paper_columns_and_bolds_best_with_ties(table2):
    _, _, paths, cells = table2
    md = Path(paths["md"]).read_text()
    header = next(line for line in md.splitlines() if line.startswith("| Method"))
    assert header == ("| Method | β=0.05 Acc ours | β=0.05 Acc Δ FedAvg [95% CI] | β=0.05 F1 ours | β=0.05 F1 Δ FedAvg "
                      "[95% CI] | β=0.1 Acc ours | β=0.1 Acc Δ FedAvg [95% CI] | β=0.1 F1 ours | β=0.1 F1 Δ FedAvg "
                      "[95% CI] |")
    assert "No paper (fedbm, fedcb) has a number for these cells: the paper columns are left out." in md
    # β=0.05 accuracy: FedBM 50.33 ± 3.79 is best (down to 46.55); FedAvg (45 + 5) and FedCB (45.67 + 4.16)
    # overlap it; Central (81) is a reference and FedRep (per-client) is evaluated otherwise: never bold
    bold = {k[0] for k, c in cells.items() if k[1:] == (0.05, "accuracy") and c["best"]}
    assert bold == {"FedBM", "FedAvg", "FedCB"}
    # β=0.1 accuracy: FedBM 71 ± 1.41 (down to 69.59); FedCB 63 + 2 and FedAvg 62 + 2 do not reach it
    assert {k[0] for k, c in cells.items() if k[1:] == (0.1, "accuracy") and c["best"]} == {"FedBM"}


def test_table2_test_set_standard_error(table2):
    _, _, paths, cells = table2
    fedavg = cells[("FedAvg", 0.05, "accuracy")]
    want = statistics.fmean(100 * math.sqrt(a / 100 * (1 - a / 100) / N_TEST) for a in ACC[("FedAvg", 0.05)])
    assert fedavg["test_se"] == pytest.approx(want) and fedavg["n_test"] == N_TEST
    assert cells[("FedAvg", 0.05, "f1")]["test_se"] is None  # a binomial error is an accuracy's
    assert cells[("FedRep (per-client)", 0.05, "accuracy")]["test_se"] is None  # a mean over clients' splits
    ses = [c["test_se"] for c in cells.values() if c["test_se"] is not None]
    md = Path(paths["md"]).read_text()
    assert (f"one run's accuracy on the {N_TEST} test images varies by 100·sqrt(p(1 − p)/n) = "
            f"{min(ses):.2f}–{max(ses):.2f} pp from the test sample alone") in md


def test_table2_curves_are_small_multiples(table2):
    spec, _, paths, _ = table2
    rows = len(spec.rows)  # 22 panels: 4 rows of 6
    with Image.open(paths["curves"]) as img:
        assert img.size == (round(2.5 * 6 * 110), round((2.0 * math.ceil(rows / 6) + 0.9) * 110))


def test_baseline_must_be_a_row(table2, tmp_path):
    spec, runs, _, _ = table2
    with pytest.raises(FedbenchError, match="baseline 'FedAvgg' is not a row label"):
        render_table(dataclasses.replace(spec, baseline="FedAvgg", baseline_given=True), runs, str(tmp_path))
    paths = render_table(dataclasses.replace(spec, baseline=None, baseline_given=True), runs, str(tmp_path))  # null: no paired columns
    assert "Δ FedAvg" not in Path(paths["md"]).read_text()
