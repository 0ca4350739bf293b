"""FedNH (Dai et al., "Tackling Data Heterogeneity in Federated Learning with Class Prototypes",
AAAI 2023).

The classifier is a set of unit-norm class prototypes W (one per class), fixed during local
training: logits = s * <f / ||f||, w_k>, with a learnable scale s (aggregated with the body).
  - Initialisation: prototypes spread uniformly on the sphere, from a fixed seed (identical for
    every client): orthonormal rows (C <= D, as FedNH's code initialises them), else random
    unit vectors.
  - Client upload (after local training, model in eval mode): per class k it has samples of,
    n_ik * unit(mean_x unit(f(x))), and the counts n_ik (FedNH's code).
  - Server: mu_k = unit(sum_i n_ik unit(mean_ik) / sum_i n_ik) over the round's clients, then
    w_k <- unit(rho * w_k + (1 - rho) * mu_k) for every class seen this round; the others keep
    their prototype.
rho = 0.9: FedBM (TMI) Sec. IV-B, "as suggested in the original paper". scale starts at 1 and is
learned, as in FedNH's and FedETF's code (``learn_scale=False`` keeps it fixed, e.g. scale=30).
The prototypes are a frozen buffer (never averaged): every rank applies the same server step.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.errors import FedbenchError
from lightning_modules.base import METHODS, ClientContext, FederatedModule
from lightning_modules.components.client_features import class_feature_sums
from lightning_modules.server_part import ServerContext, ServerPart


def uniform_prototypes(num_classes: int, dim: int, seed: int) -> torch.Tensor:
    """[C, D] unit rows from a fixed seed: orthonormal when C <= D, else normalised Gaussians."""
    gen = torch.Generator().manual_seed(seed)
    if num_classes <= dim:
        q, r = torch.linalg.qr(torch.randn(dim, num_classes, generator=gen, dtype=torch.float64))
        q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)  # unique QR: a fixed function of the draw
        return q.T.contiguous().float()
    return F.normalize(torch.randn(num_classes, dim, generator=gen, dtype=torch.float64), dim=1).float()


class PrototypeHead(nn.Module):
    """Cosine classifier against fixed unit-norm class prototypes, times a scale."""

    def __init__(self, prototypes: torch.Tensor, scale: float, learn_scale: bool) -> None:
        super().__init__()
        self.register_buffer("prototypes", prototypes)
        self.scale = nn.Parameter(torch.tensor(float(scale)), requires_grad=learn_scale)

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return self.scale * F.normalize(f, dim=1) @ self.prototypes.T


@METHODS.register("fednh")
class FedNH(FederatedModule):
    frozen_prefixes = ("head.prototypes",)

    def __init__(self, *args, rho: float = 0.9, scale: float = 1.0, learn_scale: bool = True,
                 prototype_seed: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not 0.0 <= rho <= 1.0:
            raise FedbenchError(f"FedNH's rho must be in [0, 1], got {rho}.")
        self.rho = rho
        self.head = PrototypeHead(uniform_prototypes(self.num_classes, self.feature_dim, prototype_seed), scale, learn_scale)
        self.server_side = FedNHServer(self)

    def on_client_end(self, ctx: ClientContext) -> None:
        sums, counts = class_feature_sums(self, ctx, normalise=True)
        means = F.normalize(sums / counts.clamp(min=1).unsqueeze(1), dim=1)  # absent classes: zero rows
        ctx.uploads.update(proto_sum=means * counts.unsqueeze(1), proto_count=counts)


class FedNHServer(ServerPart):
    """FedNH's server side: the prototypes' smoothing towards the clients' class means. The prototypes
    stay on the model (a frozen buffer of its head: they are what it classifies with)."""

    def upload_shapes(self) -> dict[str, tuple[int, ...]]:
        m = self.module
        return {"proto_sum": (m.num_classes, m.feature_dim), "proto_count": (m.num_classes,)}

    def step(self, global_state: dict[str, torch.Tensor], extras: dict[str, torch.Tensor], round_idx: int,
             server: ServerContext) -> None:
        m = self.module
        counts = extras["proto_count"]
        seen = counts > 0
        if not bool(seen.any()):
            return
        w = m.head.prototypes
        mu = F.normalize(extras["proto_sum"][seen] / counts[seen].unsqueeze(1), dim=1)
        smoothed = F.normalize(m.rho * w[seen].double() + (1 - m.rho) * mu.to(w.device), dim=1)
        w[seen.to(w.device)] = smoothed.to(w.dtype)

    def state(self) -> dict[str, torch.Tensor]:
        m = self.module
        return {"prototypes": m.head.prototypes.clone()}

    def load_state(self, state: dict[str, torch.Tensor], server: ServerContext) -> None:
        m = self.module
        m.head.prototypes.copy_(state["prototypes"])
