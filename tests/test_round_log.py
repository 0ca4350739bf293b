"""The round's training loss in the history (issue 32): the mean of every local step's loss over the
round's clients, weighted by batch size (as sample-weighted aggregation weighs clients), gathered through
the round's one all-reduce, the same with 1 and 2 ranks."""
from __future__ import annotations

import pytest
from conftest import run_in_process

from lightning_modules.fedavg import FedAvg


def test_train_loss_is_the_sample_weighted_mean_of_the_local_steps(tiny_cfg, monkeypatch):
    seen: list[tuple[int, float, int]] = []
    original = FedAvg.training_step

    def spy(self, batch):
        loss = original(self, batch)
        seen.append((self._round, float(loss.detach()), len(batch[1])))
        return loss

    monkeypatch.setattr(FedAvg, "training_step", spy)
    cfg = tiny_cfg(**{"fed.rounds": 2, "fed.local_epochs": 2})
    from bench.federation import Federation

    run_round = Federation.run_round

    def tag(self, r):
        self.module._round = r
        return run_round(self, r)

    monkeypatch.setattr(Federation, "run_round", tag)
    record, _ = run_in_process(cfg)
    for entry in record["history"]:
        steps = [(loss, n) for r, loss, n in seen if r == entry["round"]]
        expected = sum(loss * n for loss, n in steps) / sum(n for _, n in steps)
        assert entry["train_loss"] == pytest.approx(expected, rel=1e-6)
        assert sum(n for _, n in steps) == entry["samples_trained"]  # every step of both local epochs counted
