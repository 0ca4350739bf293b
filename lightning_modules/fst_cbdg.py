"""FST-CBDG (Yan & Guo, 2024): federated self-training with class-balanced data generation.

Unsupervised: no training label is read (the batches carry sample positions, never labels; a test
scrambles the training labels and gets the identical model). Nor is a label used for model
selection: the labeled validation split is dropped, so the run's reported ("best") metrics are the
final round's test metrics, not those of the best-validation round. The test split keeps its labels
for evaluation.

Model: f(I) = softmax(W normalize(I) + b) on frozen CLIP features, W initialised from the
L2-normalised class text features ("a photo of a {class}."), b = 0 (Algorithm 1, lines 1-6); so the
initial head predicts exactly zero-shot CLIP's classes. Only (W, b) is trained and averaged (FedAvg).

Per client (Algorithm 1, lines 10-20):
  q_j (persistent per-client state, one row per sample) starts at the zero-shot probabilities
  p_j = softmax(normalize(I_j) . normalize(T_k)) (Eq. 2, no temperature) the first time the client
  is sampled. Per iteration (``client_objective``; the real samples are the default shuffled batches):
  q_j <- beta q_j + (1 - beta) f(I_j) for the batch (Eq. 4, with the current head, before the step);
  then, from the client's updated pseudo-labels (argmax q over all its images), m_k, the counts
  n_k = (1 + gamma) m_max - m_k (Eq. 7) and a fresh draw z ~ N(normalize(T_k), sigma^2 I) of n_k
  features per class (Eq. 5), all from the client's generator (a function of seed, round and client,
  so deterministic and independent of the rank); loss = L_iST(f(I), q) (Eq. 3, a batch mean)
  + lambda L_tSamp(f(z), k) (Eq. 6, a sum over the draw), as in Algorithm 1, lines 14-18.

Options (``method.args``), paper defaults: beta 0.9, gamma 0, lambda 1 (``tsamp_weight``).
  ist_weight      the weight of L_iST (1). 0 and tsamp_weight 0 are the paper's Table 3 ablations
                  "L_tSamp" and "L_iST" (each loss alone); q keeps updating (Eq. 4) either way, so the
                  synthetic counts still follow the current pseudo-labels.
  sampling        'balanced' (default): Eq. 7. 'equal': Table 4's "equal sampling", the same number of
                  synthetic features for every class irrespective of the client's images per class; the
                  paper gives no number, so it is the client's mean per class, round(n / K) (as many
                  synthetic features as real ones; our choice).
  sigma           not given by the paper. A float, or 'auto' (default): each client estimates it at
                  every draw from its own features and current pseudo-labels as the per-dimension RMS
                  distance of its normalised image features to their pseudo-class's normalised text
                  feature (``estimate_sigma``), so the synthetic features spread like the real ones.
Before issue 37, L_tSamp was a mean over the synthetic features (``tsamp_reduction: mean``) and one
pool per local epoch was shared out over its batches; both changed the effective lambda and were
removed (no config used them).
The paper's optimiser (SGD lr 0.01, momentum 0.9, weight decay 1e-5) comes from the run config.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.batches import DeviceData, EpochBatches
from bench.core.errors import FedbenchError
from lightning_modules.base import METHODS, ClientContext, Objective
from lightning_modules.clip_feature_base import ClipFeatureModule
from lightning_modules.components.clip_heads import zero_shot_head
from lightning_modules.components.fst_cbdg import (
    SigmaTracker,
    class_balanced_counts,
    estimate_sigma,
    sample_text_features,
    self_training_loss,
    text_sampling_loss,
    update_soft_labels,
)


@METHODS.register("fst-cbdg")
class FstCbdg(ClipFeatureModule):
    keeps_client_state: ClassVar[bool] = True  # ctx.state: its zero-shot pseudo-label probabilities

    def __init__(
        self,
        *args,
        beta: float = 0.9,
        gamma: float = 0.0,
        tsamp_weight: float = 1.0,
        sigma: float | str = "auto",
        ist_weight: float = 1.0,
        sampling: Literal["balanced", "equal"] = "balanced",
        **kwargs,
    ) -> None:
        if not (sigma == "auto" or (isinstance(sigma, (int, float)) and sigma >= 0)):
            raise FedbenchError(f"fst-cbdg: sigma must be 'auto' or a number >= 0, got {sigma!r}.")
        if sampling not in ("balanced", "equal"):
            raise FedbenchError(f"fst-cbdg: sampling must be 'balanced' (Eq. 7) or 'equal', got {sampling!r}.")
        if ist_weight < 0 or tsamp_weight < 0 or not (ist_weight or tsamp_weight):
            raise FedbenchError(f"fst-cbdg: ist_weight and tsamp_weight must be >= 0 and not both 0, got "
                                f"ist_weight={ist_weight}, tsamp_weight={tsamp_weight}.")
        if not 0.0 <= beta <= 1.0 or gamma < 0:
            raise FedbenchError(f"fst-cbdg: need 0 <= beta <= 1 and gamma >= 0, got beta={beta}, gamma={gamma}.")
        super().__init__(*args, **kwargs)
        self.beta, self.gamma, self.tsamp_weight = beta, gamma, tsamp_weight
        self.sigma, self.ist_weight, self.sampling = sigma, ist_weight, sampling

    # ---- model -----------------------------------------------------------------------------
    def build_head(self) -> nn.Module:
        return zero_shot_head(self.class_text_features())  # W = normalize(T), b = 0

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1)

    def zero_shot_probs(self, feats: torch.Tensor) -> torch.Tensor:
        """Eq. 2: softmax over classes of normalize(I) . normalize(T_k) (no temperature)."""
        return torch.softmax(F.normalize(feats, dim=-1) @ self.normalized_text().T, dim=-1)

    # ---- data: no label for model selection -------------------------------------------------
    def prepare_splits(self, train: DeviceData, val: DeviceData | None, test: DeviceData):
        train, val, test = super().prepare_splits(train, val, test)
        return train, None, test  # no labeled val split

    # ---- client --------------------------------------------------------------------------------
    def soft_labels(self, ctx: ClientContext) -> torch.Tensor:
        """The client's q [n, K] (rows in the order of ctx.indices), zero-shot the first time (Eq. 2)."""
        if "q" not in ctx.state:
            ctx.state["q"] = self.zero_shot_probs(ctx.data.images[ctx.indices]).detach()
        return ctx.state["q"]

    def client_sigma(self, ctx: ClientContext, pseudo: torch.Tensor, tracker: SigmaTracker | None = None) -> float:
        if self.sigma != "auto":
            return float(self.sigma)
        if tracker is not None:  # the same value, kept up to date a batch at a time
            return tracker.sigma()
        return estimate_sigma(ctx.data.images[ctx.indices], self.text_features, pseudo)

    def sigma_tracker(self, ctx: ClientContext) -> SigmaTracker | None:
        """For sigma ``auto``: the client's estimate_sigma, updated per batch (a local update's features are fixed)."""
        if self.sigma != "auto" or not self.tsamp_weight:
            return None
        return SigmaTracker(ctx.data.images[ctx.indices], self.text_features, self.soft_labels(ctx).argmax(dim=1))

    def synthetic_pool(self, ctx: ClientContext, tracker: SigmaTracker | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Eqs. 5 and 7 from the client's current pseudo-labels (argmax q), drawn from ctx.generator
        (features grouped by class in label order)."""
        pseudo = self.soft_labels(ctx).argmax(dim=1)
        if self.sampling == "equal":
            counts = torch.full((self.num_classes,), round(len(pseudo) / self.num_classes), dtype=torch.long)
        else:
            counts = class_balanced_counts(torch.bincount(pseudo, minlength=self.num_classes), self.gamma)
        sigma = self.client_sigma(ctx, pseudo, tracker)
        return sample_text_features(self.normalized_text(), counts, sigma, ctx.generator)

    def client_batches(self, ctx: ClientContext) -> SelfTrainingBatches:
        self.soft_labels(ctx)
        return SelfTrainingBatches(self, ctx, super().client_batches(ctx))

    def client_objective(self, ctx: ClientContext) -> Objective:
        q = self.soft_labels(ctx)
        tracker = self.sigma_tracker(ctx)

        def loss(batch):
            x, rows = batch
            logits = self(x)
            q_rows = update_soft_labels(q[rows], torch.softmax(logits, dim=-1), self.beta)  # Eq. 4
            q[rows] = q_rows
            total = self_training_loss(logits, q_rows)  # Eq. 3
            if self.ist_weight != 1.0:
                total = self.ist_weight * total
            if self.tsamp_weight:
                if tracker is not None:
                    tracker.update(rows, q[rows].argmax(dim=1))
                z, z_labels = self.synthetic_pool(ctx, tracker)  # Eqs. 5 and 7 from the updated q (Algorithm 1, 14-17)
                total = total + self.tsamp_weight * text_sampling_loss(self.head, z, z_labels)  # Eq. 6, a sum
            return total

        return loss


class SelfTrainingBatches:
    """FST-CBDG's batches of one client: (features, rows), ``rows`` the samples' positions in the
    client's list (rows of q); the real samples are the default batches'. The synthetic features are
    drawn by the objective, per batch."""

    def __init__(self, module: FstCbdg, ctx: ClientContext, epochs: EpochBatches) -> None:
        self.module, self.ctx, self.epochs = module, ctx, epochs
        self.order = torch.argsort(ctx.indices)
        self.sorted = ctx.indices[self.order]

    def set_epoch(self, epoch: int) -> None:
        self.epochs.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.epochs)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for idx in self.epochs.index_batches():
            yield self.ctx.data.to_float(idx)[0], self.order[torch.searchsorted(self.sorted, idx)]
