"""Baselines of issue 6 (part B): each method's distinctive mechanism, checked on numbers.

FedETF, FedLC, FedRS, FedFocal, FedNTD, BalanceFL and CReRF, on hand-made batches and tiny runs
(digits, simple-cnn).
"""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import kill_and_resume, run_in_process
from torch import nn

from bench.core.batches import DeviceData
from lightning_modules.base import ClientContext
from lightning_modules.components.state import FrozenModel

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

K = 4


def make_ctx(module, labels: list[int], image_shape=(1, 8, 8), seed: int = 0) -> ClientContext:
    """A client holding len(labels) random float images (float images are used as they are)."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.tensor(labels)
    images = torch.randn(len(labels), *image_shape, generator=gen)
    data = DeviceData(images, y, torch.zeros(1, image_shape[0], 1, 1), torch.ones(1, image_shape[0], 1, 1))
    global_state = {k: v.detach().clone() for k, v in module.state_dict().items() if k in module.shared_keys()}
    return ClientContext(client_id=0, round_idx=0, seed=0, data=data, indices=torch.arange(len(labels)),
                         num_classes=module.num_classes, global_state=global_state,
                         generator=torch.Generator().manual_seed(seed + 1))


def start_client(module, ctx: ClientContext):
    """The client's local objective, as the orchestrator's local update builds it (train mode)."""
    module.train()
    return module.client_objective(ctx)


def linear_model(cls, weight: torch.Tensor, bias: torch.Tensor, **kwargs):
    """A method module whose features are its inputs and whose head is the given linear map."""
    module = cls(num_classes=weight.shape[0], in_channels=1, backbone="simple-cnn", **kwargs)
    module.backbone = nn.Identity()
    module.feature_dim = weight.shape[1]
    module.head = nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        module.head.weight.copy_(weight)
        module.head.bias.copy_(bias)
    return module


# ---- FedETF ---------------------------------------------------------------------------------
def test_fedetf_classifier_is_a_fixed_simplex_etf_never_trained_or_aggregated(tiny_cfg):
    from lightning_modules.fedetf import FedETF, simplex_etf

    etf = simplex_etf(10, 10, seed=0).double()
    assert torch.allclose(etf.norm(dim=0), torch.ones(10, dtype=torch.float64), atol=1e-6)
    cos = etf.T @ etf
    off = cos[~torch.eye(10, dtype=torch.bool)]
    assert torch.allclose(off, torch.full_like(off, -1 / 9), atol=1e-6)
    assert torch.equal(simplex_etf(10, 16, seed=3), simplex_etf(10, 16, seed=3))  # same on every rank

    module = FedETF(num_classes=10, in_channels=1, backbone="simple-cnn")
    assert "head.etf" not in module.shared_keys()
    assert all(name != "head.etf" for name, _ in module.named_parameters())
    initial = {k: v.clone() for k, v in module.state_dict().items()}

    cfg = tiny_cfg(**{"method.name": "fedetf", "method.backbone": "simple-cnn", "fed.rounds": 2})
    record, final = run_in_process(cfg)
    assert torch.equal(final["head.etf"], simplex_etf(10, 10, seed=0))  # unchanged after 2 rounds
    assert not torch.equal(final["head.projection.weight"], initial["head.projection.weight"])
    assert float(final["head.temperature"]) != 1.0  # the learnable temperature is trained (and averaged)
    assert record["history"][-1]["metrics"]["test/accuracy"] > 10.0  # better than chance after 2 rounds

    # balanced feature loss: CE(beta V^T h + log n, y), absent classes counted as 1
    ctx = make_ctx(module, [0, 0, 0, 1, 2, 2])
    objective = start_client(module, ctx)
    x, y = ctx.data.images, ctx.labels
    logits = module(x)
    counts = torch.tensor([3, 1, 2, 1, 1, 1, 1, 1, 1, 1], dtype=torch.float32)
    h = F.normalize(module.head.projection(module.backbone(x)), dim=1)
    assert torch.allclose(logits, module.head.temperature * h @ module.head.etf, atol=1e-6)
    expected = F.cross_entropy(logits + counts.log(), y)
    assert torch.allclose(objective((x, y)), expected, atol=1e-6)


# ---- FedLC ----------------------------------------------------------------------------------
def test_fedlc_calibrated_loss_equals_formula():
    from lightning_modules.fedlc import FedLC

    torch.manual_seed(0)
    module = linear_model(FedLC, torch.randn(K, 3), torch.randn(K), tau=1.0)
    ctx = make_ctx(module, [0] * 16 + [1] + [3] * 81, image_shape=(3,))  # counts 16, 1, 0, 81
    objective = start_client(module, ctx)
    x = torch.randn(5, 3)
    y = torch.tensor([0, 1, 3, 3, 0])
    z = module(x).double().detach()
    n = torch.tensor([16.0, 1.0, 0.0, 81.0], dtype=torch.float64)
    expected = 0.0
    for i in range(5):  # -log( e^{z_y - n_y^-1/4} / sum_{c: n_c > 0} e^{z_c - n_c^-1/4} ), tau = 1
        terms = {c: math.exp(z[i, c] - n[c] ** -0.25) for c in range(K) if n[c] > 0}
        expected += -math.log(terms[int(y[i])] / sum(terms.values())) / 5
    assert objective((x, y)).item() == pytest.approx(expected, rel=1e-5)
    assert torch.equal(module.eval_logits(x), module(x))  # plain logits at test time

    module.tau = 0.0
    assert start_client(module, ctx)((x, y)).item() == pytest.approx(F.cross_entropy(module(x), y).item(), rel=1e-6)


# ---- FedRS ----------------------------------------------------------------------------------
def test_fedrs_scales_logits_of_absent_classes():
    from lightning_modules.fedrs import FedRS, restriction_scales

    module = linear_model(FedRS, torch.eye(K), torch.tensor([0.0, 0.0, 0.0, 1.0]), alpha=0.5)
    ctx = make_ctx(module, [0] * 5 + [2] * 2, image_shape=(K,))  # counts 5, 0, 2, 0
    objective = start_client(module, ctx)
    scales = restriction_scales(ctx.class_counts(), 0.5)
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [-2.0, 6.0, 1.0, 0.0]])
    y = torch.tensor([2, 0])
    expected_logits = torch.tensor([[1.0, 1.0, 3.0, 2.5], [-2.0, 3.0, 1.0, 0.5]])  # classes 1, 3 halved (with bias)
    assert torch.equal(module.restricted_logits(x, scales), expected_logits)
    assert objective((x, y)).item() == pytest.approx(F.cross_entropy(expected_logits, y).item(), rel=1e-6)
    assert torch.equal(module.eval_logits(x), torch.tensor([[1.0, 2.0, 3.0, 5.0], [-2.0, 6.0, 1.0, 1.0]]))

    prop = linear_model(FedRS, torch.eye(K), torch.zeros(K), alpha=0.5, proportional=True)
    prop_scales = restriction_scales(ctx.class_counts(), 0.5, proportional=True)  # alpha + (1 - alpha) n_c / max n
    assert torch.allclose(prop.restricted_logits(x[:1], prop_scales), torch.tensor([[1.0, 1.0, 3.0 * 0.7, 2.0]]))
    assert start_client(prop, ctx)((x[:1], y[:1])).item() == pytest.approx(
        F.cross_entropy(prop.restricted_logits(x[:1], prop_scales), y[:1]).item(), rel=1e-6)


# ---- FedFocal -------------------------------------------------------------------------------
def test_focal_loss_closed_form_and_cross_entropy_at_gamma_zero():
    from lightning_modules.fedfocal import FedFocal, focal_loss

    # p_t = 1/4: FL = -(3/4)^2 log(1/4)
    assert focal_loss(torch.tensor([[0.0, math.log(3.0)]]), torch.tensor([0]), 2.0).item() == pytest.approx(
        0.5625 * math.log(4.0), rel=1e-6)
    torch.manual_seed(1)
    logits, y = torch.randn(7, 5), torch.randint(0, 5, (7,))
    p = logits.softmax(1)[torch.arange(7), y]
    assert focal_loss(logits, y, 2.0).item() == pytest.approx((-(1 - p) ** 2 * p.log()).mean().item(), rel=1e-6)
    assert focal_loss(logits, y, 0.0).item() == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-6)
    assert focal_loss(logits, y, 2.0) < F.cross_entropy(logits, y)  # easy examples down-weighted

    module = linear_model(FedFocal, torch.randn(5, 3), torch.zeros(5))
    assert module.gamma == 2.0
    x = torch.randn(7, 3)
    assert module.training_step((x, y)).item() == pytest.approx(focal_loss(module(x), y, 2.0).item(), rel=1e-6)


# ---- FedNTD ---------------------------------------------------------------------------------
def test_ntd_distils_only_not_true_classes_from_the_global_model():
    from lightning_modules.fedntd import FedNTD, ntd_loss

    torch.manual_seed(2)
    logits, teacher, y = torch.randn(3, 5), torch.randn(3, 5), torch.tensor([0, 3, 4])
    expected = 0.0
    for i in range(3):  # KL(q_g || q) over the not-true classes, tau = 2
        others = [c for c in range(5) if c != int(y[i])]
        q_g = (teacher[i, others] / 2).softmax(0)
        q = (logits[i, others] / 2).softmax(0)
        expected += float((q_g * (q_g / q).log()).sum()) / 3
    assert ntd_loss(logits, teacher, y, 2.0).item() == pytest.approx(expected, rel=1e-5)
    moved_true = teacher.clone()
    moved_true[torch.arange(3), y] += torch.tensor([5.0, -7.0, 3.0])
    assert ntd_loss(logits, moved_true, y, 2.0).item() == pytest.approx(expected, rel=1e-6)  # true class ignored
    moved_other = teacher.clone()
    moved_other[0, 1] += 3.0
    assert abs(ntd_loss(logits, moved_other, y, 2.0).item() - expected) > 1e-3

    module = FedNTD(num_classes=K, in_channels=1, backbone="simple-cnn")
    assert (module.beta, module.tau) == (1.0, 1.0)
    ctx = make_ctx(module, [0, 1, 2, 3, 0, 1])
    objective = start_client(module, ctx)
    x, y = ctx.data.images, ctx.labels
    module.eval()  # the student equals the (eval-mode) teacher: the distillation term vanishes
    assert objective((x, y)).item() == pytest.approx(F.cross_entropy(module(x), y).item(), abs=1e-6)
    with torch.no_grad():
        module.head.weight.add_(torch.randn_like(module.head.weight))  # a local step moves the student only
    teacher_logits = copy.deepcopy(module)
    teacher_logits.load_state_dict(ctx.global_state, strict=False)
    expected = F.cross_entropy(module(x), y) + ntd_loss(module(x), teacher_logits(x), y, 1.0)
    assert objective((x, y)).item() == pytest.approx(expected.item(), rel=1e-5)
    assert expected.item() > F.cross_entropy(module(x), y).item() + 1e-4


# ---- BalanceFL ------------------------------------------------------------------------------
def test_balancefl_loss_sampling_and_feature_augmentation():
    from lightning_modules.balancefl import (
        BalanceFL,
        balanced_draw,
        gaussian_noise_factor,
        missing_class_distillation,
        within_class_covariance,
    )

    # class-balanced sampling: P(sample i) ~ 1 / n_{y_i}, so classes come out uniform
    labels = torch.tensor([0] * 90 + [1] * 9 + [2] * 1)
    counts = torch.bincount(labels)
    drawn = labels[balanced_draw(labels, counts, 6000, torch.Generator().manual_seed(0))]
    assert torch.allclose(torch.bincount(drawn).double() / 6000, torch.full((3,), 1 / 3, dtype=torch.float64), atol=0.03)

    # the loss: CE over present classes + KD over missing classes - 0.002 * entropy over present
    module = BalanceFL(num_classes=K, in_channels=1, backbone="simple-cnn", balanced_sampling=False,
                       feature_augmentation=False)
    ctx = make_ctx(module, [0, 0, 0, 2, 2, 0])  # classes 1 and 3 missing
    objective = start_client(module, ctx)
    x, y = ctx.data.images, ctx.labels
    with torch.no_grad():
        teacher = copy.deepcopy(module).train()(x)  # the received model, train mode, as the code's teacher
    logits = module(x)
    present, missing = torch.tensor([0, 2]), torch.tensor([1, 3])
    ce = F.cross_entropy(logits[:, present], torch.tensor([0, 0, 0, 1, 1, 0]))
    kd = -(F.softmax(teacher[:, missing] / 2, 1) * F.log_softmax(logits[:, missing] / 2, 1)).sum(1).mean()
    p = F.softmax(logits[:, present], 1)
    entropy = -(p * p.log()).sum()
    assert objective((x, y)).item() == pytest.approx((ce + kd - 0.002 * entropy).item(), rel=1e-5)
    moved = teacher.clone()
    moved[:, present] += 4.0  # teacher logits of present classes do not matter
    assert missing_class_distillation(logits, moved, missing, 2.0).item() == pytest.approx(kd.item(), rel=1e-6)

    # within-class covariance (weighted by n_c) and a noise factor L with L L^T = cov
    feats = torch.randn(7, 3, generator=torch.Generator().manual_seed(4))
    lab = torch.tensor([0, 0, 0, 1, 1, 1, 2])
    cnt = torch.bincount(lab, minlength=3)
    cov = within_class_covariance(feats, lab, cnt)
    expected_cov = (3 * torch.cov(feats[:3].T) + 3 * torch.cov(feats[3:6].T)) / 7
    assert torch.allclose(cov.float(), expected_cov, atol=1e-6)
    factor = gaussian_noise_factor(cov)
    assert torch.allclose(factor @ factor.T, cov, atol=1e-10)

    # feature augmentation: probability 1 - n_c / n_max, so the largest class is never augmented
    aug = BalanceFL(num_classes=K, in_channels=1, backbone="simple-cnn")
    ctx = make_ctx(aug, [0] * 12 + [1] * 3 + [2] * 1, seed=5)
    ctx.batch_size = 8
    objective = start_client(aug, ctx)
    noise = aug.feature_noise(ctx, FrozenModel(aug, ctx.global_state, train_mode=True))
    assert torch.allclose(noise.prob, torch.tensor([0.0, 0.75, 1 - 1 / 12, 1.0]))
    f = torch.zeros(400, aug.feature_dim)
    yy = torch.tensor([0, 1] * 200)
    out = noise(f, yy, ctx.generator)
    assert torch.equal(out[yy == 0], f[yy == 0])
    changed = (out[yy == 1] != 0).any(1).float().mean().item()
    assert changed == pytest.approx(0.75, abs=0.08)
    batches = list(aug.client_batches(ctx))  # balanced resampling of the client's data, default batch sizes
    assert [len(y) for _, y in batches] == [8, 8]
    x, y = batches[0]
    assert x.shape == (8, 1, 8, 8) and torch.isfinite(objective((x, y)))


# ---- CReRF ----------------------------------------------------------------------------------
def test_crerf_gradients_and_feature_matching():
    from lightning_modules.crerf import CReRF, classifier_gradient, matching_distance

    torch.manual_seed(3)
    w = torch.randn(K, 6, requires_grad=True)
    b = torch.randn(K, requires_grad=True)
    f, y = torch.randn(9, 6), torch.randint(0, K, (9,))
    F.cross_entropy(f @ w.T + b, y).backward()
    gw, gb = classifier_gradient(f, y, w.detach(), b.detach())
    assert torch.allclose(gw, w.grad, atol=1e-6) and torch.allclose(gb, b.grad, atol=1e-6)

    module = CReRF(num_classes=K, in_channels=1, backbone="simple-cnn", features_per_class=10, match_steps=30)
    m, d = 10, module.feature_dim
    real_w, real_b = torch.randn(K, K, d), torch.randn(K, K)
    seen = torch.tensor([True, True, False, True])
    weight, bias = module.retrained_head.weight.detach(), module.retrained_head.bias.detach()

    def distance() -> float:
        s = module.federated_features.view(K, m, d)
        return sum(float(matching_distance(*classifier_gradient(s[c], torch.full((m,), c), weight, bias),
                                           real_w[c], real_b[c])) for c in (0, 1, 3))

    before, unseen = distance(), module.federated_features.view(K, m, d)[2].clone()
    module.match_features(real_w, real_b, seen)
    assert distance() < before - 0.1
    assert torch.equal(module.federated_features.view(K, m, d)[2], unseen)  # classes nobody held: untouched


def test_crerf_evaluates_the_server_retrained_classifier(tiny_cfg):
    from bench.assembly.experiment import build_module
    from bench.assembly.run_data import build_datamodule, to_device
    from bench.engine.metrics import classification_metrics

    args = {"features_per_class": 20, "match_steps": 20, "retrain_epochs": 20}
    cfg = tiny_cfg(**{"method.name": "crerf", "method.backbone": "simple-cnn", "method.args": args, "fed.rounds": 2})
    record, final = run_in_process(cfg)
    dm = build_datamodule(cfg)
    dm.setup()
    module = build_module(cfg, dm)
    initial_features = module.federated_features.clone()
    module.load_state_dict(final)
    assert not torch.allclose(final["retrained_head.weight"], final["head.weight"], atol=1e-3)
    assert not torch.equal(final["federated_features"], initial_features)
    assert "retrained_head.weight" not in module.shared_keys()

    test = to_device(dm.test, dm, "cpu")
    x, labels = test.to_float(torch.arange(len(test.labels)))
    module.eval()
    with torch.no_grad():
        feats = module.features(x)
        retrained = F.softmax(module.retrained_head(feats), 1)
        aggregated = F.softmax(module.head(feats), 1)
    assert torch.allclose(module.eval_logits(x).softmax(1), retrained, atol=1e-6)
    assert not torch.allclose(retrained, aggregated, atol=1e-3)
    recorded = record["history"][-1]["metrics"]["test/accuracy"]
    assert classification_metrics(retrained, labels, dm.num_classes)["accuracy"] == pytest.approx(recorded, abs=1e-6)


def test_crerf_server_state_resumes_exactly(tiny_cfg):
    """The federated features and the re-trained classifier are checkpointed: a run killed after
    round 2 of 3 and resumed ends exactly where an uninterrupted run does."""
    base = {"method.name": "crerf", "method.backbone": "simple-cnn", "fed.rounds": 3, "checkpoint_every": 1,
            "method.args": {"features_per_class": 10, "match_steps": 10, "retrain_epochs": 10}}
    kill_and_resume(tiny_cfg, base)
