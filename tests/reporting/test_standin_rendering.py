"""Stand-in tables that do not mislead (issue 28.4), on small synthetic records: cells at or below chance
are marked and never bold, one seed prints no ± and no bold, a collapsed run is flagged with the round it
collapsed at, seen from the round the table prints, a method that does not train is never called
collapsed, and the legend says the test set is class-balanced only when it is."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.assembly.records import run_record_path
from bench.core.atomic_io import write_json
from bench.engine.health import collapse_warnings, method_trains
from bench.reporting.tables import render_table
from bench.scheduling.table_runner import plan_runs
from bench.tables.table_spec import TableSpec

K, N_TEST = 4, 400  # chance 25%; SE of a chance-level accuracy: 100 sqrt(.25 .75 / 400) = 2.165 pp
BALANCED = [100] * K


def spec(rows: list[dict], seeds: list[int], round_rule: str = "final", **extra) -> TableSpec:
    return TableSpec.parse({"table": "standin", "dataset": "digits", "columns": ["iid"], "seeds": seeds,
            "metrics": ["accuracy", "balanced_accuracy"], "round_rule": round_rule,
            "base": {"data": {"name": "digits"}, "partition": {"num_clients": 4}, "fed": {"rounds": 5}},
            "rows": rows, **extra}, "standin.yaml")


def record(run, acc: float, predicted: list[int] | None = None, counts: list[int] | None = BALANCED,
           warnings: tuple[str, ...] = (), val_peak: int = 4, bacc_gap: float = 0.0) -> dict:
    """Five rounds; test accuracy ``acc`` at every round, validation accuracy highest at ``val_peak``;
    ``predicted``: the classes the global model predicts per round (default all K)."""
    predicted = predicted or [K] * 5
    history = [{"round": r, "metrics": {"test/accuracy": acc, "test/balanced_accuracy": acc - bacc_gap,
                                        "test/predicted_classes": float(predicted[r]),
                                        "val/accuracy": 50.0 - abs(r - val_peak)}} for r in range(5)]
    return {"run_name": run.cfg.run_name(), "config": run.cfg.to_dict(), "method": run.cfg.method.name,
            "protocol": "global", "dataset": "digits", "backbone": "simple-cnn (from scratch)",
            "num_classes": K, "class_names": [f"c{k}" for k in range(K)],
            "partition": {"counts": [[5] * K] * 4}, "splits": {"train": 400, "val": 40, "test": N_TEST},
            **({"test_class_counts": counts} if counts is not None else {}), "history": history,
            "warnings": list(warnings)}


def render(tmp_path: Path, table: TableSpec, make) -> tuple[dict, str]:
    """Write ``make(run)`` (a record) for every run, render; (cells by (row, metric), the Markdown)."""
    runs = plan_runs(table, str(tmp_path / "runs"))
    for run in runs:
        write_json(run_record_path(run.cfg), make(run))  # rows of one method differ in lr: identity names
    paths = render_table(table, runs, str(tmp_path / "tables"))
    cells = {(c["method"], c["metric"]): c for c in json.loads(Path(paths["json"]).read_text())["cells"]}
    return cells, Path(paths["md"]).read_text()


def row_line(md: str, label: str) -> str:
    return next(line for line in md.splitlines() if line.startswith(f"| {label} |"))


ACCS = {  # per row, test accuracy for seeds 0, 1, 2
    "FedAvg": [25.0, 26.0, 24.0],  # at chance
    "Noisy": [10.0, 95.0, 91.0],  # the highest mean (65.33), but its interval reaches chance
    "FedProx": [60.0, 62.0, 64.0],  # the best row above chance
    "Edge-in": [29.0, 29.0, 29.0],  # 29 - 1.96 * 2.165 = 24.76 <= 25: at chance
    "Edge-out": [29.5, 29.5, 29.5],  # 29.5 - 4.24 = 25.26 > 25: above chance
    "Worse": [10.0, 11.0, 12.0],  # 11 + 1 + 4.24 < 25: below chance
}
METHODS = {"FedAvg": "fedavg", "Noisy": "fedprox", "FedProx": "fedprox", "Edge-in": "fedprox", "Edge-out": "fedprox",
           "Worse": "fedprox"}


def chance_table(tmp_path: Path, seeds: list[int]) -> tuple[dict, str]:
    rows = [{"label": label, "method": {"name": METHODS[label], **({"lr": 0.01 + i / 1000} if i else {})}}
            for i, label in enumerate(ACCS)]  # distinct lrs: distinct runs of one method
    return render(tmp_path, spec(rows, seeds), lambda run: record(run, ACCS[run.label][run.seed]))


def test_a_chance_level_row_is_marked_and_never_bold(tmp_path):
    cells, md = chance_table(tmp_path, [0, 1, 2])
    marks = {label: cells[(label, "accuracy")]["marks"] for label in ACCS}
    assert marks == {"FedAvg": ["at chance"], "Noisy": ["at chance"], "FedProx": [], "Edge-in": ["at chance"],
                     "Edge-out": [], "Worse": ["below chance"]}
    assert cells[("FedAvg", "accuracy")]["chance"] == 25.0
    # Noisy has the highest mean and would tie FedProx under mean ± std; at chance it is never bold
    bold = {label for label in ACCS if cells[(label, "accuracy")]["best"]}
    assert bold == {"FedProx"}
    assert "| FedAvg | 25.00 ± 1.00 (at chance) | (reference) | 25.00 ± 1.00 (at chance) | (reference) |" in md
    assert "**" not in row_line(md, "Noisy") and "**62.00 ± 2.00**" in row_line(md, "FedProx")
    assert "29.00 ± 0.00 (at chance)" in row_line(md, "Edge-in") and "chance" not in row_line(md, "Edge-out")
    assert "11.00 ± 1.00 (below chance)" in row_line(md, "Worse")
    assert "100/K = 25.00%" in md and "mean ± (std + 1.96·SE₀)" in md


def test_a_one_seed_table_prints_no_spread_and_no_bold(tmp_path):
    cells, md = chance_table(tmp_path, [1])
    assert "| FedProx | 62.00 | +36.00 (1 seed) | 62.00 |" in md
    assert "±" not in md.split("| Method |")[1] and "**" not in md.split("| Method |")[1]
    assert all(c["std"] is None and not c["best"] for c in cells.values())
    assert "A cell from one seed has no spread to show: no ±, never bold." in md
    assert "26.00 (at chance)" in row_line(md, "FedAvg")  # the test-set term alone reaches chance


COLLAPSING = [4, 3, 1, 1, 1]  # one class from round 2 on


def collapse_table(tmp_path: Path, round_rule: str, make) -> tuple[dict, str]:
    rows = [{"label": "FedAvg", "method": {"name": "fedavg"}}, {"label": "FedProx", "method": {"name": "fedprox"}}]
    return render(tmp_path, spec(rows, [0, 1], round_rule), make)


def test_a_collapsed_run_is_flagged_with_the_round_it_collapsed_at(tmp_path):
    def make(run):
        if run.label == "FedAvg":  # seed 0 collapses from round 2, seed 1 only at the last round
            return record(run, 25.0, COLLAPSING if run.seed == 0 else [4, 4, 4, 4, 1])
        return record(run, 60.0 + run.seed)

    cells, md = collapse_table(tmp_path, "final", make)
    assert cells[("FedAvg", "accuracy")]["collapsed"] == [[0, 2], [1, 4]]
    assert "(at chance; collapsed at rounds 2, 4)" in row_line(md, "FedAvg")
    assert "collapsed" not in row_line(md, "FedProx")
    assert ("- FedAvg iid: seed 0: the global model predicts a single class for every test image at round 4, "
            "the round printed: collapsed at round 2 (one class at every evaluated round since)") in md
    assert "- FedAvg iid: seed 1: the global model predicts a single class for every test image at round 4, " \
           "the round printed: collapsed at round 4;" in md


@pytest.mark.parametrize(("round_rule", "printed"), [("final", 4), ("best-val-acc", 1)])
def test_the_health_note_names_the_round_the_table_prints(tmp_path, round_rule, printed):
    """The run predicts one class at round 1 (its best-validation round) only; the record's own warning,
    written when it ran, names that best round. A table printing the final round has nothing to flag."""
    stored = ("the global model predicts a single class for every test image at the best round (1): training "
              "collapsed (lr too high or diverged); its metrics are chance level.")

    def make(run):
        if run.label == "FedAvg":
            return record(run, 40.0 + run.seed, [4, 1, 4, 4, 4], warnings=(stored,), val_peak=1)
        return record(run, 60.0 + run.seed)

    cells, md = collapse_table(tmp_path, round_rule, make)
    notes = [line for line in md.splitlines() if line.startswith("- FedAvg iid: seed")]
    if printed == 4:
        assert notes == [] and "⚠" not in md and "collapsed" not in row_line(md, "FedAvg")
        assert "collapsed" not in cells[("FedAvg", "accuracy")]
    else:
        assert len(notes) == 2 and all(f"at round {printed}, the round printed: collapsed at round 1;" in n
                                       for n in notes)
        assert "at the best round" not in md
        assert cells[("FedAvg", "accuracy")]["collapsed"] == [[0, 1], [1, 1]]


def test_a_method_that_does_not_train_is_never_called_collapsed(tmp_path):
    """Zero-shot CLIP predicting one class at every round (a random-weight CLIP) is at chance, not collapsed,
    even when its record (written before zero-shot CLIP declared ``trains = False``) says so."""
    stored = ("the global model predicts a single class for every test image at the best round (0): training "
              "collapsed (lr too high or diverged); its metrics are chance level.")
    rows = [{"label": "CLIP-ZS", "method": {"name": "clip-zs"}, "partition_independent": True},
            {"label": "FedAvg", "method": {"name": "fedavg"}}]

    def make(run):
        if run.label == "CLIP-ZS":
            return record(run, 25.0, [1] * 5, warnings=(stored,))
        return record(run, 25.0, [1] * 5)

    cells, md = render(tmp_path, spec(rows, [0, 1]), make)
    assert method_trains("clip-zs") is False and method_trains("fedavg") is True
    zs = cells[("CLIP-ZS", "accuracy")]
    assert zs["marks"] == ["at chance"] and "collapsed" not in zs and not zs.get("warnings")
    assert "collapsed" not in row_line(md, "CLIP-ZS") and "⚠" not in row_line(md, "CLIP-ZS")
    assert not any(line.startswith("- CLIP-ZS") for line in md.splitlines())
    assert "collapsed at round 0" in row_line(md, "FedAvg")  # the same history from a trained model is
    record_of_zs = {"protocol": "global", "num_classes": K, "best": {"test/predicted_classes": 1},
                    "final": {"test/predicted_classes": 1}, "history": [{"round": 0}]}
    assert collapse_warnings(record_of_zs, trains=False) == [] and len(collapse_warnings(record_of_zs)) == 1


NOTE = "The global test set is class-balanced (100 images in each of its 4 classes)"
FALLBACK = "Acc equals bAcc at every evaluated round of every global-model run"


@pytest.mark.parametrize(("counts", "bacc_gap", "expected"), [
    (BALANCED, 0.0, NOTE),
    ([150, 100, 100, 50], 3.0, None),
    (None, 0.0, FALLBACK),  # records written before they kept per-class counts
    (None, 3.0, None),
], ids=["balanced", "unbalanced", "no-counts-equal", "no-counts-differ"])
def test_the_balanced_test_set_note_appears_only_when_it_is_balanced(tmp_path, counts, bacc_gap, expected):
    rows = [{"label": "FedAvg", "method": {"name": "fedavg"}}, {"label": "FedProx", "method": {"name": "fedprox"}}]
    _, md = render(tmp_path, spec(rows, [0, 1]),
                   lambda run: record(run, 60.0 + run.seed, counts=counts, bacc_gap=bacc_gap))
    legend = md.split("| Method |")[0]
    for note in (NOTE, FALLBACK):
        assert (note in legend) == (note == expected)


def test_the_cannot_show_note_is_under_the_title(tmp_path):
    rows = [{"label": "FedAvg", "method": {"name": "fedavg"}}, {"label": "FedProx", "method": {"name": "fedprox"}}]
    why = "a random-weight CLIP has no zero-shot signal: sigma cannot change anything here."
    _, md = render(tmp_path, spec(rows, [0, 1], cannot_show=why), lambda run: record(run, 60.0 + run.seed))
    assert md.splitlines()[:4] == ["# standin_digits", "", f"**What this stand-in cannot show:** {why}", ""]


def test_per_client_rows_are_never_marked_at_chance(tmp_path):
    """A client's own test split may lack classes, so 100/K is not its chance level: per-client rows get
    no chance mark (and no balanced-test-set note: none of them is scored on the global test set)."""
    rows = [{"label": "FedAvg", "method": {"name": "fedavg"}, "fed": {"protocol": "per_client"}},
            {"label": "FedProx", "method": {"name": "fedprox"}, "fed": {"protocol": "per_client"}}]

    def make(run):
        return {**record(run, 25.0 + 40 * (run.label == "FedProx") + run.seed), "protocol": "per_client"}

    cells, md = render(tmp_path, spec(rows, [0, 1]), make)
    assert cells[("FedAvg", "accuracy")]["marks"] == [] and cells[("FedAvg", "accuracy")]["chance"] is None
    assert "(at chance)" not in md and "- at chance:" not in md and NOTE not in md
    assert "**65.50 ± 0.71**" in row_line(md, "FedProx") and "**" not in row_line(md, "FedAvg")
