"""FACMIC's FedFocal baseline: whole-CLIP fine-tuning (clip_finetune_base.py) with the two
cross-entropies of CLIP's batch contrastive loss replaced by a focal loss ("FedFocal replaces the
standard CE loss with a focal loss for FedAVG").

The paper gives no focal parameters; FACMIC's code (utils/clip_util.py FocalLossWithSmoothing) uses
gamma 1 with label smoothing 0.1 over the batch's B "classes" (``focal_smoothed_loss``), the defaults
here. gamma 0 and smoothing 0 give CLIP's plain contrastive loss.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.core.errors import FedbenchError
from lightning_modules.base import METHODS
from lightning_modules.clip_finetune_base import ClipFinetuneModule
from lightning_modules.components.clip_losses import focal_smoothed_loss


@METHODS.register("clip-ft-fedfocal")
class ClipFtFedFocal(ClipFinetuneModule):
    def __init__(self, *args, gamma: float = 1.0, label_smoothing: float = 0.1, **kwargs) -> None:
        if gamma < 0 or not 0.0 <= label_smoothing < 1.0:
            raise FedbenchError(f"clip-ft-fedfocal: need gamma >= 0 and 0 <= label_smoothing < 1, got gamma={gamma}, "
                                f"label_smoothing={label_smoothing}.")
        super().__init__(*args, **kwargs)
        self.gamma, self.label_smoothing = gamma, label_smoothing

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        image = F.normalize(self.features(x), dim=-1)
        text = F.normalize(self.class_text_features()[y], dim=-1)
        logits = self.scale() * image @ text.T
        target = torch.arange(len(y), device=logits.device)
        return (focal_smoothed_loss(logits, target, self.gamma, self.label_smoothing)
                + focal_smoothed_loss(logits.T, target, self.gamma, self.label_smoothing)) / 2
