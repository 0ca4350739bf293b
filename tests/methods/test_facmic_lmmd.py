"""FACMIC's L_DA in its two variants, each against a hand computation with explicit loops.

code (default): the masked source features against the UNMASKED target features, both L2-normalised;
       DSAN's five kernels exp(-d / (b 2^(i-2))), i = 0..4, b the mean off-diagonal squared distance;
       soft target weights; average over the classes present on both sides (utils/training.py,
       adaptation.py; tests/methods/test_golden_facmic.py checks it against the code's own numbers).
text:  x = I: the unmasked features on both sides; one Gaussian kernel k(a, b) = exp(-||a - b||^2 / m),
       m the median squared distance over the off-diagonal pairs of the joint batch; hard (argmax)
       target labels; sum over the classes present on both sides, divided by K (Eq. 5-6, Sec. 2.2, 3.2).
"""
from __future__ import annotations

import math
import statistics

import pytest
import torch

from lightning_modules.facmic import LMMD_VARIANTS, facmic_lmmd


def _batch():
    gen = torch.Generator().manual_seed(11)
    source = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    target = torch.randn(5, 4, generator=gen, dtype=torch.float64) + 0.4
    labels = torch.tensor([0, 0, 1, 1, 1, 2])  # class 3: on neither side
    logits = torch.randn(5, 4, generator=gen, dtype=torch.float64) + torch.tensor([1.5, 1.5, -9.0, -9.0])
    masked = source * torch.softmax(torch.randn(6, 4, generator=gen, dtype=torch.float64), dim=1)
    return source, masked, target, labels, torch.softmax(logits, dim=1)


def _sq(a, b) -> float:
    return float(((a - b) ** 2).sum())


def _by_hand(source, target, labels, target_w, kernel, classes, divide_by) -> float:
    total = 0.0
    for c in classes:
        ws = [(1.0 if int(y) == c else 0.0) for y in labels]
        ws = [w / sum(ws) for w in ws]
        wt = [float(w) for w in target_w[:, c]]
        wt = [w / sum(wt) for w in wt]
        ss = sum(ws[i] * ws[j] * kernel(source[i], source[j]) for i in range(len(source)) for j in range(len(source)))
        tt = sum(wt[i] * wt[j] * kernel(target[i], target[j]) for i in range(len(target)) for j in range(len(target)))
        st = sum(ws[i] * wt[j] * kernel(source[i], target[j]) for i in range(len(source)) for j in range(len(target)))
        total += ss + tt - 2 * st
    return total / divide_by


def _off_diagonal_sq(source, target) -> list[float]:
    joint = torch.cat([source, target])
    return [_sq(joint[i], joint[j]) for i in range(len(joint)) for j in range(len(joint)) if i != j]


def test_text_variant_is_one_gaussian_kernel_on_unmasked_features_median_bandwidth_hard_labels_over_k():
    source, masked, target, labels, probs = _batch()
    assert sorted(LMMD_VARIANTS) == ["code", "text"]
    median = statistics.median_low(_off_diagonal_sq(source, target))  # torch.median: the lower middle value

    def kernel(a, b):
        return math.exp(-_sq(a, b) / median)

    hard = torch.nn.functional.one_hot(probs.argmax(1), 4).double()
    present = [c for c in range(4) if (labels == c).any() and (hard[:, c] > 0).any()]
    assert present == [0, 1]  # class 2 has no target argmax, class 3 nothing at all
    expected = _by_hand(source, target, labels, hard, kernel, present, divide_by=4)
    got = facmic_lmmd(source, masked, target, labels, probs, 4, "text")
    assert got.item() == pytest.approx(expected, rel=1e-6)  # the loss computes in float32


def test_code_variant_is_normalised_masked_source_against_normalised_target_five_kernels_soft_weights():
    source_raw, masked, target_raw, labels, probs = _batch()
    source, target = masked / masked.norm(dim=1, keepdim=True), target_raw / target_raw.norm(dim=1, keepdim=True)
    mean = statistics.fmean(_off_diagonal_sq(source, target))

    def kernel(a, b):
        return sum(math.exp(-_sq(a, b) / (mean / 4 * 2**i)) for i in range(5))

    present = [c for c in range(4) if (labels == c).any() and (probs.argmax(1) == c).any()]
    expected = _by_hand(source, target, labels, probs, kernel, present, divide_by=len(present))
    got = facmic_lmmd(source_raw, masked, target_raw, labels, probs, 4, "code")
    assert got.item() == pytest.approx(expected, rel=1e-6)  # the loss computes in float32
    assert facmic_lmmd(source_raw, masked, target_raw, labels, probs, 4).item() == got.item()  # the default
    # the two variants are different losses on the same batch
    assert abs(got.item() - facmic_lmmd(source_raw, masked, target_raw, labels, probs, 4, "text").item()) > 1e-3
