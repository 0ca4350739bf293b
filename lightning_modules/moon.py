"""MOON (Li, He & Song, "Model-Contrastive Federated Learning", CVPR 2021, Eq. 3-4).

Local objective:  CE(head(z), y) + mu * l_con, with the representation z of the model being
trained, z_glob of the received global model (positive) and z_prev of this client's own model
at the end of its previous participation (negative):
    l_con = -log( exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )
with cosine similarity sim. mu = 1, tau = 0.5: MOON paper (tau 0.5 throughout; mu 1 for
CIFAR-100/Tiny-ImageNet, 5 for CIFAR-10); the seed papers give no other value.

Choices:
- Representation: the backbone's pooled features by default (the same architecture as every other
  baseline here); ``projection_dim > 0`` adds MOON's projection head (Linear-ReLU-Linear to
  ``projection_dim``, 256 in the paper) between the backbone and the classifier.
- The global and previous models run in eval mode without gradients (as MOON's code freezes
  them), from stored state tensors through ``torch.func.functional_call`` on the live modules:
  no model copies. Only the representation's state (backbone, projection) is stored per client.
- A client taking part for the first time has no previous model; MOON's code then uses the
  initial model, identical to the global one at the first round, so l_con = log 2 with zero
  gradient: the term is skipped until the client has a previous model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.errors import FedbenchError
from lightning_modules.base import METHODS, ClientContext, FederatedModule, Objective, ObjectiveTerm, TermLoss
from lightning_modules.components.state import FrozenModel

REPRESENTATION_PREFIXES = ("backbone", "projection")


def model_contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor,
                           temperature: float) -> torch.Tensor:
    """l_con of MOON's Eq. 3: the positive is the global model's representation, the negative the
    client's previous model's."""
    logits = torch.stack([F.cosine_similarity(z, z_glob, dim=1), F.cosine_similarity(z, z_prev, dim=1)], 1)
    target = torch.zeros(len(z), dtype=torch.long, device=z.device)
    return F.cross_entropy(logits / temperature, target)


def check_temperature(temperature: float) -> None:
    if temperature <= 0:
        raise FedbenchError(f"MOON's temperature must be > 0, got {temperature}.")


def reference_models(module: FederatedModule, ctx: ClientContext) -> tuple[FrozenModel, FrozenModel | None]:
    """The received global model (positive) and the client's own previous model (negative; None
    before its first participation), both frozen, in eval mode."""
    previous = ctx.state.get("previous")
    return FrozenModel(module, ctx.global_state), None if previous is None else FrozenModel(module, previous)


def keep_representation(module: FederatedModule, ctx: ClientContext) -> None:
    """Store the client's representation state (backbone, projection) as its next 'previous' model."""
    ctx.state["previous"] = {k: v.detach().clone() for k, v in module.state_dict().items()
                             if k.split(".", 1)[0] in REPRESENTATION_PREFIXES}


@dataclass(frozen=True)
class ModelContrast(ObjectiveTerm):
    """MOON's term mu * l_con on a model whose representation is its pooled features (no projection
    head): an objective term for any model (``clip-ft-moon``: the fine-tuned CLIP's image embedding)."""

    name: ClassVar[str] = "moon"
    keeps_client_state: ClassVar[bool] = True  # ctx.state: the client's previous model
    mu: float = 1.0
    temperature: float = 0.5

    def __post_init__(self) -> None:
        check_temperature(self.temperature)

    def for_client(self, module: FederatedModule, ctx: ClientContext) -> TermLoss | None:
        positive, negative = reference_models(module, ctx)
        if self.mu == 0 or negative is None:
            return None
        return lambda batch, f: self.mu * model_contrastive_loss(f, positive.features(batch[0]),
                                                                 negative.features(batch[0]), self.temperature)

    def on_client_end(self, module: FederatedModule, ctx: ClientContext) -> None:
        keep_representation(module, ctx)


@METHODS.register("moon")
class Moon(FederatedModule):
    keeps_client_state: ClassVar[bool] = True  # ctx.state: its previous model

    def __init__(self, *args, mu: float = 1.0, temperature: float = 0.5, projection_dim: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        check_temperature(temperature)
        if projection_dim < 0:
            raise FedbenchError(f"MOON's projection_dim must be >= 0 (0 = no projection head), got {projection_dim}.")
        self.mu, self.temperature = mu, temperature
        if projection_dim > 0:
            d = self.feature_dim
            self.projection: nn.Module = nn.Sequential(nn.Linear(d, d), nn.ReLU(inplace=True), nn.Linear(d, projection_dim))
            self.head = nn.Linear(projection_dim, self.num_classes)
        else:
            self.projection = nn.Identity()

    def representation(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(self.features(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.representation(x))

    def contrastive_loss(self, z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor) -> torch.Tensor:
        return model_contrastive_loss(z, z_glob, z_prev, self.temperature)

    # ---- client ----------------------------------------------------------------------------
    def reference_models(self, ctx: ClientContext) -> tuple[FrozenModel, FrozenModel | None]:
        return reference_models(self, ctx)

    def client_objective(self, ctx: ClientContext) -> Objective:
        positive, negative = self.reference_models(ctx)

        def loss(batch):
            x, y = batch
            z = self.representation(x)
            ce = F.cross_entropy(self.head(z), y)
            if self.mu == 0 or negative is None:
                return ce
            z_glob = positive.run("projection", positive.features(x))
            z_prev = negative.run("projection", negative.features(x))
            return ce + self.mu * self.contrastive_loss(z, z_glob, z_prev)

        return loss

    def on_client_end(self, ctx: ClientContext) -> None:
        keep_representation(self, ctx)
