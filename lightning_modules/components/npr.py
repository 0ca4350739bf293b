"""Non-parametric regularisation (NPR) of FedNPR: sub-cluster prototypes and their loss.

Each client keeps ``K`` unit-norm prototypes per class (``[C, K, D]``). At the start of a
round the features of each class are split into ``K`` sub-clusters by an equipartition
optimal-transport (Sinkhorn-Knopp) solve and every prototype becomes the normalised mean
of its members. The NPR loss is a cross-entropy over per-sample standardised class scores,
where a class scores the best cosine among its ``K`` prototypes.

``variant="public_code"`` reproduces what the authors' public code effectively does:
uniformly random sub-cluster assignment and an NPR weight of 1 (see
``/work/shared/notes/reference-implementations.md``).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "NPRVariant",
    "assign_subclusters",
    "init_prototypes",
    "npr_loss",
    "npr_loss_from_scores",
    "npr_scores",
    "npr_weight",
    "sinkhorn_equipartition",
    "subcluster_assignments",
    "update_prototypes",
]

NPRVariant = Literal["paper", "public_code"]
_VARIANTS: tuple[str, ...] = ("paper", "public_code")


def _check_variant(variant: str) -> None:
    if variant not in _VARIANTS:
        raise ValueError(f"unknown NPR variant {variant!r}; choose one of {_VARIANTS}")


def _sinkhorn_log_plan(scores: Tensor, eps: float, iters: int) -> Tensor:
    """Log of the Sinkhorn plan (float64, rows summing to 1); see :func:`sinkhorn_equipartition`."""
    if scores.dim() != 2:
        raise ValueError(f"scores must be [N, K], got shape {tuple(scores.shape)}")
    if eps <= 0 or iters < 0:
        raise ValueError(f"need eps > 0 and iters >= 0, got eps={eps}, iters={iters}")
    n, k = scores.shape
    log_q = scores.to(torch.float64) / eps
    if n == 0 or k == 0:
        return log_q
    log_n, log_k = math.log(n), math.log(k)
    log_q = log_q - torch.logsumexp(log_q.reshape(-1), dim=0)  # total mass 1
    for _ in range(iters):
        log_q = log_q - torch.logsumexp(log_q, dim=0, keepdim=True) - log_k  # columns sum to 1/K
        log_q = log_q - torch.logsumexp(log_q, dim=1, keepdim=True) - log_n  # rows sum to 1/N
    return log_q + log_n  # rows sum to 1, columns to ~N/K


def sinkhorn_equipartition(scores: Tensor, eps: float = 0.05, iters: int = 3) -> Tensor:
    """SwAV-style Sinkhorn-Knopp transport plan between N samples and K sub-clusters.

    ``Q = exp(scores / eps)`` is normalised to total mass 1, then ``iters`` times its
    columns are scaled to sum to ``1/K`` and its rows to ``1/N``; finally rows are scaled to
    sum to 1, so each column sums to (approximately, exactly at convergence) ``N/K``.
    Computed in float64 log-space (``exp(1/0.05)`` would overflow float32 sums quickly);
    deterministic.

    Args:
        scores: ``[N, K]`` similarities (cosines in [-1, 1]).
        eps: entropic temperature; smaller is closer to the hard optimal transport.
        iters: number of column/row normalisation rounds.

    Returns:
        ``[N, K]`` plan in the dtype of ``scores`` (float64 if ``scores`` is not floating).
    """
    out_dtype = scores.dtype if scores.is_floating_point() else torch.float64
    return _sinkhorn_log_plan(scores, eps, iters).exp().to(out_dtype)


def assign_subclusters(features: Tensor, prototypes: Tensor, eps: float = 0.05, iters: int = 3) -> Tensor:
    """Hard sub-cluster index of each sample: argmax of the Sinkhorn plan.

    Args:
        features: ``[N, D]`` L2-normalised features of one class.
        prototypes: ``[K, D]`` that class's prototypes.

    Returns:
        LongTensor ``[N]`` with values in ``[0, K)``.
    """
    scores = features.to(torch.float64) @ prototypes.to(torch.float64).T
    return _sinkhorn_log_plan(scores, eps, iters).argmax(dim=1)


def subcluster_assignments(
    features: Tensor,
    labels: Tensor,
    prototypes: Tensor,
    eps: float = 0.05,
    iters: int = 3,
    variant: NPRVariant = "paper",
    generator: torch.Generator | None = None,
) -> Tensor:
    """Sub-cluster index (within its own class) of every sample.

    ``paper``: Sinkhorn equipartition against the class's current prototypes.
    ``public_code``: uniformly random in ``[0, K)``, drawn from ``generator`` class by class
    in increasing class order (the public code's effectively random assignment).

    Args:
        features: ``[N, D]`` features (L2-normalised here).
        labels: ``[N]`` class indices in ``[0, C)``.
        prototypes: ``[C, K, D]`` current prototypes.
        generator: required for ``public_code`` (seed it from seed, round and client).

    Returns:
        LongTensor ``[N]`` on the features' device.
    """
    _check_variant(variant)
    if prototypes.dim() != 3:
        raise ValueError(f"prototypes must be [C, K, D], got shape {tuple(prototypes.shape)}")
    num_classes, k, dim = prototypes.shape
    if features.dim() != 2 or features.shape[1] != dim or labels.shape != features.shape[:1]:
        raise ValueError(
            f"expected features [N, {dim}] and labels [N], got {tuple(features.shape)} and "
            f"{tuple(labels.shape)}"
        )
    labels = labels.to(features.device).long()
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes - 1}] to match the prototypes")
    if variant == "public_code" and generator is None:
        raise ValueError("variant 'public_code' draws random assignments: pass a seeded generator")
    feats = F.normalize(features.detach(), dim=1)
    protos = prototypes.detach().to(features.device)
    out = torch.zeros(labels.shape, dtype=torch.long, device=features.device)
    for c in torch.unique(labels).tolist():
        idx = (labels == c).nonzero(as_tuple=True)[0]
        if variant == "paper":
            out[idx] = assign_subclusters(feats[idx], protos[c], eps, iters)
        else:
            draw = torch.randint(k, (idx.numel(),), generator=generator, device=generator.device)
            out[idx] = draw.to(features.device)
    return out


def update_prototypes(
    features: Tensor,
    labels: Tensor,
    prototypes: Tensor,
    eps: float = 0.05,
    iters: int = 3,
    variant: NPRVariant = "paper",
    generator: torch.Generator | None = None,
) -> Tensor:
    """New prototypes: per class and sub-cluster, the L2-normalised mean of its members.

    ``paper``: sub-clusters with no member (and so classes absent from ``labels``) keep their
    old prototype. ``public_code`` does what the code's update_prototype does: a class with
    at most one sample keeps its prototypes, and in an updated class a sub-cluster with no
    member becomes the zero vector (its 0 / (0 + 1e-10), normalised), which then scores a
    cosine of 0. The input is not modified. Deterministic for the paper variant and, given
    an equally seeded generator, for ``public_code``.

    Args:
        features: ``[N, D]`` features of all the client's samples (L2-normalised here).
        labels: ``[N]`` class indices.
        prototypes: ``[C, K, D]`` current prototypes.

    Returns:
        ``[C, K, D]`` tensor with the prototypes' dtype and device.
    """
    num_classes, k, dim = prototypes.shape
    assign = subcluster_assignments(features, labels, prototypes, eps, iters, variant, generator)
    feats = F.normalize(features.detach().to(torch.float64), dim=1)
    slot = labels.to(features.device).long() * k + assign  # flat (class, sub-cluster) index
    onehot = F.one_hot(slot, num_classes * k).to(torch.float64)  # [N, C*K]
    sums = onehot.T @ feats  # [C*K, D]; a matmul, not scatter-add, so it is deterministic
    counts = onehot.sum(dim=0)
    new = F.normalize(sums, dim=1).to(device=prototypes.device, dtype=prototypes.dtype)
    if variant == "public_code":
        per_class = counts.reshape(num_classes, k).sum(dim=1, keepdim=True).expand(num_classes, k).reshape(-1)
        keep = per_class <= 1
    else:
        keep = counts == 0
    keep = keep.to(prototypes.device).unsqueeze(1)
    flat_old = prototypes.detach().reshape(num_classes * k, dim)
    return torch.where(keep, flat_old, new).reshape(num_classes, k, dim)


def init_prototypes(
    num_classes: int,
    k: int,
    dim: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Random unit-norm prototypes ``[C, K, D]`` (Gaussian directions from ``generator``)."""
    gen_device = generator.device if generator is not None else "cpu"
    raw = torch.randn(num_classes, k, dim, generator=generator, device=gen_device, dtype=torch.float64)
    return F.normalize(raw, dim=-1).to(device=device, dtype=dtype)


def npr_scores(features: Tensor, prototypes: Tensor) -> Tensor:
    """Class scores ``[B, C]``: for each class the best cosine among its ``K`` prototypes.

    Args:
        features: ``[B, D]`` features (normalised here, so the score is a true cosine).
        prototypes: ``[C, K, D]``.
    """
    feats = F.normalize(features, dim=-1)
    protos = F.normalize(prototypes.to(device=features.device, dtype=features.dtype), dim=-1)
    return torch.einsum("bd,ckd->bck", feats, protos).amax(dim=-1)


def npr_loss_from_scores(scores: Tensor, y: Tensor, ln_eps: float = 1e-5) -> Tensor:
    """Mean CE over per-sample standardised scores ``[B, C]`` (LayerNorm over C, no affine)."""
    return F.cross_entropy(F.layer_norm(scores, scores.shape[-1:], eps=ln_eps), y)


def npr_loss(features: Tensor, y: Tensor, prototypes: Tensor, ln_eps: float = 1e-5) -> Tensor:
    """NPR loss: :func:`npr_loss_from_scores` of :func:`npr_scores`; prototypes get no gradient."""
    return npr_loss_from_scores(npr_scores(features, prototypes.detach()), y, ln_eps)


def npr_weight(variant: NPRVariant, lam: float) -> float:
    """Weight of the NPR loss in ``BSM + weight * NPR``.

    ``paper``: ``lam``. ``public_code``: 1.0, because that code adds ``lam`` as a constant
    instead of multiplying, which leaves NPR's effective weight at 1.
    """
    _check_variant(variant)
    return float(lam) if variant == "paper" else 1.0
