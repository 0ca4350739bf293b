"""The round's training loss in the history (issue 32): the mean of every local step's loss over the
round's clients, weighted by batch size (as sample-weighted aggregation weighs clients), gathered through
the round's one all-reduce, the same with 1 and 2 ranks."""
from __future__ import annotations

import pytest
from conftest import run_in_process

from lightning_modules.fedavg import FedAvg

pytestmark = pytest.mark.slow  # end-to-end (>= 6 s): make test-fast leaves this file out


def test_train_loss_is_the_sample_weighted_mean_of_the_local_steps(tiny_cfg, monkeypatch):
    from bench.assembly.run_outputs import RunObserver

    seen: list[tuple[int, float, int]] = []
    steps_of_the_round: list[tuple[float, int]] = []
    original = FedAvg.training_step

    def spy(self, batch):
        loss = original(self, batch)
        steps_of_the_round.append((float(loss.detach()), len(batch[1])))
        return loss

    class Rounds(RunObserver):  # the steps since the last round ended are this round's
        def round_done(self, r: int) -> None:
            seen.extend((r, loss, n) for loss, n in steps_of_the_round)
            steps_of_the_round.clear()

    monkeypatch.setattr(FedAvg, "training_step", spy)
    cfg = tiny_cfg(**{"fed.rounds": 2, "fed.local_epochs": 2})
    record, _ = run_in_process(cfg, Rounds())
    assert {r for r, _, _ in seen} == {0, 1}
    for entry in record["history"]:
        steps = [(loss, n) for r, loss, n in seen if r == entry["round"]]
        expected = sum(loss * n for loss, n in steps) / sum(n for _, n in steps)
        assert entry["train_loss"] == pytest.approx(expected, rel=1e-6)
        assert sum(n for _, n in steps) == entry["samples_trained"]  # every step of both local epochs counted


def test_methods_expose_their_own_round_scalars(tiny_cfg, tmp_path):
    """One hook of a method's server part (ServerPart.scalars): FedBM's generator losses in the rounds it trains,
    Scaffold's control-variate norm every round; in the history, as W&B's method/<name>."""
    from bench.assembly.run_outputs import round_scalars

    gen = {"gen_steps": 2, "gen_batch": 8, "gen_base_channels": 8, "g_batch": 5, "gen_start": 2, "gen_every": 2,
           "text_cache_dir": str(tmp_path / "text")}
    record, _ = run_in_process(tiny_cfg(**{"method.name": "fedbm", "fed.rounds": 4, "partition.num_clients": 4,
                                           "fed.sample_ratio": 1.0, "method.args": gen}))
    trained = [h["round"] for h in record["history"] if h["method_scalars"]]
    assert trained == [1, 3]  # after rounds 2 and 4 (1-based), as the generator's schedule says
    assert set(record["history"][1]["method_scalars"]) == {"generator_loss", "generator_sem", "generator_div",
                                                          "generator_dis"}
    record, _ = run_in_process(tiny_cfg(**{"method.name": "scaffold", "fed.rounds": 2}))
    norms = [h["method_scalars"]["control_variate_norm"] for h in record["history"]]
    assert len(norms) == 2 and all(n > 0 for n in norms)
    logged = round_scalars(record["history"][0], {"down": 1, "up": 1})
    assert logged["method/control_variate_norm"] == norms[0]


def test_objective_terms_log_their_mean_loss_per_round(tiny_cfg, monkeypatch):
    """Each objective term a method holds (FedProx's proximal, FedNPR's NPR, MOON's, FedNTD's) gives its
    round curve, ``method/<term>_loss``: the batch-size-weighted mean of its value over the round's local
    steps, gathered in the round's one all-reduce as the training loss is. A method without terms, or a
    term that is off (mu = 0), adds none."""
    from bench.assembly.run_outputs import round_scalars
    from lightning_modules.fedprox import ProximalTerm

    seen: list[tuple[int, float, int]] = []
    original = ProximalTerm.for_client

    def spy(self, module, ctx):
        term = original(self, module, ctx)
        if term is None:
            return None

        def value(batch, f):
            v = term(batch, f)
            seen.append((ctx.round_idx, float(v.detach()), len(batch[1])))
            return v

        return value

    monkeypatch.setattr(ProximalTerm, "for_client", spy)
    record, _ = run_in_process(tiny_cfg(**{"method.name": "fedprox", "method.args": {"mu": 0.5},
                                           "fed.rounds": 3, "fed.local_epochs": 2}))
    for entry in record["history"]:
        steps = [(v, n) for r, v, n in seen if r == entry["round"]]
        assert sum(n for _, n in steps) == entry["samples_trained"]
        expected = sum(v * n for v, n in steps) / sum(n for _, n in steps)
        assert entry["method_scalars"]["prox_loss"] == pytest.approx(expected, rel=1e-6)
    assert record["history"][-1]["method_scalars"]["prox_loss"] > 0  # clients move away from the global model
    assert round_scalars(record["history"][-1], {"down": 1, "up": 1})["method/prox_loss"] == \
        record["history"][-1]["method_scalars"]["prox_loss"]
    off, _ = run_in_process(tiny_cfg(**{"method.name": "fedprox", "method.args": {"mu": 0.0}}))
    plain, _ = run_in_process(tiny_cfg(**{"method.name": "fedavg"}))
    assert all(h["method_scalars"] == {} for h in off["history"] + plain["history"])
    npr, _ = run_in_process(tiny_cfg(**{"method.name": "fednpr", "fed.rounds": 2}))
    assert all(set(h["method_scalars"]) == {"npr_loss"} and h["method_scalars"]["npr_loss"] >= 0
               for h in npr["history"])
