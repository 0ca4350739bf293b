"""FST-CBDG's table rows beyond the method itself: FedNTD on the CLIP probe, the loss and sampling
ablations (Tables 3-4) and L_tSamp trained centrally; tiny random CLIP on sklearn digits."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import run_in_process
from test_clip_methods import clip_cfg, prepared  # noqa: F401  (clip_cfg is a fixture)

from bench.core.errors import FedbenchError
from bench.core.seeding import torch_generator
from lightning_modules.base import ClientContext
from lightning_modules.components.fst_cbdg import self_training_loss, text_sampling_loss


def test_clip_fc_fedntd_distils_the_global_probe_on_the_not_true_classes(clip_cfg):  # noqa: F811
    _, module, (train, _, _) = prepared(clip_cfg("clip-fc-fedntd"))
    global_state = {k: v.clone() for k, v in module.state_dict().items()}
    ctx = ClientContext(0, 0, 0, train, torch.arange(20), 10, global_state, torch_generator(1))
    x, y = train.to_float(torch.arange(6))
    objective = module.client_objective(ctx)
    ce = F.cross_entropy(module(x), y)
    assert math.isclose(float(objective((x, y))), float(ce), rel_tol=1e-6)  # local = global: no NTD term
    with torch.no_grad():
        module.head.weight.mul_(1.5).add_(0.02)
    z = F.normalize(x, dim=-1)
    local, teacher = z @ module.head.weight.T + module.head.bias, z @ global_state["head.weight"].T
    hand = 0.0
    for i, t in enumerate(y.tolist()):
        keep = [k for k in range(10) if k != t]
        p = torch.softmax(teacher[i, keep], 0)
        hand += float((p * (p.log() - torch.log_softmax(local[i, keep], 0))).sum())
    expected = float(F.cross_entropy(local, y)) + hand / 6
    assert math.isclose(float(objective((x, y))), expected, rel_tol=1e-5)
    assert set(module.state_dict()) == {"head.weight", "head.bias"}


def batch_of(module, ctx):
    module.train()
    batches = module.client_batches(ctx)
    batches.set_epoch(0)
    return next(iter(batches))


@pytest.mark.parametrize("args", [{"ist_weight": 0.0}, {"tsamp_weight": 0.0}])
def test_each_loss_alone(clip_cfg, args):  # noqa: F811
    _, module, (train, _, _) = prepared(clip_cfg("fst-cbdg", {"sigma": 0.05, **args}))
    ctx = ClientContext(0, 0, 0, train, torch.arange(0, 200, 2), 10, {}, torch_generator(5), batch_size=32)
    x, rows = batch = batch_of(module, ctx)
    q = module.soft_labels(ctx)[rows].clone()
    logits = module(x)
    q_new = 0.9 * q + 0.1 * torch.softmax(logits, -1).detach()
    before = ctx.generator.get_state()
    loss = module.client_objective(ctx)(batch)  # updates q, then draws (Eqs. 5, 7) when L_tSamp is on
    ctx.generator.set_state(before)
    z, z_labels = module.synthetic_pool(ctx)  # the same draw, from the updated q
    ist, tsamp = self_training_loss(logits, q_new), text_sampling_loss(module.head, z, z_labels)  # Eq. 6's sum
    assert len(z) > 0
    expected = tsamp if args.get("ist_weight") == 0.0 else ist
    assert math.isclose(float(loss), float(expected), rel_tol=1e-6)
    with pytest.raises(FedbenchError, match="not both 0"):
        prepared(clip_cfg("fst-cbdg", {"ist_weight": 0.0, "tsamp_weight": 0.0}))


def test_equal_sampling_draws_the_same_count_for_every_class(clip_cfg):  # noqa: F811
    _, module, (train, _, _) = prepared(clip_cfg("fst-cbdg", {"sampling": "equal", "sigma": 0.05}))
    ctx = ClientContext(0, 0, 0, train, torch.arange(0, 303, 3), 10, {}, torch_generator(5), batch_size=32)
    module.soft_labels(ctx)
    _, z_labels = module.synthetic_pool(ctx)
    assert torch.bincount(z_labels, minlength=10).tolist() == [10] * 10  # round(101 / 10) per class
    _, balanced, _ = prepared(clip_cfg("fst-cbdg", {"sigma": 0.05}))
    ctx2 = ClientContext(0, 0, 0, train, torch.arange(0, 303, 3), 10, {}, torch_generator(5), batch_size=32)
    m = torch.bincount(balanced.soft_labels(ctx2).argmax(1), minlength=10)
    counts = torch.bincount(balanced.synthetic_pool(ctx2)[1], minlength=10)
    assert torch.equal(counts + m, torch.full((10,), int(m.max())))  # Eq. 7 with gamma 0
    with pytest.raises(FedbenchError, match="sampling.*must be one of"):
        prepared(clip_cfg("fst-cbdg", {"sampling": "uniform"}))


def test_tsamp_centralized_trains_one_client_on_the_pooled_unlabeled_data(clip_cfg):  # noqa: F811
    record, state = run_in_process(clip_cfg("fst-cbdg-central", {"ist_weight": 0.0}, **{"fed.rounds": 2}))
    assert [h["samples_trained"] for h in record["history"]] == [record["splits"]["train"]] * 2
    assert record["splits"]["val"] == 0 or "val/accuracy" not in record["history"][-1]["metrics"]
    assert set(state) == {"head.weight", "head.bias"}


def test_sigma_auto_kept_per_batch_trains_the_bits_of_recomputing_it(clip_cfg, monkeypatch):  # noqa: F811
    """The SigmaTracker path (sigma 'auto', the default) against estimate_sigma over all the client's features
    at every batch (the code before it): the same final weights and metrics, bit for bit."""
    from lightning_modules.fst_cbdg import FstCbdg

    fast, fast_state = run_in_process(clip_cfg("fst-cbdg", experiment="tracked", **{"fed.rounds": 2}))
    monkeypatch.setattr(FstCbdg, "sigma_tracker", lambda self, ctx: None)
    slow, slow_state = run_in_process(clip_cfg("fst-cbdg", experiment="recomputed", **{"fed.rounds": 2}))
    assert set(fast_state) == set(slow_state) and all(torch.equal(fast_state[k], slow_state[k]) for k in fast_state)
    assert [h["metrics"] for h in fast["history"]] == [h["metrics"] for h in slow["history"]]
