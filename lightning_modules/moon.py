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

import torch
import torch.nn.functional as F
from torch import nn

from datamodules.errors import FedbenchError
from lightning_modules.base import METHODS, ClientContext, FederatedModule
from lightning_modules.components.state import FrozenModel

REPRESENTATION_PREFIXES = ("backbone", "projection")


@METHODS.register("moon")
class Moon(FederatedModule):
    def __init__(self, *args, mu: float = 1.0, temperature: float = 0.5, projection_dim: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if temperature <= 0:
            raise FedbenchError(f"MOON's temperature must be > 0, got {temperature}.")
        if projection_dim < 0:
            raise FedbenchError(f"MOON's projection_dim must be >= 0 (0 = no projection head), got {projection_dim}.")
        self.mu, self.temperature = mu, temperature
        if projection_dim > 0:
            d = self.feature_dim
            self.projection: nn.Module = nn.Sequential(nn.Linear(d, d), nn.ReLU(inplace=True), nn.Linear(d, projection_dim))
            self.head = nn.Linear(projection_dim, self.num_classes)
        else:
            self.projection = nn.Identity()
        self._global: FrozenModel | None = None
        self._previous: FrozenModel | None = None

    def representation(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(self.features(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.representation(x))

    @staticmethod
    def frozen_representation(model: FrozenModel, x: torch.Tensor) -> torch.Tensor:
        """The representation of x by a stored model (eval mode, no grad)."""
        return model.run("projection", model.features(x))

    def contrastive_loss(self, z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor) -> torch.Tensor:
        logits = torch.stack([F.cosine_similarity(z, z_glob, dim=1), F.cosine_similarity(z, z_prev, dim=1)], 1)
        target = torch.zeros(len(z), dtype=torch.long, device=z.device)
        return F.cross_entropy(logits / self.temperature, target)

    # ---- client ----------------------------------------------------------------------------
    def on_client_start(self, ctx: ClientContext) -> None:
        previous = ctx.state.get("previous")
        self._global = FrozenModel(self, ctx.global_state)
        self._previous = None if previous is None else FrozenModel(self, previous)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        z = self.representation(x)
        loss = F.cross_entropy(self.head(z), y)
        if self.client is None or self.mu == 0 or self._previous is None or self._global is None:
            return loss
        z_glob = self.frozen_representation(self._global, x)
        z_prev = self.frozen_representation(self._previous, x)
        return loss + self.mu * self.contrastive_loss(z, z_glob, z_prev)

    def on_client_end(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        ctx.state["previous"] = {k: v.detach().clone() for k, v in self.state_dict().items()
                                 if k.split(".", 1)[0] in REPRESENTATION_PREFIXES}
        self._global = self._previous = None
        return {}
