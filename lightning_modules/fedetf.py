"""FedETF (Li et al., "No Fear of Classifier Biases: Neural Collapse Inspired Federated Learning
with Synthetic and Fixed Classifier", ICCV 2023, Sec. 4).

The classifier is a fixed simplex equiangular tight frame, identical on every client and never
trained or aggregated:
    V = sqrt(K / (K - 1)) * U (I_K - 1_K 1_K^T / K),   U in R^{d x K}, U^T U = I_K,
whose K columns are unit vectors with pairwise cosine -1 / (K - 1). A projection layer (Linear
from the backbone's features to d) maps features into the ETF space, where they are
L2-normalised: h = g(f(x)) / ||g(f(x))||, and the logits are beta * V^T h with a learnable
temperature beta (initialised at 1, trained and aggregated like the rest of the model, as in the
public code). The local loss is the paper's balanced feature loss: the balanced softmax
CE(beta V^T h + log n, y) with the client's class counts n (absent classes counted as 1, as the
public code does); ``balanced=False`` gives the plain CE. Evaluation uses beta V^T h.

Choices: d = K by default (the public code's ETF dimension; ``etf_dim`` >= K sets another); U is
a QR factor of a Gaussian draw from the fixed ``etf_seed``, so every rank and client builds the
same V. The paper's optional local personalisation (alternately fine-tuning V and the
projection per client) is not included: the seed papers compare the global model (FedBM/FedCB).
No hyperparameters are given by the seed papers (FedBM Sec. IV-B runs FedETF with FedAvg's
common settings).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.errors import FedbenchError
from lightning_modules.base import METHODS, ClientContext, FederatedModule, Objective


def simplex_etf(num_classes: int, dim: int, seed: int = 0) -> torch.Tensor:
    """[dim, K] simplex ETF: unit columns, pairwise cosine -1/(K-1) (requires dim >= K >= 2)."""
    if num_classes < 2:
        raise FedbenchError("FedETF needs at least two classes.")
    if dim < num_classes:
        raise FedbenchError(f"FedETF's etf_dim must be >= the number of classes ({num_classes}), got {dim}.")
    gen = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(dim, num_classes, generator=gen, dtype=torch.float64))
    u = q * torch.sign(torch.diagonal(r)).unsqueeze(0)  # the unique QR factor: a fixed function of the draw
    return etf_from_basis(u).float()


def etf_from_basis(u: torch.Tensor) -> torch.Tensor:
    """sqrt(K / (K - 1)) U (I_K - 1_K 1_K^T / K) for a [dim, K] U with orthonormal columns, in float64."""
    k = u.shape[1]
    centre = torch.eye(k, dtype=torch.float64) - torch.full((k, k), 1.0 / k, dtype=torch.float64)
    return math.sqrt(k / (k - 1)) * u.to(torch.float64) @ centre


class ETFHead(nn.Module):
    """Projection -> L2 normalisation -> learnable temperature * fixed ETF classifier."""

    def __init__(self, in_dim: int, num_classes: int, etf_dim: int, etf_seed: int) -> None:
        super().__init__()
        self.projection = nn.Linear(in_dim, etf_dim)
        self.register_buffer("etf", simplex_etf(num_classes, etf_dim, etf_seed))
        self.temperature = nn.Parameter(torch.tensor(1.0))

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        h = F.normalize(self.projection(f), dim=1)
        return self.temperature * (h @ self.etf)


@METHODS.register("fedetf")
class FedETF(FederatedModule):
    frozen_prefixes = ("head.etf",)

    def __init__(self, *args, etf_dim: int | None = None, etf_seed: int = 0, balanced: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.balanced = balanced
        self.head = ETFHead(self.feature_dim, self.num_classes, etf_dim or self.num_classes, etf_seed)

    def client_objective(self, ctx: ClientContext) -> Objective:
        if not self.balanced:
            return self.training_step
        log_counts = ctx.class_counts().clamp(min=1).float().log()  # absent classes counted as 1

        def balanced_feature_loss(batch):
            x, y = batch
            logits = self(x)
            return F.cross_entropy(logits + log_counts.to(device=logits.device, dtype=logits.dtype), y)

        return balanced_feature_loss
