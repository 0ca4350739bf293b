"""Evaluation proportional to need (issue 19): the test set is scored only where validation improves
and at the final round, with the same reported metrics as scoring it every round."""
from __future__ import annotations

from conftest import run_in_process

from bench.engine.metrics import METRIC_NAMES, VAL_SCORES
from bench.tables.protocols import metric_at

BASE = {"fed.rounds": 6, "method.lr": 0.2, "partition.args.beta": 0.1}  # a high lr: validation goes up and down


def improving_rounds(history: list[dict]) -> list[int]:
    """Rounds whose validation metrics beat every earlier round's by some validation round rule."""
    out, best = [], {name: float("-inf") for name in VAL_SCORES}
    for h in history:
        scores = {name: score(h["metrics"]) for name, score in VAL_SCORES.items()}
        if any(scores[n] > best[n] for n in scores):
            out.append(h["round"])
        best = {n: max(best[n], scores[n]) for n in scores}
    return out


def test_test_set_scored_where_validation_improves_same_reported_metrics(tiny_cfg):
    every, _ = run_in_process(tiny_cfg(**BASE, **{"fed.test_rounds": "all"}, experiment="every"))
    lean, _ = run_in_process(tiny_cfg(**BASE, experiment="lean"))
    assert lean["config"]["fed"]["test_rounds"] == "val_improves"  # the default
    # what the record reports is identical: best-validation round, its test metrics, the final ones
    assert (lean["best_round"], lean["best"], lean["final"]) == (every["best_round"], every["best"], every["final"])
    # so is what a table reads from the history under every validation-based round rule
    for rule in ("best-val-acc", "best-val-sum5", "final"):
        for metric in METRIC_NAMES:
            assert metric_at(lean, metric, rule) == metric_at(every, metric, rule), (rule, metric)
    # validation every round, test only where validation improved (+ the final round), same values
    expected = sorted(set(improving_rounds(every["history"])) | {BASE["fed.rounds"] - 1})
    tested = [h["round"] for h in lean["history"] if "test/accuracy" in h["metrics"]]
    assert tested == expected and len(tested) < BASE["fed.rounds"], (tested, expected)
    for a, b in zip(lean["history"], every["history"], strict=True):
        assert a["metrics"] == {k: v for k, v in b["metrics"].items() if k.startswith("val/") or a["round"] in tested}
        assert a["eval_seconds"] > 0


def test_eval_batch_size_changes_no_metric(tiny_cfg):
    """Evaluation batches of 256 (before) and the automatic size (all 359 test digits in one batch)."""
    small, _ = run_in_process(tiny_cfg(**{"fed.eval_batch_size": 256, "fed.rounds": 2}, experiment="small"))
    large, _ = run_in_process(tiny_cfg(**{"fed.rounds": 2}, experiment="large"))
    for a, b in zip(small["history"], large["history"], strict=True):
        assert a["metrics"].keys() == b["metrics"].keys()
        for k, v in a["metrics"].items():
            assert abs(v - b["metrics"][k]) <= 1e-9, (k, v, b["metrics"][k])


def test_automatic_eval_batch_fits_the_device():
    """On a CPU the automatic evaluation batch holds 2**19 input values (cache-sized: 668 images of 28 px,
    the fastest measured, bench/engine/evaluation.py); on a GPU 2**21; an explicit size wins."""
    import torch

    from bench.core.batches import DeviceData
    from bench.engine.evaluation import eval_batch_size

    def data(shape):
        return DeviceData(torch.zeros(shape, dtype=torch.uint8), torch.zeros(shape[0], dtype=torch.long),
                          torch.zeros(1, shape[1], 1, 1), torch.ones(1, shape[1], 1, 1))

    assert eval_batch_size(data((4, 1, 28, 28))) == 668
    assert eval_batch_size(data((4, 1, 16, 16))) == 2048
    assert eval_batch_size(data((4, 3, 224, 224))) == 256  # the floor
    assert eval_batch_size(data((4, 1, 28, 28)), 100) == 100
