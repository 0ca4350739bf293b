"""CGDE: generator shapes, diversity and BN-statistics losses, and generator training."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_modules.components.cgde_generator import (
    BNStatisticsHook,
    ConceptGenerator,
    bn_statistics_loss,
    diversity_loss,
    generate_batch,
    train_generator,
)
from lightning_modules.components.concept_distributions import ConceptDistribution
from lightning_modules.components.lkcc import lkcc_surrogate_loss


@pytest.mark.parametrize("z_dim,channels,size,n_up", [(384, 1, 28, 2), (512, 3, 32, 2), (512, 3, 128, 4)])
def test_generator_shape_and_range(z_dim, channels, size, n_up):
    torch.manual_seed(0)
    gen = ConceptGenerator(z_dim, channels, size)
    out = gen(torch.randn(3, z_dim) * 5)
    assert out.shape == (3, channels, size, size)
    assert out.min() >= 0.0 and out.max() <= 1.0 and out.std() > 0
    assert sum(isinstance(m, nn.Upsample) for m in gen.modules()) == n_up


def test_generator_128_is_the_reference_stack():
    gen = ConceptGenerator(512, 3, 128)
    assert (gen.fc.in_features, gen.fc.out_features) == (512, 128 * 8 * 8)
    convs = [(m.in_channels, m.out_channels) for m in gen.modules() if isinstance(m, nn.Conv2d)]
    assert convs == [(128, 128), (128, 128), (128, 128), (128, 64), (64, 64), (64, 3)]
    assert sum(isinstance(m, nn.BatchNorm2d) for m in gen.modules()) == 5
    assert all(m.negative_slope == 0.2 for m in gen.modules() if isinstance(m, nn.LeakyReLU))


def test_diversity_loss_by_hand():
    labels = torch.tensor([0, 0, 1, 1, 1, 2])
    images = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.5, 0.5], [1.0, 0.0], [0.3, 0.3]])
    images = images.view(6, 1, 1, 2)
    z = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 3.0], [9.0, 9.0]])
    eps = 1e-5
    # class 0: L1(x)=1, L1(z)=1.  class 1: pairs (L1(x), L1(z)) = (0.5, 1), (0.5, 1.5), (0.5, 1.5).
    class0 = 1 / (1.0 + eps)
    class1 = (1 / (0.5 + eps) + 2 / (1 / 3 + eps)) / 3
    expected = (class0 + class1) / 3  # class 2 has one sample; K = 3
    assert diversity_loss(images, z, labels, num_classes=3).item() == pytest.approx(expected, rel=1e-6)
    assert diversity_loss(images, z, torch.arange(6), num_classes=6).item() == 0.0


def test_bn_statistics_loss_zero_at_running_stats_and_hooks_removed():
    x = torch.randn(8, 3, 4, 4, generator=torch.Generator().manual_seed(0)) * 2 + 1
    bn = nn.BatchNorm2d(3)
    model = nn.Sequential(bn).train()
    bn.running_mean.copy_(x.mean(dim=(0, 2, 3)))
    bn.running_var.copy_(x.var(dim=(0, 2, 3), unbiased=False))
    assert bn_statistics_loss(model, x).item() == pytest.approx(0.0, abs=1e-5)
    assert model.training and not bn._forward_hooks
    bn.running_mean += torch.tensor([0.3, 0.4, 0.0])
    bn.running_var += torch.tensor([0.0, 0.0, 1.2])
    assert bn_statistics_loss(model, x).item() == pytest.approx(0.5 + 1.2, rel=1e-5)
    two = nn.Sequential(copy.deepcopy(bn), nn.Identity(), copy.deepcopy(bn)).eval()
    with BNStatisticsHook(two) as hook:
        two(x)
    assert len(hook.terms) == 2 and hook.loss().item() > 1.7
    assert not any(m._forward_hooks for m in two.modules())


class TinyTeacher(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 8, 3, stride=2), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.body(x), dim=1)


def _setup(seed: int = 0):
    torch.manual_seed(seed)
    teacher = TinyTeacher(8)
    anchors = F.normalize(torch.randn(3, 1, 8), dim=-1)
    dist = ConceptDistribution.from_embeddings(anchors + 0.1 * torch.randn(3, 5, 8))
    return teacher, dist


def _train(gen, teacher, dist, seed, steps=3, **kw):
    args = {"steps": steps, "batch_size": 16, "lr": 3e-3, "tau": 5.0, "lambda_div": 1.0,
            "lambda_dis": 0.1, "normalise": lambda x: (x - 0.5) / 0.5, "seed": seed}
    args.update(kw)
    return train_generator(gen, teacher, teacher, dist, **args)


def test_train_generator_deterministic_and_teacher_untouched():
    teacher, dist = _setup()
    before = copy.deepcopy(teacher.state_dict())
    teacher.train()
    gens = []
    for seed in (7, 7, 8):
        torch.manual_seed(1)
        gen = ConceptGenerator(8, 1, 16, base_channels=16)
        losses = _train(gen, teacher, dist, seed)
        assert set(losses) == {"loss", "sem", "div", "dis"} and losses["dis"] > 0
        gens.append(gen.state_dict())
    assert all(torch.equal(gens[0][k], gens[1][k]) for k in gens[0])
    assert not all(torch.equal(gens[0][k], gens[2][k]) for k in gens[0])
    after = teacher.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # weights and BN buffers
    assert all(p.grad is None and p.requires_grad for p in teacher.parameters())
    assert teacher.training and not any(m._forward_hooks for m in teacher.modules())


def test_train_generator_reduces_semantic_loss():
    teacher, dist = _setup()
    torch.manual_seed(2)
    gen = ConceptGenerator(8, 1, 16, base_channels=16)
    rng = torch.Generator().manual_seed(123)
    labels = torch.randint(3, (96,), generator=rng)
    z = dist.sample(labels, generator=rng)

    def sem() -> float:
        with torch.no_grad():
            h = teacher((gen.train()(z) - 0.5) / 0.5)
            return lkcc_surrogate_loss(h, labels, dist.mu, dist.sigma_diag, 5.0).item()

    start = sem()
    _train(gen, teacher, dist, seed=0, steps=40)
    assert sem() < start - 0.25  # measured drop ~0.4-0.5 over generator inits
    images, fake_labels = generate_batch(gen, dist, 5, torch.Generator().manual_seed(0))
    assert images.shape == (5, 1, 16, 16) and fake_labels.shape == (5,) and gen.training


def test_train_generator_switches():
    teacher, dist = _setup()
    torch.manual_seed(1)
    gen = ConceptGenerator(8, 1, 16, base_channels=16)
    only_sem = _train(gen, teacher, dist, seed=0, use_div=False, use_dis=False)
    assert only_sem["div"] == 0.0 and only_sem["dis"] == 0.0 and only_sem["loss"] == only_sem["sem"]
    results = []
    for noise_only in (False, True):
        torch.manual_seed(1)
        gen = ConceptGenerator(8, 1, 16, base_channels=16)
        results.append(_train(gen, teacher, dist, seed=0, steps=1, noise_only=noise_only))
    assert results[0]["div"] != results[1]["div"]  # conditions differ: concept vs N(0, I)


@pytest.mark.parametrize("augment", [True, False])
def test_train_generator_teacher_sees_augmented_images(augment):
    """The teacher (L_sem, L_dis) sees the public code's crop/flips of G(z), drawn from the seeded CPU
    stream after the labels and conditions; L_div and augment=False see the raw images."""
    from lightning_modules.components.cgde_generator import augment_generated

    teacher, dist = _setup()
    torch.manual_seed(1)
    gen = ConceptGenerator(8, 1, 16, base_channels=16)
    start = copy.deepcopy(gen).train()
    seen = []

    def forward(x):
        seen.append(x.detach().clone())
        return teacher(x)

    def normalise(x):
        return (x - 0.5) / 0.5

    train_generator(gen, forward, teacher, dist, steps=1, batch_size=16, lr=3e-3, tau=5.0, lambda_div=1.0,
                    lambda_dis=0.1, normalise=normalise, seed=5, augment=augment)
    rng = torch.Generator().manual_seed(5)
    labels = torch.randint(3, (16,), generator=rng)
    with torch.no_grad():
        raw = start(dist.sample(labels, generator=rng))
    assert len(seen) == 1
    if augment:
        assert torch.allclose(seen[0], normalise(augment_generated(raw, rng)), atol=1e-6)
        assert not torch.allclose(seen[0], normalise(raw), atol=1e-3)
    else:
        assert torch.allclose(seen[0], normalise(raw), atol=1e-6)


def test_augment_generated_is_one_crop_and_flip_per_batch():
    from lightning_modules.components.cgde_generator import augment_generated

    x = torch.arange(2 * 1 * 6 * 6, dtype=torch.float64).view(2, 1, 6, 6) + 1
    for seed in range(20):
        rng = torch.Generator().manual_seed(seed)
        top, left = (int(torch.randint(0, 9, (1,), generator=rng)) for _ in range(2))
        hflip, vflip = (bool(torch.rand(1, generator=rng) < 0.5) for _ in range(2))
        out = augment_generated(x, torch.Generator().manual_seed(seed))
        expected = F.pad(x, (4, 4, 4, 4))[..., top:top + 6, left:left + 6]
        expected = expected.flip(-1) if hflip else expected
        expected = expected.flip(-2) if vflip else expected
        assert out.shape == x.shape and torch.equal(out, expected)  # zero padding, same draw for both images
