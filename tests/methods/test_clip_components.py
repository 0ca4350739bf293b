"""Building blocks of the CLIP methods: encoders, feature cache, losses, heads, FST-CBDG pieces."""

from __future__ import annotations

import itertools
import math
import time

import pytest
import torch
import torch.nn.functional as F

from bench.core.errors import FedbenchError
from lightning_modules.components.clip_heads import FeatureAttention, FedClipAdapter, zero_shot_head
from lightning_modules.components.clip_losses import clip_contrastive_loss, lmmd_loss
from lightning_modules.components.clip_models import FrozenClip, load_clip, preprocess_uint8
from lightning_modules.components.feature_cache import cached_image_features, cached_text_features
from lightning_modules.components.fst_cbdg import (
    class_balanced_counts,
    estimate_sigma,
    sample_text_features,
    self_training_loss,
    text_sampling_loss,
    update_soft_labels,
)


@pytest.fixture(scope="module")
def tiny_clip() -> FrozenClip:
    return load_clip("tiny-random")


# ---------------------------------------------------------------- encoders and preprocessing


def test_tiny_random_clip_is_frozen_and_identical_across_builds(tiny_clip: FrozenClip) -> None:
    other = load_clip("tiny-random")
    a, b = tiny_clip.model.state_dict(), other.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not tiny_clip.model.training
    assert not any(p.requires_grad for p in tiny_clip.model.parameters())
    assert (tiny_clip.image_size, tiny_clip.embed_dim) == (32, 64)
    assert tiny_clip.logit_scale == pytest.approx(100.0, rel=1e-5)
    x = torch.randn(3, 3, 32, 32)
    feats = tiny_clip.encode_images(x)
    assert feats.shape == (3, 64) and not feats.requires_grad
    assert torch.equal(feats, other.encode_images(x))
    texts = tiny_clip.encode_texts(["a photo of a cat", "a photo of a dog"])
    assert texts.shape == (2, 64) and not torch.allclose(texts[0], texts[1])


@pytest.mark.parametrize("name", ["vit-b-16", "rn50", "biomedclip"])
def test_pretrained_clip_offline_fails_fast_naming_tiny_random(name, tmp_path, monkeypatch) -> None:
    import huggingface_hub.constants
    import open_clip  # noqa: F401 - its ~5 s import is not part of the failure time

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    start = time.perf_counter()
    with pytest.raises(FedbenchError, match="tiny-random"):
        load_clip(name, cache_dir=str(tmp_path))
    assert time.perf_counter() - start < 10.0


def test_unknown_clip_name_is_a_user_error() -> None:
    with pytest.raises(FedbenchError, match="vit-b-16"):
        load_clip("vit-b-61")


def test_preprocess_grayscale_resize_and_normalise() -> None:
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    flat = torch.full((2, 1, 20, 40), 100, dtype=torch.uint8)  # non-square grayscale
    out = preprocess_uint8(flat, 32, mean, std)
    assert out.shape == (2, 3, 32, 32) and out.dtype == torch.float32
    for c in range(3):  # a constant image stays constant through bicubic resize + crop
        assert torch.allclose(out[:, c], torch.tensor((100 / 255 - mean[c]) / std[c]), atol=1e-6)
    img = torch.randint(0, 256, (1, 1, 16, 16), dtype=torch.uint8)
    same_size = preprocess_uint8(img, 16, mean, std)
    assert torch.allclose(same_size[0, 2], (img[0, 0].float() / 255 - 0.6) / 0.3, atol=1e-6)
    with pytest.raises(FedbenchError, match="channels"):
        preprocess_uint8(torch.zeros(1, 4, 8, 8, dtype=torch.uint8), 8, mean, std)


# ---------------------------------------------------------------- feature cache


def test_image_feature_cache_encodes_once_then_reads_disk(tiny_clip: FrozenClip, tmp_path) -> None:
    images = torch.randint(
        0, 256, (10, 1, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)
    )
    calls = tiny_clip.image_encoder_calls
    first = cached_image_features(
        tiny_clip, "tiny-random", images, str(tmp_path), batch_size=4, progress=False
    )
    assert tiny_clip.image_encoder_calls == calls + 3  # ceil(10 / 4) batches
    assert first.shape == (10, 64) and first.dtype == torch.float32
    direct = tiny_clip.encode_images(preprocess_uint8(images, 32, tiny_clip.mean, tiny_clip.std))
    assert torch.allclose(first, direct, atol=1e-5)

    fresh = load_clip("tiny-random")  # a new process would start from a zero counter too
    second = cached_image_features(fresh, "tiny-random", images, str(tmp_path), batch_size=4, progress=False)
    assert fresh.image_encoder_calls == 0 and torch.equal(first, second)

    changed = images.clone()
    changed[3, 0, 5, 5] ^= 1  # one bit of one pixel: a different dataset, a different cache entry
    third = cached_image_features(fresh, "tiny-random", changed, str(tmp_path), batch_size=16, progress=False)
    assert fresh.image_encoder_calls == 1 and not torch.equal(third[3], first[3])
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_text_feature_cache_encodes_once(tiny_clip: FrozenClip, tmp_path) -> None:
    prompts = ["a picture of a glioma", "a picture of a meningioma"]
    first = cached_text_features(tiny_clip, "tiny-random", prompts, str(tmp_path))
    fresh = load_clip("tiny-random")
    second = cached_text_features(fresh, "tiny-random", prompts, str(tmp_path))
    assert fresh.text_encoder_calls == 0 and torch.equal(first, second) and first.shape == (2, 64)
    cached_text_features(fresh, "tiny-random", prompts[::-1], str(tmp_path))
    assert fresh.text_encoder_calls == 1


# ---------------------------------------------------------------- FACMIC losses


def test_contrastive_loss_matches_hand_computed_clip_formula() -> None:
    img = [[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [1.0, 1.0, 0.0]]
    txt = [[1.0, 0.0, 0.0], [0.0, 1.0, 1.0], [0.0, 3.0, 0.0]]
    scale = 2.0

    def unit(v):
        n = math.sqrt(sum(a * a for a in v))
        return [a / n for a in v]

    ni, nt = [unit(v) for v in img], [unit(v) for v in txt]
    logits = [[scale * sum(a * b for a, b in zip(i, t)) for t in nt] for i in ni]

    def ce_diag(rows):
        return sum(-rows[j][j] + math.log(sum(math.exp(v) for v in rows[j])) for j in range(3)) / 3

    cols = [[logits[i][j] for i in range(3)] for j in range(3)]
    expected = (ce_diag(logits) + ce_diag(cols)) / 2
    got = clip_contrastive_loss(torch.tensor(img), torch.tensor(txt), scale)
    assert got.item() == pytest.approx(expected, rel=1e-6)


def _class_mixture(gen: torch.Generator, means: torch.Tensor, n: int, shift: float = 0.0):
    y = torch.randint(0, len(means), (n,), generator=gen)
    x = means[y] + torch.randn(n, means.shape[1], generator=gen)
    x[:, 0] += shift
    return x, y


def test_lmmd_near_zero_for_one_distribution_and_grows_with_shift() -> None:
    gen = torch.Generator().manual_seed(0)
    means = 3 * torch.randn(2, 4, generator=gen)
    source, source_y = _class_mixture(gen, means, 1000)
    losses = []
    for shift in (0.0, 0.5, 1.0, 2.0):
        target, target_y = _class_mixture(gen, means, 1000, shift)
        losses.append(lmmd_loss(source, target, source_y, F.one_hot(target_y, 2).float(), 2).item())
    assert losses[0] < 1e-2 * losses[-1]
    assert all(a < b for a, b in itertools.pairwise(losses)), losses
    same = lmmd_loss(source, source, source_y, F.one_hot(source_y, 2).float(), 2)
    assert abs(same.item()) < 1e-5


def test_lmmd_equals_per_class_kernel_mean_embedding_distance() -> None:
    """Against a naive loop over classes (soft target weights, fixed bandwidth, a source-only class)."""
    gen = torch.Generator().manual_seed(3)
    source, target = torch.randn(7, 5, generator=gen), torch.randn(6, 5, generator=gen) + 0.3
    source_y = torch.tensor([0, 0, 1, 1, 1, 2, 2])  # class 2: source only (no target argmax)
    probs = torch.softmax(torch.randn(6, 3, generator=gen) + torch.tensor([2.0, 2.0, -9.0]), dim=1)
    sigma, mul, num = 4.0, 2.0, 5

    def k(a, b):
        d = ((a - b) ** 2).sum()
        return sum(math.exp(-d / (sigma / mul**2 * mul**i)) for i in range(num))

    per_class = []
    for c in (0, 1):
        ws = (source_y == c).float() / (source_y == c).sum()
        wt = probs[:, c] / probs[:, c].sum()
        ss = sum(ws[i] * ws[j] * k(source[i], source[j]) for i in range(7) for j in range(7))
        tt = sum(wt[i] * wt[j] * k(target[i], target[j]) for i in range(6) for j in range(6))
        st = sum(ws[i] * wt[j] * k(source[i], target[j]) for i in range(7) for j in range(6))
        per_class.append(float(ss + tt - 2 * st))
    got = lmmd_loss(source, target, source_y, probs, 3, fix_sigma=sigma)
    assert got.item() == pytest.approx(sum(per_class) / 2, rel=1e-4)
    by_k = lmmd_loss(source, target, source_y, probs, 3, fix_sigma=sigma, class_average="all")
    assert by_k.item() == pytest.approx(sum(per_class) / 3, rel=1e-4)


def test_lmmd_without_shared_class_is_zero_and_differentiable() -> None:
    source = torch.randn(4, 3, requires_grad=True)
    loss = lmmd_loss(
        source, torch.randn(4, 3), torch.zeros(4, dtype=torch.long), torch.eye(2)[[1, 1, 1, 1]], 2
    )
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(source.grad, torch.zeros(4, 3))


# ---------------------------------------------------------------- heads


def test_zero_shot_head_argmax_equals_zero_shot_clip() -> None:
    gen = torch.Generator().manual_seed(5)
    text, images = torch.randn(10, 32, generator=gen), torch.randn(500, 32, generator=gen)
    normed = F.normalize(images, dim=-1)
    cosine = normed @ F.normalize(text, dim=-1).T
    for scale in (1.0, 100.0):
        head = zero_shot_head(text, scale)
        logits = head(normed)
        assert torch.equal(logits.argmax(1), cosine.argmax(1))
        assert torch.allclose(logits, scale * cosine, atol=1e-4 * scale)
        assert torch.equal(head.bias, torch.zeros(10))


@pytest.mark.parametrize("cls", [FeatureAttention, FedClipAdapter])
def test_attention_heads_mask_features_with_row_distributions(cls) -> None:
    module = cls(16)
    x = torch.randn(8, 16)
    out, att = module(x), module.attention(x)
    assert out.shape == (8, 16) and att.shape == (8, 16)
    assert torch.allclose(att.sum(dim=1), torch.ones(8), atol=1e-6) and bool((att >= 0).all())
    assert torch.allclose(out, att * x)
    out.sum().backward()
    assert all(p.grad is not None for p in module.parameters())


# ---------------------------------------------------------------- FST-CBDG


def test_soft_label_update_and_self_training_loss() -> None:
    q = torch.tensor([[0.5, 0.5], [0.2, 0.8]])
    probs = torch.tensor([[1.0, 0.0], [0.6, 0.4]])
    new = update_soft_labels(q, probs, beta=0.9)
    assert torch.allclose(new, torch.tensor([[0.55, 0.45], [0.24, 0.76]]))
    assert torch.allclose(new.sum(1), torch.ones(2))
    logits = torch.tensor([[0.0, math.log(3.0)]], requires_grad=True)  # softmax = [0.25, 0.75]
    loss = self_training_loss(logits, torch.tensor([[0.5, 0.5]]))
    assert loss.item() == pytest.approx(-(0.5 * math.log(0.25) + 0.5 * math.log(0.75)), rel=1e-6)
    loss.backward()
    assert torch.allclose(logits.grad, torch.tensor([[0.25 - 0.5, 0.75 - 0.5]]))


@pytest.mark.parametrize(
    "gamma, expected",
    [(0.0, [0, 3, 5, 1]), (0.5, [3, 6, 8, 4])],  # m_max = 5; (1 + 0.5) * 5 = 7.5 rounds to 8
)
def test_class_balanced_counts(gamma, expected) -> None:
    counts = class_balanced_counts(torch.tensor([5, 2, 0, 4]), gamma)
    assert counts.dtype == torch.long and counts.tolist() == expected
    assert class_balanced_counts(torch.tensor([4, 1]), 0.5).tolist() == [2, 5]  # 1.5 * 4 = 6


def test_sampled_text_features_counts_mean_and_reproducibility() -> None:
    text = F.normalize(torch.randn(3, 64, generator=torch.Generator().manual_seed(0)), dim=-1)
    counts, sigma = torch.tensor([2000, 0, 7]), 0.05
    z, labels = sample_text_features(text, counts, sigma, torch.Generator().manual_seed(9))
    assert z.shape == (2007, 64) and torch.bincount(labels, minlength=3).tolist() == [2000, 0, 7]
    class0 = z[labels == 0]
    assert (class0.mean(0) - text[0]).abs().max().item() < 5 * sigma / math.sqrt(2000)
    assert class0.std(0).mean().item() == pytest.approx(sigma, rel=0.05)
    again, _ = sample_text_features(text, counts, sigma, torch.Generator().manual_seed(9))
    assert torch.equal(z, again)


def test_text_sampling_loss_is_summed_cross_entropy() -> None:
    head = zero_shot_head(torch.randn(3, 8, generator=torch.Generator().manual_seed(2)))
    z, y = torch.randn(5, 8), torch.tensor([0, 0, 1, 2, 2])
    expected = -F.log_softmax(head(z), dim=1)[torch.arange(5), y].sum()
    assert text_sampling_loss(head, z, y).item() == pytest.approx(expected.item(), rel=1e-6)
    assert text_sampling_loss(head, z, y, "mean").item() == pytest.approx(expected.item() / 5, rel=1e-6)
    empty = text_sampling_loss(head, z[:0], y[:0], "mean")
    assert empty.item() == 0.0 and empty.requires_grad


def test_estimate_sigma_recovers_the_per_dimension_spread() -> None:
    gen = torch.Generator().manual_seed(4)
    text = F.normalize(torch.randn(4, 256, generator=gen), dim=-1)
    labels = torch.randint(0, 4, (3000,), generator=gen)
    feats = text[labels] + 0.01 * torch.randn(3000, 256, generator=gen)
    assert estimate_sigma(feats, text, labels) == pytest.approx(0.01, rel=0.05)


def test_sigma_tracker_keeps_the_bits_of_estimate_sigma_recomputed_every_batch() -> None:
    """FST-CBDG's sigma 'auto' after each batch's pseudo-label change: updating only the batch's rows gives
    exactly (==) what the formula over all n features gives (the formula as estimate_sigma had it)."""
    from lightning_modules.components.fst_cbdg import SigmaTracker

    def from_scratch(feats, text, labels):
        img, txt = F.normalize(feats.float(), dim=-1), F.normalize(text.float(), dim=-1)
        return math.sqrt(((img - txt[labels.long()]) ** 2).sum(dim=-1).mean().item() / img.shape[1])

    gen = torch.Generator().manual_seed(7)
    feats, text = torch.randn(1500, 512, generator=gen, dtype=torch.float64), torch.randn(10, 512, generator=gen)
    labels = torch.randint(0, 10, (1500,), generator=gen)
    tracker = SigmaTracker(feats, text, labels)
    assert tracker.sigma() == from_scratch(feats, text, labels) == estimate_sigma(feats, text, labels)
    for size in (32, 1, 7, 64, 2, 32, 500):
        rows = torch.randperm(1500, generator=gen)[:size]
        labels[rows] = torch.randint(0, 10, (size,), generator=gen)
        tracker.update(rows, labels[rows])
        assert tracker.sigma() == from_scratch(feats, text, labels)
