"""Tests of FedNPR's building blocks: Sinkhorn sub-clustering, prototypes, NPR loss, BSM."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lightning_modules.components.balanced_softmax import balanced_softmax_loss, class_log_prior
from lightning_modules.components.npr import (
    assign_subclusters,
    init_prototypes,
    npr_loss,
    npr_loss_from_scores,
    npr_scores,
    npr_weight,
    sinkhorn_equipartition,
    subcluster_assignments,
    update_prototypes,
)


def _unit(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=g, dtype=dtype), dim=-1)


def _planted_blobs(
    seed: int, num_classes: int = 3, k: int = 2, dim: int = 8, n: int = 40, noise: float = 0.05
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Features forming ``k`` tight, well separated blobs per class; returns centres too."""
    g = torch.Generator().manual_seed(seed)
    centres = F.normalize(torch.randn(num_classes, k, dim, generator=g), dim=-1)
    labels = torch.arange(num_classes).repeat_interleave(k * n)
    planted = torch.arange(k).repeat_interleave(n).repeat(num_classes)
    noisy = centres[labels, planted] + noise * torch.randn(labels.numel(), dim, generator=g)
    return F.normalize(noisy, dim=1), labels, planted, centres


def _recovers(assign: torch.Tensor, labels: torch.Tensor, planted: torch.Tensor) -> bool:
    """True if, within every class, the assignment equals the planted blobs up to a swap."""
    for c in labels.unique():
        a, p = assign[labels == c], planted[labels == c]
        if not (torch.equal(a, p) or torch.equal(a, 1 - p)):
            return False
    return True


# ---------------------------------------------------------------- Sinkhorn


def test_sinkhorn_converges_to_equipartition() -> None:
    n, k = 200, 4
    scores = _unit(n, 16, seed=0, dtype=torch.float64) @ _unit(k, 16, seed=1, dtype=torch.float64).T
    plan = sinkhorn_equipartition(scores, eps=0.05, iters=100)
    assert plan.shape == (n, k) and bool((plan >= 0).all())
    torch.testing.assert_close(plan.sum(dim=1), torch.ones(n, dtype=torch.float64), rtol=0, atol=1e-9)
    torch.testing.assert_close(
        plan.sum(dim=0), torch.full((k,), n / k, dtype=torch.float64), rtol=0, atol=1e-3
    )
    # a few iterations (the default) are not converged yet, but more iterations get closer
    err = [
        (sinkhorn_equipartition(scores, 0.05, it).sum(0) - n / k).abs().max().item() for it in (3, 10, 100)
    ]
    assert err[0] > err[1] > err[2]


def test_sinkhorn_is_finite_for_small_eps_and_keeps_dtype() -> None:
    scores = torch.tensor([[1.0, -1.0], [1.0, -1.0], [-1.0, 1.0]])
    plan = sinkhorn_equipartition(scores, eps=0.001, iters=3)  # exp(1000) would overflow
    assert plan.dtype == torch.float32 and bool(torch.isfinite(plan).all())
    torch.testing.assert_close(plan.sum(1), torch.ones(3))


def test_hard_assignments_are_balanced_at_default_settings() -> None:
    n, k = 200, 4
    for seed in range(5):
        assign = assign_subclusters(_unit(n, 16, seed=seed), _unit(k, 16, seed=100 + seed))
        assert assign.dtype == torch.long and assign.shape == (n,)
        sizes = torch.bincount(assign, minlength=k)
        assert int(sizes.min()) > 0 and int(sizes.max()) <= 2 * n // k


# ---------------------------------------------------------------- prototypes


def test_init_prototypes_unit_norm_and_seeded() -> None:
    a = init_prototypes(5, 3, 16, torch.Generator().manual_seed(7))
    b = init_prototypes(5, 3, 16, torch.Generator().manual_seed(7))
    assert a.shape == (5, 3, 16) and torch.equal(a, b)
    torch.testing.assert_close(a.norm(dim=-1), torch.ones(5, 3))


def test_update_prototypes_deterministic_and_unit_norm() -> None:
    feats, labels = (
        _unit(300, 16, seed=3),
        torch.randint(0, 4, (300,), generator=torch.Generator().manual_seed(4)),
    )
    protos = init_prototypes(4, 3, 16, torch.Generator().manual_seed(5))
    first = update_prototypes(feats, labels, protos)
    second = update_prototypes(feats, labels, protos)
    assert torch.equal(first, second)
    torch.testing.assert_close(first.norm(dim=-1), torch.ones(4, 3))
    assert not torch.equal(first, protos)  # it did move


def test_update_prototype_is_normalised_member_mean() -> None:
    feats, labels = _unit(60, 8, seed=8), torch.zeros(60, dtype=torch.long)
    protos = init_prototypes(1, 3, 8, torch.Generator().manual_seed(9))
    assign = subcluster_assignments(feats, labels, protos)
    new = update_prototypes(feats, labels, protos)
    for j in range(3):
        expected = F.normalize(feats[assign == j].mean(0), dim=0)
        torch.testing.assert_close(new[0, j], expected)


def test_absent_classes_and_empty_subclusters_keep_their_prototype() -> None:
    protos = init_prototypes(3, 4, 8, torch.Generator().manual_seed(10))
    feats = _unit(2, 8, seed=11)  # two samples of class 1 cannot fill 4 sub-clusters
    labels = torch.tensor([1, 1])
    new = update_prototypes(feats, labels, protos)
    assert torch.equal(new[0], protos[0]) and torch.equal(new[2], protos[2])
    changed = [not torch.equal(new[1, j], protos[1, j]) for j in range(4)]
    assert sum(changed) == 2  # exactly the two occupied sub-clusters moved
    assert protos.data_ptr() != new.data_ptr()


def test_paper_recovers_planted_subclusters_public_code_does_not() -> None:
    for seed in range(5):
        feats, labels, planted, centres = _planted_blobs(seed)
        paper = public = init_prototypes(3, 2, 8, torch.Generator().manual_seed(1000 + seed))
        gen = torch.Generator().manual_seed(seed)
        for _ in range(3):  # a few rounds of online sub-clustering
            paper = update_prototypes(feats, labels, paper, variant="paper")
            public = update_prototypes(feats, labels, public, variant="public_code", generator=gen)
        paper_assign = subcluster_assignments(feats, labels, paper)
        public_assign = subcluster_assignments(feats, labels, public, variant="public_code", generator=gen)
        assert _recovers(paper_assign, labels, planted)
        assert not _recovers(public_assign, labels, planted)
        # paper prototypes sit on the blob centres; random assignment averages blobs together
        best_paper = torch.einsum("ckd,cjd->ckj", centres, paper).amax(-1)
        best_public = torch.einsum("ckd,cjd->ckj", centres, public).amax(-1)
        assert float(best_paper.min()) > 0.99
        assert float(best_public.max()) < 0.95


def test_public_code_needs_generator_and_is_reproducible() -> None:
    feats, labels, _, _ = _planted_blobs(0)
    protos = init_prototypes(3, 2, 8, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="generator"):
        update_prototypes(feats, labels, protos, variant="public_code")
    a = update_prototypes(
        feats, labels, protos, variant="public_code", generator=torch.Generator().manual_seed(1)
    )
    b = update_prototypes(
        feats, labels, protos, variant="public_code", generator=torch.Generator().manual_seed(1)
    )
    assert torch.equal(a, b)


# ---------------------------------------------------------------- NPR loss


def test_npr_scores_hand_computed() -> None:
    protos = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[-1.0, 0.0], [0.6, -0.8]]])  # C=2, K=2
    feats = torch.tensor([[0.6, 0.8], [0.0, -1.0]])
    expected = torch.tensor([[max(0.6, 0.8), max(-0.6, 0.36 - 0.64)], [max(0.0, -1.0), max(0.0, 0.8)]])
    torch.testing.assert_close(npr_scores(feats, protos), expected)


def test_npr_loss_matches_manual_standardised_ce() -> None:
    feats, protos = _unit(6, 8, seed=20), init_prototypes(3, 2, 8, torch.Generator().manual_seed(21))
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    s = npr_scores(feats, protos)
    z = (s - s.mean(1, keepdim=True)) / torch.sqrt(s.var(1, unbiased=False, keepdim=True) + 1e-5)
    manual = -torch.log_softmax(z, 1)[torch.arange(6), y].mean()
    torch.testing.assert_close(npr_loss(feats, y, protos), manual)


def test_npr_loss_invariant_to_constant_score_shift() -> None:
    feats, protos = _unit(8, 8, seed=22), init_prototypes(4, 3, 8, torch.Generator().manual_seed(23))
    y = torch.arange(8) % 4
    scores = npr_scores(feats, protos)
    base = npr_loss_from_scores(scores, y)
    torch.testing.assert_close(npr_loss(feats, y, protos), base)
    per_sample_shift = torch.linspace(-0.5, 0.7, 8).unsqueeze(1)
    torch.testing.assert_close(npr_loss_from_scores(scores + per_sample_shift, y), base)
    # standardisation also removes a scale (up to the LayerNorm eps), which plain CE does not
    torch.testing.assert_close(npr_loss_from_scores(3 * scores + 1, y), base, atol=1e-4, rtol=1e-4)
    assert abs(F.cross_entropy(3 * scores, y).item() - F.cross_entropy(scores, y).item()) > 1e-2


def test_npr_loss_gradient_reaches_features_not_prototypes() -> None:
    feats = _unit(10, 8, seed=24).requires_grad_(True)
    protos = init_prototypes(3, 2, 8, torch.Generator().manual_seed(25)).requires_grad_(True)
    loss = npr_loss(feats, torch.arange(10) % 3, protos)
    loss.backward()
    assert protos.grad is None
    assert feats.grad is not None and float(feats.grad.abs().sum()) > 0


def test_npr_weight() -> None:
    assert npr_weight("paper", 0.05) == 0.05
    assert npr_weight("public_code", 0.05) == 1.0
    with pytest.raises(ValueError, match="variant"):
        npr_weight("papr", 0.1)  # type: ignore[arg-type]


# ---------------------------------------------------------------- balanced softmax


def test_class_log_prior_values() -> None:
    labels = torch.tensor([0, 0, 0, 2])
    prior = class_log_prior(labels, 4)
    expected = torch.tensor([math.log(0.75 + 1e-9), math.log(1e-9), math.log(0.25 + 1e-9), math.log(1e-9)])
    torch.testing.assert_close(prior, expected)
    with pytest.raises(ValueError, match="num_classes"):
        class_log_prior(torch.tensor([0, 5]), 4)


def test_balanced_softmax_equals_ce_on_shifted_logits() -> None:
    g = torch.Generator().manual_seed(30)
    logits = torch.randn(16, 5, generator=g)
    y = torch.randint(0, 5, (16,), generator=g)
    prior = class_log_prior(torch.tensor([0, 0, 0, 1, 1, 2, 3, 3, 3, 3, 4]), 5)
    shifted = logits + prior
    manual = -(shifted[torch.arange(16), y] - torch.logsumexp(shifted, dim=1)).mean()
    torch.testing.assert_close(balanced_softmax_loss(logits, y, prior), manual)
    assert not torch.allclose(balanced_softmax_loss(logits, y, prior), F.cross_entropy(logits, y))


def test_balanced_softmax_uniform_prior_is_plain_ce() -> None:
    g = torch.Generator().manual_seed(31)
    logits, y = torch.randn(12, 4, generator=g), torch.randint(0, 4, (12,), generator=g)
    uniform = class_log_prior(torch.arange(4).repeat(3), 4)
    torch.testing.assert_close(balanced_softmax_loss(logits, y, uniform), F.cross_entropy(logits, y))
