"""FedProto (Tan et al., "FedProto: Federated Prototype Learning across Heterogeneous Clients",
AAAI 2022, Algorithm 1).

Clients share no weights (every model is personal); only class prototypes travel.
  - Local objective: CE(head(f), y) + lam * MSE(f, C_y), C_y the global prototype of the sample's
    class, MSE averaged over batch and feature dimensions (FedProto's code); samples of classes
    without a global prototype yet add nothing (but count in the mean, as in that code).
  - Upload (after local training, model in eval mode): per-class sums of the pooled features and
    the class counts (plus per-class means and presence flags for ``weighting="clients"``).
  - Server: C_k = sum_i sum_{x in D_ik} f(x) / sum_i n_ik, the sample-weighted mean of the local
    prototypes (the paper's |D_ik|-weighted aggregation; ``weighting="clients"`` gives the
    unweighted mean over clients of FedProto's code); classes absent this round keep their
    previous prototype.
  - Prediction (per-client protocol): nearest global prototype, scores -MSE(f, C_k) (FedProto's
    inference); before any global prototype exists (round 0) the client's own head.
    ``predict="head"`` always uses the head.
lam = 1: FedProto's code default (ld = 1); the seed papers give none (FedETF's code uses 0.1).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.core.errors import FedbenchError
from lightning_modules.base import METHODS, ClientContext, FederatedModule
from lightning_modules.components.client_features import class_feature_sums
from lightning_modules.server_part import ServerContext, ServerPart

PREDICTIONS = ("prototype", "head")
WEIGHTINGS = ("samples", "clients")


@METHODS.register("fedproto")
class FedProto(FederatedModule):
    personal_prefixes = ("",)
    protocol = "per_client"

    def __init__(self, *args, lam: float = 1.0, predict: str = "prototype", weighting: str = "samples",
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if predict not in PREDICTIONS:
            raise FedbenchError(f"FedProto's predict must be one of {PREDICTIONS}, got {predict!r}.")
        if weighting not in WEIGHTINGS:
            raise FedbenchError(f"FedProto's weighting must be one of {WEIGHTINGS}, got {weighting!r}.")
        self.lam, self.predict, self.weighting = lam, predict, weighting
        self.server_side = FedProtoServer(self)

    def prototype_loss(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        server = self.server_side
        protos = server.global_prototypes.to(f.device, f.dtype)[y]
        known = server.has_prototype.to(f.device)[y].unsqueeze(1)
        return ((f - protos) * known).pow(2).sum() / f.numel()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        f = self.features(x)
        loss = F.cross_entropy(self.head(f), y)
        if self.lam == 0 or not self.server_side.prototypes_ready:
            return loss
        return loss + self.lam * self.prototype_loss(f, y)

    def eval_logits(self, x: torch.Tensor) -> torch.Tensor:
        f = self.features(x)
        server = self.server_side
        if self.predict == "head" or not server.prototypes_ready:
            return self.head(f)
        protos = server.global_prototypes.to(f.device, f.dtype)
        mse = (f.unsqueeze(1) - protos.unsqueeze(0)).pow(2).mean(2)
        return (-mse).masked_fill(~server.has_prototype.to(f.device).unsqueeze(0), float("-inf"))

    def on_client_end(self, ctx: ClientContext) -> None:
        sums, counts = class_feature_sums(self, ctx)
        present = (counts > 0).float()
        ctx.uploads.update(proto_sum=sums, proto_count=counts,
                           proto_mean_sum=sums / counts.clamp(min=1).unsqueeze(1), proto_clients=present)


class FedProtoServer(ServerPart):
    """FedProto's server state, identical on every rank: the global class prototypes the clients regularise
    towards and predict with (plain tensors: every state_dict entry of the model is personal)."""

    def __init__(self, module: FedProto) -> None:
        super().__init__(module)
        self.global_prototypes = torch.zeros(module.num_classes, module.feature_dim)
        self.has_prototype = torch.zeros(module.num_classes, dtype=torch.bool)
        self.prototypes_ready = False  # a Python flag: no device sync per batch

    def upload_shapes(self) -> dict[str, tuple[int, ...]]:
        c, d = self.module.num_classes, self.module.feature_dim
        return {"proto_sum": (c, d), "proto_count": (c,), "proto_mean_sum": (c, d), "proto_clients": (c,)}

    def step(self, global_state: dict[str, torch.Tensor], extras: dict[str, torch.Tensor], round_idx: int,
             server: ServerContext) -> None:
        if self.module.weighting == "samples":
            total, weight = extras["proto_sum"], extras["proto_count"]
        else:
            total, weight = extras["proto_mean_sum"], extras["proto_clients"]
        seen = weight > 0
        device = total.device
        protos = self.global_prototypes.to(device)
        protos[seen] = (total[seen] / weight[seen].unsqueeze(1)).to(protos.dtype)
        self.global_prototypes = protos
        self.has_prototype = self.has_prototype.to(device) | seen
        self.prototypes_ready = bool(self.has_prototype.any())

    def state(self) -> dict[str, torch.Tensor]:
        return {"prototypes": self.global_prototypes.clone(), "has_prototype": self.has_prototype.clone()}

    def load_state(self, state: dict[str, torch.Tensor], server: ServerContext) -> None:
        self.global_prototypes = state["prototypes"].clone()
        self.has_prototype = state["has_prototype"].clone().bool()
        self.prototypes_ready = bool(self.has_prototype.any())
