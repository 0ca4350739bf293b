"""FACMIC's losses: CLIP-style batch contrastive loss and LMMD (local maximum mean discrepancy).

Formulas follow FACMIC's public code (see shared notes/reference-implementations.md), which takes
its LMMD from DSAN. Where the FACMIC paper's text says otherwise, the text's variant is an option
(lightning_modules/facmic.py ``lmmd_variant: text`` combines them; which features enter is chosen there):

- bandwidth: the code uses the mean squared pairwise distance of the joint batch
  (``bandwidth="mean"``); the paper's text says the median (``bandwidth="median"``).
- class averaging: the code averages over the classes present in both the source batch and the
  target batch's argmax pseudo-labels (``class_average="present"``); the paper's Eq. (5) divides
  by K (``class_average="all"``, still summing only over present classes).
- target weights: the code uses soft pseudo-labels; the paper assigns the argmax class. Pass
  one-hot ``target_probs`` for the paper's hard assignment."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F


def clip_contrastive_loss(
    image_feats: torch.Tensor, text_feats: torch.Tensor, logit_scale: float | torch.Tensor
) -> torch.Tensor:
    """Symmetric CLIP loss over a batch of B (image, text) pairs (FACMIC Eq. 4).

    Both sides are L2-normalised; ``logits = logit_scale * img @ txt.T`` and the loss is
    ``(CE(logits, arange(B)) + CE(logits.T, arange(B))) / 2``. ``logit_scale`` is the exponentiated
    CLIP scale (about 100). As in FACMIC's code, row j's text is the prompt feature of sample j's class,
    so two samples of the same class in a batch count as each other's negatives.
    """
    img = F.normalize(image_feats.float(), dim=-1)
    txt = F.normalize(text_feats.float(), dim=-1)
    logits = logit_scale * img @ txt.T
    target = torch.arange(len(img), device=img.device)
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2


def _squared_distances(x: torch.Tensor) -> torch.Tensor:
    sq = (x * x).sum(dim=1)
    return (sq[:, None] + sq[None, :] - 2.0 * x @ x.T).clamp_min(0.0)


def gaussian_kernel_matrix(
    source: torch.Tensor,
    target: torch.Tensor,
    kernel_mul: float = 2.0,
    kernel_num: int = 5,
    fix_sigma: float | None = None,
    bandwidth: Literal["mean", "median"] = "mean",
) -> torch.Tensor:
    """Sum of ``kernel_num`` Gaussian kernels over the joint batch [ns + nt, ns + nt].

    k(x, y) = sum_i exp(-||x - y||^2 / b_i), b_i = b * kernel_mul ** (i - kernel_num // 2), where the
    base bandwidth b is ``fix_sigma`` if given, else the mean (or median) squared distance over the
    off-diagonal pairs of the joint batch. b is a constant (no gradient), as in DSAN/FACMIC.
    """
    joint = torch.cat([source, target]).float()
    dist = _squared_distances(joint)
    n = len(joint)
    if fix_sigma is not None:
        base = torch.as_tensor(float(fix_sigma), device=joint.device)
    elif bandwidth == "mean":
        base = dist.detach().sum() / max(n * n - n, 1)
    elif bandwidth == "median":
        # the lower median of the off-diagonal pairs; masking with NaN keeps the shape static (boolean
        # indexing would read the mask back to the host on a GPU)
        diag = torch.eye(n, dtype=torch.bool, device=joint.device)
        base = dist.detach().masked_fill(diag, float("nan")).nanmedian() if n > 1 else dist.new_tensor(1.0)
    else:
        raise ValueError(f"bandwidth must be 'mean' or 'median', got {bandwidth!r}")
    base = base.clamp_min(1e-12) / kernel_mul ** (kernel_num // 2)
    return sum(torch.exp(-dist / (base * kernel_mul**i)) for i in range(kernel_num))


def lmmd_loss(
    source: torch.Tensor,
    target: torch.Tensor,
    source_labels: torch.Tensor,
    target_probs: torch.Tensor,
    num_classes: int,
    kernel_mul: float = 2.0,
    kernel_num: int = 5,
    fix_sigma: float | None = None,
    *,
    bandwidth: Literal["mean", "median"] = "mean",
    class_average: Literal["present", "all"] = "present",
) -> torch.Tensor:
    """Class-conditional MMD between source features [ns, D] and target features [nt, D].

    Source weights: one-hot / per-class source batch count. Target weights: the (detached) soft
    pseudo-label columns ``target_probs`` [nt, K], each normalised to sum 1. Only classes present
    among the source labels AND the target argmax pseudo-labels count; the per-class squared MMDs
    are averaged over those classes (``class_average="present"``) or summed and divided by K
    (``"all"``). Returns 0 (with a graph) when no class is shared.
    """
    if class_average not in ("present", "all"):
        raise ValueError(f"class_average must be 'present' or 'all', got {class_average!r}")
    ns = len(source)
    s_onehot = F.one_hot(source_labels.long(), num_classes).float()
    s_count = s_onehot.sum(dim=0)
    t_probs = target_probs.detach().float()
    t_mass = t_probs.sum(dim=0)
    t_count = F.one_hot(t_probs.argmax(dim=1), num_classes).sum(dim=0)  # bincount's size would read the device
    present = ((s_count > 0) & (t_count > 0)).float()
    # no host read of the count (a sync per step on a GPU): with no shared class every weight is 0, the
    # kernels are finite (bandwidth clamped), so the loss is exactly 0, with a graph
    n_present = present.sum()
    s_w = s_onehot / s_count.clamp_min(1.0) * present
    t_w = t_probs / t_mass.clamp_min(1e-12) * present
    kernels = gaussian_kernel_matrix(source, target, kernel_mul, kernel_num, fix_sigma, bandwidth)
    k_ss, k_tt, k_st = kernels[:ns, :ns], kernels[ns:, ns:], kernels[:ns, ns:]
    loss = ((s_w @ s_w.T) * k_ss).sum() + ((t_w @ t_w.T) * k_tt).sum() - 2.0 * ((s_w @ t_w.T) * k_st).sum()
    return loss / (n_present.clamp_min(1.0) if class_average == "present" else num_classes)


def focal_smoothed_loss(logits: torch.Tensor, target: torch.Tensor, gamma: float, smoothing: float) -> torch.Tensor:
    """Focal loss with label smoothing over C = ``logits.shape[1]`` classes, mean over the rows
    (FACMIC's FedFocal, its code's FocalLossWithSmoothing):

        loss_i = -(1 - smoothing) (1 - p_iy)^gamma log p_iy - smoothing / (C - 1) sum_{k != y} log p_ik

    (the focusing factor acts on the true class only). smoothing = 0 is Lin et al.'s focal loss,
    gamma = 0 the label-smoothed cross-entropy.
    """
    log_p = F.log_softmax(logits.float(), dim=1)
    c = log_p.shape[1]
    off = smoothing / (c - 1) if c > 1 else 0.0
    weights = torch.full_like(log_p, off).scatter_(1, target.unsqueeze(1), 1.0 - smoothing)
    log_pt = log_p.gather(1, target.unsqueeze(1))
    focus = torch.ones_like(log_p).scatter_(1, target.unsqueeze(1), (1.0 - log_pt.exp()).clamp_min(0).pow(gamma))
    return -(focus * weights * log_p).sum(dim=1).mean()
