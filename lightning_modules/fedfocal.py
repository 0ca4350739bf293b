"""FedFocal (Sarkar, Narang & Rai, "Fed-Focal Loss for imbalanced data classification in
federated learning", IJCAI-FL workshop 2020), the baseline of FACMIC (MICCAI 2024, Sec. 3.2):
FedAvg with the cross-entropy replaced by the focal loss of Lin et al. (ICCV 2017, Eq. 5)
    FL(p_t) = -(1 - p_t)^gamma * log(p_t)          (mean over the batch),
p_t the softmax probability of the true class. gamma = 2: Lin et al.'s default (FACMIC gives no
value). gamma = 0 is the cross-entropy. No class weights alpha_t (Lin et al.'s alpha is for the
binary sigmoid form; FACMIC mentions none).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.core.errors import FedbenchError
from lightning_modules.base import METHODS, FederatedModule


def focal_loss(logits: torch.Tensor, y: torch.Tensor, gamma: float) -> torch.Tensor:
    """Mean of -(1 - p_t)^gamma log p_t over the batch."""
    log_pt = F.log_softmax(logits, dim=1).gather(1, y.unsqueeze(1)).squeeze(1)
    if gamma == 0:
        return -log_pt.mean()
    return -((1.0 - log_pt.exp()).clamp(min=0).pow(gamma) * log_pt).mean()


@METHODS.register("fedfocal")
class FedFocal(FederatedModule):
    def __init__(self, *args, gamma: float = 2.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if gamma < 0:
            raise FedbenchError(f"FedFocal's gamma must be >= 0, got {gamma}.")
        self.gamma = gamma

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return focal_loss(self(x), y, self.gamma)
