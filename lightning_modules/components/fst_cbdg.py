"""FST-CBDG's pieces (paper: ../shared/papers/fst-cbdg.txt; no public code).

- soft pseudo-labels, moving average (Eq. 4): q <- beta q + (1 - beta) f(I)
- self-training loss (Eq. 3): L_iST = -E_j[q_j . log f(I_j)], a soft-label cross-entropy; the
  paper has no entropy, diversity or confidence term, so none is added
- class-balanced counts (Eq. 7): n_k = (1 + gamma) m_max - m_k
- synthetic features (Eq. 5): z_kj ~ N(T_k, sigma^2 I)
- text sampling loss (Eq. 6): L_tSamp = -sum_k sum_j log f(z_kj)_k, a SUM over the synthetic
  instances as the paper writes it (the default); ``reduction="mean"`` (divide by their number) is
  kept as a named, non-paper option

sigma is not given by the paper: :func:`estimate_sigma` derives one from the data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F


def update_soft_labels(q: torch.Tensor, probs: torch.Tensor, beta: float = 0.9) -> torch.Tensor:
    """Eq. 4: ``beta * q + (1 - beta) * probs`` (probs detached); rows stay distributions."""
    return beta * q + (1.0 - beta) * probs.detach().to(q.dtype)


def self_training_loss(logits: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Eq. 3: mean over the batch of ``-sum_k q_jk log softmax(logits_j)_k`` (q is a constant target)."""
    return -(q.detach().to(logits.dtype) * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()


def class_balanced_counts(pseudo_label_counts: torch.Tensor, gamma: float = 0.0) -> torch.Tensor:
    """Eq. 7: synthetic counts ``n_k = round((1 + gamma) * m_max) - m_k`` as int64 [K] (half rounds up).

    ``pseudo_label_counts`` m_k are the client's images per argmax pseudo-label. Rounding applies
    only to the shared target (1 + gamma) m_max, so m_k + n_k is the same for every class.
    """
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    m = pseudo_label_counts.long()
    if m.numel() == 0:
        return m
    target = math.floor((1.0 + gamma) * int(m.max().item()) + 0.5)  # round half up
    return (target - m).clamp_min(0)


def sample_text_features(
    text_feats: torch.Tensor, counts: torch.Tensor, sigma: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 5: ``counts[k]`` draws from N(T_k, sigma^2 I) per class; returns (features [sum, D], labels).

    Features are grouped by class in label order. The noise is drawn in float32 on ``generator``'s device
    from ``generator`` alone (reproducible per client/round), then moved to ``text_feats``' device and dtype.
    """
    counts = counts.long().to(text_feats.device)
    labels = torch.repeat_interleave(torch.arange(len(text_feats), device=text_feats.device), counts)
    noise = torch.randn(
        (len(labels), text_feats.shape[1]), generator=generator, device=generator.device, dtype=torch.float32
    )
    feats = text_feats.detach()[labels] + sigma * noise.to(text_feats.device, text_feats.dtype)  # float32 draws
    return feats, labels


def text_sampling_loss(
    head: Callable[[torch.Tensor], torch.Tensor],
    z: torch.Tensor,
    z_labels: torch.Tensor,
    reduction: Literal["sum", "mean"] = "sum",
) -> torch.Tensor:
    """Eq. 6: cross-entropy of ``head(z)`` against the classes the features were sampled from.

    ``reduction="sum"`` is the paper's literal formula; ``"mean"`` divides by the number of samples.
    With no synthetic feature (all classes balanced and gamma = 0) the loss is 0.
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    logits = head(z)
    if len(z) == 0:
        return logits.sum() * 0.0
    return F.cross_entropy(logits, z_labels.long(), reduction=reduction)


def estimate_sigma(image_feats: torch.Tensor, text_feats: torch.Tensor, pseudo_labels: torch.Tensor) -> float:
    """A data-driven sigma for Eq. 5 (the paper gives none): per-dimension RMS distance between
    L2-normalised image features and their pseudo-class's normalised text feature,
    ``sqrt(mean_j ||I_j - T_{y_j}||^2 / D)``. Uses pseudo-labels only, so it stays unsupervised.
    """
    return SigmaTracker(image_feats, text_feats, pseudo_labels).sigma()


class SigmaTracker:
    """``estimate_sigma`` of a client's fixed features while its pseudo-labels change a batch at a time.

    The normalised features and each sample's squared distance ||I_j - T_{y_j}||^2 are kept; a batch
    recomputes only its own rows (``update``), so a step costs O(batch x D) instead of O(n x D): a gather,
    a normalisation and three passes over all n features per step before (about 0.7 s of CPU per step
    for 48,000 samples at D = 512). The same bits as recomputing everything: a row's sum over D does not
    depend on how many rows are summed with it (tests/methods/test_clip_components.py checks the sigma after each of
    a sequence of updates against the formula recomputed over all n features: equal, not close)."""

    def __init__(self, image_feats: torch.Tensor, text_feats: torch.Tensor, pseudo_labels: torch.Tensor) -> None:
        self.img = F.normalize(image_feats.float(), dim=-1)
        self.txt = F.normalize(text_feats.float(), dim=-1)
        self.dist = ((self.img - self.txt[pseudo_labels.long()]) ** 2).sum(dim=-1)

    def update(self, rows: torch.Tensor, pseudo_labels: torch.Tensor) -> None:
        """Rows ``rows`` of the features now carry pseudo-labels ``pseudo_labels``."""
        self.dist[rows] = ((self.img[rows] - self.txt[pseudo_labels.long()]) ** 2).sum(dim=-1)

    def sigma(self) -> float:
        return math.sqrt(self.dist.mean().item() / self.img.shape[1])
