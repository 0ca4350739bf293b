"""FedLC (Zhang et al., "Federated Learning with Label Distribution Skew via Logits Calibration",
ICML 2022, Eq. 9-10).

FedAvg whose local loss is the cross-entropy of calibrated logits
    z_c - tau * n_c^(-1/4)
with n_c the client's count of class c: the pairwise label margin that makes the local
minimiser match the balanced one. A class the client does not hold (n_c = 0) gets an infinite
margin, i.e. it is removed from the local softmax (exactly what the formula gives; FL-bench's
FedLC behaves the same way). Evaluation uses the plain logits.
tau = 1.0: no seed paper (FedNPR) states a value; 1.0 is the usual default of public FedLC
re-implementations (e.g. FL-bench), not re-verified against the paper's tables.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.core.errors import FedbenchError
from lightning_modules.base import METHODS, ClientContext, FederatedModule, Objective


def calibration_margin(counts: torch.Tensor, tau: float) -> torch.Tensor:
    """tau * n_c^(-1/4) per class; +inf for absent classes (tau > 0), zeros when tau == 0."""
    counts = counts.float()
    if tau == 0:
        return torch.zeros_like(counts)
    return torch.where(counts > 0, tau * counts.clamp(min=1).pow(-0.25), torch.full_like(counts, float("inf")))


def calibrated_cross_entropy(logits: torch.Tensor, y: torch.Tensor, counts: torch.Tensor, tau: float) -> torch.Tensor:
    """Mean CE of logits - tau * n^(-1/4) (the FedLC loss)."""
    margin = calibration_margin(counts, tau).to(device=logits.device, dtype=logits.dtype)
    return F.cross_entropy(logits - margin, y)


@METHODS.register("fedlc")
class FedLC(FederatedModule):
    def __init__(self, *args, tau: float = 1.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if tau < 0:
            raise FedbenchError(f"FedLC's tau must be >= 0, got {tau}.")
        self.tau = tau

    def client_objective(self, ctx: ClientContext) -> Objective:
        counts = ctx.class_counts()
        return lambda batch: calibrated_cross_entropy(self(batch[0]), batch[1], counts, self.tau)
