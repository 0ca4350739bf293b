"""Issue 42, item 4: a model that becomes NaN/inf stops the run with one clear error, never a silent record.

The federation checks every client's model after its local training and, once a round, the aggregated global
state after the server step (one isfinite reduction each, never per step). Under bf16-mixed the error names
a zero-variance BatchNorm batch amplifying bf16 rounding as a possible cause and --precision 32-true (the CPU's
oneDNN case that sent real runs to NaN is refused before the rounds, tests/assembly/test_bf16_cause.py). Faults are
injected here.
"""
from __future__ import annotations

import csv
import math

import pytest
import torch
from conftest import digits_run_argv
from test_bad_input import written_files

from bench.cli import main
from bench.engine.health import check_finite_state
from lightning_modules.base import FederatedModule
from lightning_modules.server_part import ServerPart

BF16_ADVICE = "Use --precision 32-true"


def run(tmp_path, capsys, *extra: str) -> tuple[int, str]:
    code = main(digits_run_argv(tmp_path) + ["--accelerator", "cpu", *extra])
    return code, capsys.readouterr().err


def poison_server_step(monkeypatch, at_round: int) -> None:
    """The server step of round ``at_round`` leaves one NaN in the global model's last conv weight."""
    original = ServerPart.step

    def server_step(self, global_state, extras, round_idx, server):
        original(self, global_state, extras, round_idx, server)
        if round_idx == at_round:
            global_state["backbone.body.8.weight"].view(-1)[0] = math.nan

    monkeypatch.setattr(ServerPart, "step", server_step)


def test_a_global_model_that_becomes_nan_in_the_last_round_stops_the_run_and_writes_nothing(
        tmp_path, capsys, monkeypatch):
    """Before: NaN from the last round's aggregate/server step reached the record silently (exit 0, metrics
    of a NaN model); an earlier round's NaN was only caught after the next round's local training."""
    poison_server_step(monkeypatch, at_round=1)  # digits_run_argv runs 2 rounds
    code, err = run(tmp_path, capsys)
    assert code == 2, err
    assert ("The model became NaN/inf after aggregation and the server step of round 1 (backbone.body.8.weight) "
            "although the loss stayed finite. Lower method.lr (now 0.01, sgd).") in err
    assert err.count("NaN/inf") == 1 and "Traceback" not in err
    # no record; the per-round CSV log holds the finished round 0 only, as after any failed run
    (log,) = written_files(tmp_path)
    assert log == "runs/default/csv/fedavg_digits_dir0.5_c4_s0/version_0/metrics.csv"
    rows = list(csv.DictReader((tmp_path / log).open()))
    assert [r["round"] for r in rows] == ["0"] and math.isfinite(float(rows[0]["train/loss"]))


def test_the_round_a_global_nan_appears_is_the_round_named(tmp_path, capsys, monkeypatch):
    """A NaN from round 0's server step is named at round 0, not after round 1's local training."""
    poison_server_step(monkeypatch, at_round=0)
    code, err = run(tmp_path, capsys)
    assert code == 2 and "after aggregation and the server step of round 0 (backbone.body.8.weight)" in err


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_a_client_model_gone_nan_names_the_bf16_cause_and_32_true_only_under_bf16(
        tmp_path, capsys, monkeypatch, precision):
    original = FederatedModule.on_client_end

    def on_client_end(self, ctx):
        original(self, ctx)
        if ctx.round_idx == 0:
            with torch.no_grad():
                self.state_dict()["backbone.body.4.weight"].view(-1)[0] = math.inf

    monkeypatch.setattr(FederatedModule, "on_client_end", on_client_end)
    code, err = run(tmp_path, capsys, "--precision", precision)
    assert code == 2, err
    assert "The model became NaN/inf after local training in round 0, client " in err
    assert "(backbone.body.4.weight) although the loss stayed finite." in err
    if precision == "bf16-mixed":
        assert ("Under --precision bf16-mixed a possible cause is bf16 rounding amplified by a BatchNorm that sees "
                "a batch of (near) zero variance, e.g. identical images at a 1x1 feature map") in err
        assert BF16_ADVICE in err and "Lower method.lr" not in err
    else:
        assert "Lower method.lr (now 0.01, sgd)." in err and "bf16" not in err
    assert written_files(tmp_path) == []  # round 0 failed: no record, no log


def test_the_finite_check_names_the_first_bad_tensor_in_state_order():
    from bench.engine.health import nonfinite_hint

    state = {"a": torch.ones(2), "steps": torch.tensor(3), "b": torch.tensor([1.0, math.nan]),
             "c": torch.tensor([math.inf])}
    check_finite_state({"a": torch.ones(2), "steps": torch.tensor(3)}, "x", "y")  # finite: no error
    with pytest.raises(Exception, match=r"^The model became NaN/inf in round 4 \(b, c\) although the loss stayed "
                                        r"finite\. Use 32-true\.$"):
        check_finite_state(state, "in round 4", "Use 32-true.")
    assert nonfinite_hint("64-true", 0.5, "adam") == "Lower method.lr (now 0.5, adam)."
    assert BF16_ADVICE in nonfinite_hint("bf16-mixed", 0.5, "adam")
