"""FedCLIP (Lu et al., 2023) as FACMIC's baseline: a CLIP image adapter trained and averaged.

Per batch of frozen CLIP features I: adapted I~ = adapter(I) * I with the adapter
Linear -> Tanh -> Linear -> Softmax over features (``FedClipAdapter``); the loss is CLIP's
symmetric batch contrastive loss against the class-prompt text features ("a picture of a {class}",
as in FACMIC's comparison), with logit scale exp(CLIP logit_scale). Only the adapter is trained,
communicated and averaged (sample-weighted FedAvg). Prediction: logit_scale * cos(I~, T).

FACMIC compares all methods under its own setting (Adam lr 5e-5, betas (0.9, 0.98), eps 1e-6,
weight decay 0.02, batch 32): betas/eps default to those, lr/weight decay come from the config.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lightning_modules.base import METHODS
from lightning_modules.clip_feature_base import ClipFeatureModule
from lightning_modules.components.clip_heads import FedClipAdapter
from lightning_modules.components.clip_losses import clip_contrastive_loss


@METHODS.register("fedclip")
class FedClip(ClipFeatureModule):
    default_prompt = "a picture of a {}"

    def __init__(self, *args, betas: tuple[float, float] = (0.9, 0.98), **kwargs) -> None:
        super().__init__(*args, betas=betas, **kwargs)

    def build_head(self) -> nn.Module:
        return FedClipAdapter(self.feature_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.frozen_clip.logit_scale * F.normalize(self.head(x), dim=-1) @ self.normalized_text().T

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return clip_contrastive_loss(self.head(x), self.text_features[y], self.frozen_clip.logit_scale)
