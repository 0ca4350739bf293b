"""FST-CBDG (Yan & Guo, 2024): federated self-training with class-balanced data generation.

Unsupervised: no label is read in training. ``prepare_splits`` replaces the training split's labels
by the sample indices (arange), so a batch's second tensor says which sample a row is (to find its
soft pseudo-label) and nothing else. Nor is a label used for model selection: the labeled
validation split is dropped, so the run's reported ("best") metrics are the final round's test
metrics, not those of the best-validation round. The test split keeps its labels for evaluation.

Model: f(I) = softmax(W normalize(I) + b) on frozen CLIP features, W initialised from the
L2-normalised class text features ("a photo of a {class}."), b = 0 (Algorithm 1, lines 1-6); so the
initial head predicts exactly zero-shot CLIP's classes. Only (W, b) is trained and averaged (FedAvg).

Per client (Algorithm 1, lines 10-20):
  q_j (persistent per-client state, one row per sample) starts at the zero-shot probabilities
  p_j = softmax(normalize(I_j) . normalize(T_k)) (Eq. 2, no temperature) the first time the client
  is sampled. At each local epoch start the client counts its images per argmax pseudo-label m_k and
  draws n_k = (1 + gamma) m_max - m_k synthetic features z ~ N(normalize(T_k), sigma^2 I) per class
  (Eqs. 5, 7), shuffled; the epoch's batches share them out in proportion to the real samples seen.
  Per batch: q_j <- beta q_j + (1 - beta) f(I_j) (Eq. 4, with the current head, before the step);
  loss = L_iST(f(I), q) (Eq. 3) + lambda L_tSamp(f(z), k) (Eq. 6); SGD step.

Options (``method.args``), paper defaults: beta 0.9, gamma 0, lambda 1 (``tsamp_weight``).
  sigma           not given by the paper. A float, or 'auto' (default): each client estimates it at
                  every local epoch from its own features and pseudo-labels as the per-dimension RMS
                  distance of its normalised image features to their pseudo-class's normalised text
                  feature (``estimate_sigma``), so the synthetic features spread like the real ones.
  tsamp_reduction 'mean' (default): L_tSamp averaged over the batch's synthetic features, like Eq. 3
                  over the real ones. 'sum': Eq. 6 literally (a sum), whose weight then grows with
                  the client's class imbalance.
The paper's optimiser (SGD lr 0.01, momentum 0.9, weight decay 1e-5) comes from the run config.
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.batches import DeviceData
from bench.core.errors import FedbenchError
from lightning_modules.base import METHODS, ClientContext
from lightning_modules.clip_feature_base import ClipFeatureModule
from lightning_modules.components.clip_heads import zero_shot_head
from lightning_modules.components.fst_cbdg import (
    class_balanced_counts,
    estimate_sigma,
    sample_text_features,
    self_training_loss,
    text_sampling_loss,
    update_soft_labels,
)


@METHODS.register("fst-cbdg")
class FstCbdg(ClipFeatureModule):
    def __init__(
        self,
        *args,
        beta: float = 0.9,
        gamma: float = 0.0,
        tsamp_weight: float = 1.0,
        sigma: float | str = "auto",
        tsamp_reduction: Literal["mean", "sum"] = "mean",
        **kwargs,
    ) -> None:
        if not (sigma == "auto" or (isinstance(sigma, (int, float)) and sigma >= 0)):
            raise FedbenchError(f"fst-cbdg: sigma must be 'auto' or a number >= 0, got {sigma!r}.")
        if tsamp_reduction not in ("mean", "sum"):
            raise FedbenchError(f"fst-cbdg: tsamp_reduction must be 'mean' or 'sum', got {tsamp_reduction!r}.")
        if not 0.0 <= beta <= 1.0 or gamma < 0:
            raise FedbenchError(f"fst-cbdg: need 0 <= beta <= 1 and gamma >= 0, got beta={beta}, gamma={gamma}.")
        super().__init__(*args, **kwargs)
        self.beta, self.gamma, self.tsamp_weight = beta, gamma, tsamp_weight
        self.sigma, self.tsamp_reduction = sigma, tsamp_reduction
        self._epoch: dict = {}  # this client's synthetic pool for the current local epoch (not state)

    # ---- model -----------------------------------------------------------------------------
    def build_head(self) -> nn.Module:
        return zero_shot_head(self.class_text_features())  # W = normalize(T), b = 0

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1)

    def zero_shot_probs(self, feats: torch.Tensor) -> torch.Tensor:
        """Eq. 2: softmax over classes of normalize(I) . normalize(T_k) (no temperature)."""
        return torch.softmax(F.normalize(feats, dim=-1) @ self.normalized_text().T, dim=-1)

    # ---- data: labels out --------------------------------------------------------------------
    def prepare_splits(self, train: DeviceData, val: DeviceData | None, test: DeviceData):
        train, val, test = super().prepare_splits(train, val, test)
        index = torch.arange(len(train.labels), device=train.labels.device)
        return DeviceData(train.images, index, train.mean, train.std), None, test  # no train or val labels

    # ---- client --------------------------------------------------------------------------------
    def on_client_start(self, ctx: ClientContext) -> None:
        order = torch.argsort(ctx.indices)
        if "q" not in ctx.state:
            ctx.state["q"] = self.zero_shot_probs(ctx.data.images[ctx.indices]).detach()
        self._epoch = {"order": order, "sorted": ctx.indices[order]}

    def rows_of(self, sample_ids: torch.Tensor) -> torch.Tensor:
        """Positions in the client's sample list (and q) of the batch's sample indices."""
        e = self._epoch
        return e["order"][torch.searchsorted(e["sorted"], sample_ids)]

    def client_sigma(self, ctx: ClientContext, pseudo: torch.Tensor) -> float:
        if self.sigma != "auto":
            return float(self.sigma)
        return estimate_sigma(ctx.data.images[ctx.indices], self.text_features, pseudo)

    def new_synthetic_pool(self, ctx: ClientContext) -> None:
        """Eqs. 5 and 7 for this local epoch, from the client's current pseudo-labels."""
        pseudo = ctx.state["q"].argmax(dim=1)
        counts = class_balanced_counts(torch.bincount(pseudo, minlength=self.num_classes), self.gamma)
        sigma = self.client_sigma(ctx, pseudo)
        z, z_labels = sample_text_features(self.normalized_text(), counts, sigma, ctx.generator)
        perm = torch.randperm(len(z_labels), generator=ctx.generator, device=ctx.generator.device).to(z.device)
        self._epoch.update(z=z[perm], z_labels=z_labels[perm], seen=0, sigma=sigma)

    def synthetic_share(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next slice of the epoch's pool, in proportion to the real samples seen so far."""
        e = self._epoch
        total, n = len(e["z_labels"]), len(self.client.indices)
        start, end = e["seen"] * total // n, (e["seen"] + batch_size) * total // n
        e["seen"] += batch_size
        return e["z"][start:end], e["z_labels"][start:end]

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        ctx = self.client
        if ctx is None:
            raise FedbenchError("fst-cbdg trains only federated (its pseudo-labels are per-client state).")
        x, sample_ids = batch  # sample indices, never labels (see prepare_splits)
        if batch_idx == 0:
            self.new_synthetic_pool(ctx)
        logits = self(x)
        rows = self.rows_of(sample_ids)
        q = update_soft_labels(ctx.state["q"][rows], torch.softmax(logits, dim=-1), self.beta)  # Eq. 4
        ctx.state["q"][rows] = q
        loss = self_training_loss(logits, q)  # Eq. 3
        z, z_labels = self.synthetic_share(len(sample_ids))
        if self.tsamp_weight:
            loss = loss + self.tsamp_weight * text_sampling_loss(self.head, z, z_labels, self.tsamp_reduction)
        return loss
