"""BalanceFL (Shuai et al., "BalanceFL: Addressing Class Imbalance in Long-Tail Federated
Learning", IPSN 2022, Sec. 4), following its public code (CIFAR-10 config ``fedlt.yaml``).

A client with class counts n_c holds the classes P = {c : n_c > 0} and misses M = the others.
Its local loss on a batch is
    CE over P of the (feature-augmented) logits                      (local learning)
  + lambda * KD over M from the received global model at temperature T  (knowledge inheritance)
  - 0.002 * sum of the batch's softmax entropies over P                 (self-entropy regulariser)
with KD(s, t) = -mean_i sum_{c in M} softmax(t_i / T)_c log softmax(s_i / T)_c taken over the
missing classes only (the code's "ce" mode: softmaxes over M, no T^2).
Inter-class balancing:
  - class-balanced sampling: every local batch is drawn with replacement, sample i with
    probability proportional to 1 / n_{y_i} (the code's WeightedRandomSampler); the number of
    samples per epoch is unchanged;
  - feature-level augmentation: the within-class covariance Sigma of the global model's features
    on the client's data (per-class covariances averaged with weights n_c) is computed once per
    round; a sample of class c has Gaussian noise N(0, Sigma) added to its feature with
    probability 1 - n_c / max_k n_k (minority classes are augmented most, the largest never),
    and only the CE term sees the augmented features.
T = 2, lambda = 1, entropy weight 0.002: the public code's CIFAR-10 configuration; the seed
paper (FedNPR) gives no values.

Simplifications (stated): P and M are the client's classes (the paper's definition), where the
code takes them per batch; the noise is drawn per batch from the client's generator instead of
the code's cycled pool of 500 pre-drawn vectors; the classifier is the benchmark's linear head
(the code uses a bias-free dot-product classifier with scale 2); the resampled batches are taken
without data augmentation (the code pre-loads its data without augmentation too). The teacher
runs in train mode (batch statistics), as in the code.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from datamodules.errors import FedbenchError
from lightning_modules.base import METHODS, ClientContext, FederatedModule
from lightning_modules.components.global_teacher import GlobalTeacher


def missing_class_distillation(logits: torch.Tensor, teacher_logits: torch.Tensor, missing: torch.Tensor,
                               temperature: float) -> torch.Tensor:
    """Soft cross-entropy from the teacher over the missing classes only (0 if none is missing)."""
    if missing.numel() == 0:
        return logits.new_zeros(())
    t = F.softmax(teacher_logits[:, missing].detach() / temperature, dim=1)
    s = F.log_softmax(logits[:, missing] / temperature, dim=1)
    return -(t * s).sum(1).mean()


def present_class_entropy(logits: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Sum over the batch of the softmax entropy over the present classes."""
    logp = F.log_softmax(logits[:, present], dim=1)
    return -(logp.exp() * logp).sum()


def present_class_cross_entropy(logits: torch.Tensor, y: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """CE with the softmax restricted to the present classes (labels re-indexed into them)."""
    position = torch.full((logits.shape[1],), -1, dtype=torch.long, device=logits.device)
    position[present] = torch.arange(len(present), device=logits.device)
    return F.cross_entropy(logits[:, present], position[y])


def balanced_draw(labels: torch.Tensor, counts: torch.Tensor, size: int, gen: torch.Generator | None) -> torch.Tensor:
    """Positions into ``labels``: ``size`` draws with replacement, probability ~ 1 / n_{y_i}."""
    weights = 1.0 / counts.double()[labels]
    return torch.multinomial(weights, size, replacement=True, generator=gen)


def within_class_covariance(features: torch.Tensor, labels: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """[D, D]: per-class unbiased covariances (zero for a single sample) averaged with weights n_c."""
    d = features.shape[1]
    total = torch.zeros(d, d, dtype=torch.float64, device=features.device)
    for c in torch.nonzero(counts > 1).flatten().tolist():
        total += float(counts[c]) * torch.cov(features[labels == c].double().T).reshape(d, d)
    return total / counts.sum().double()


def gaussian_noise_factor(cov: torch.Tensor) -> torch.Tensor:
    """A [D, D] factor L with L L^T = cov (eigen-decomposition; cov may be singular)."""
    evals, evecs = torch.linalg.eigh(cov)
    return evecs * evals.clamp(min=0).sqrt().unsqueeze(0)


@METHODS.register("balancefl")
class BalanceFL(FederatedModule):
    def __init__(self, *args, temperature: float = 2.0, kd_weight: float = 1.0, entropy_weight: float = 0.002,
                 balanced_sampling: bool = True, feature_augmentation: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if temperature <= 0:
            raise FedbenchError(f"BalanceFL's temperature must be > 0, got {temperature}.")
        self.temperature, self.kd_weight, self.entropy_weight = temperature, kd_weight, entropy_weight
        self.balanced_sampling, self.feature_augmentation = balanced_sampling, feature_augmentation
        self._teacher: GlobalTeacher | None = None
        self._counts = self._present = self._missing = None
        self._aug_prob: torch.Tensor | None = None
        self._noise_factor: torch.Tensor | None = None

    # ---- client ----------------------------------------------------------------------------
    def on_client_start(self, ctx: ClientContext) -> None:
        counts = ctx.class_counts()
        self._counts = counts
        self._present = torch.nonzero(counts > 0).flatten()
        self._missing = torch.nonzero(counts == 0).flatten()
        self._teacher = GlobalTeacher(self, ctx.global_state, train_mode=True)
        self._aug_prob = self._noise_factor = None
        if self.feature_augmentation:
            self._aug_prob = 1.0 - counts.float() / counts.max().float()
            dtype = ctx.data.mean.dtype  # the run's precision
            feats = torch.cat([self._teacher.features(ctx.data.to_float(chunk)[0]).to(dtype)
                               for chunk in torch.tensor_split(ctx.indices, -(-len(ctx.indices) // 256))])
            cov = within_class_covariance(feats, ctx.labels, counts)
            self._noise_factor = gaussian_noise_factor(cov).to(dtype)

    def local_batch(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The class-balanced batch replacing the orchestrator's uniformly shuffled one."""
        ctx = self.client
        if not self.balanced_sampling or ctx is None or self._counts is None:
            return batch
        pos = balanced_draw(ctx.labels, self._counts, len(batch[1]), ctx.generator)
        return ctx.data.to_float(ctx.indices[pos.to(ctx.indices.device)])

    def augment_features(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self._noise_factor is None or self._aug_prob is None or self.client is None:
            return f
        gen = self.client.generator
        draw = torch.rand(len(y), generator=gen, device=gen.device if gen is not None else f.device).to(f.device)
        mask = draw < self._aug_prob.to(f.device)[y]
        noise = torch.randn(len(y), f.shape[1], generator=gen, device=gen.device if gen is not None else f.device)
        noise = noise.to(f.device, f.dtype) @ self._noise_factor.to(f.device, f.dtype).T
        return f + mask.unsqueeze(1).to(f.dtype) * noise.to(f.dtype)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self._teacher is None or self._present is None or self._missing is None:  # central: plain CE
            return super().training_step(batch, batch_idx)
        x, y = self.local_batch(batch)
        f = self.features(x)
        logits = self.head(f)
        logits_aug = self.head(self.augment_features(f, y)) if self._noise_factor is not None else logits
        loss = present_class_cross_entropy(logits_aug, y, self._present)
        if self.kd_weight and len(self._missing):
            teacher = self._teacher.logits(x)
            loss = loss + self.kd_weight * missing_class_distillation(logits, teacher, self._missing, self.temperature)
        if self.entropy_weight:
            loss = loss - self.entropy_weight * present_class_entropy(logits, self._present)
        return loss

    def on_client_end(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        self._teacher = None
        self._counts = self._present = self._missing = self._aug_prob = self._noise_factor = None
        return {}
