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
from torch.func import functional_call

from bench.core.errors import FedbenchError
from lightning_modules.base import METHODS, ClientContext, FederatedModule

REPRESENTATION_PREFIXES = ("backbone", "projection")


def substate(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries under ``prefix.`` with the prefix stripped (a submodule's state)."""
    cut = len(prefix) + 1
    return {k[cut:]: v for k, v in state.items() if k.startswith(prefix + ".")}


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
        self._global: dict[str, dict[str, torch.Tensor]] | None = None
        self._previous: dict[str, dict[str, torch.Tensor]] | None = None

    def representation(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(self.features(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.representation(x))

    def representation_state(self, state: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
        return {p: substate(state, p) for p in REPRESENTATION_PREFIXES}

    @torch.no_grad()
    def frozen_representation(self, states: dict[str, dict[str, torch.Tensor]], x: torch.Tensor) -> torch.Tensor:
        """The representation of x by the model whose state is ``states`` (eval mode, no grad)."""
        modes = [(m, m.training) for m in (self.backbone, self.projection)]
        for m, _ in modes:
            m.eval()
        try:
            z = functional_call(self.backbone, states["backbone"], (x,))
            return functional_call(self.projection, states["projection"], (z,))
        finally:
            for m, mode in modes:
                m.train(mode)

    def contrastive_loss(self, z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor) -> torch.Tensor:
        logits = torch.stack([F.cosine_similarity(z, z_glob, dim=1), F.cosine_similarity(z, z_prev, dim=1)], 1)
        target = torch.zeros(len(z), dtype=torch.long, device=z.device)
        return F.cross_entropy(logits / self.temperature, target)

    # ---- client ----------------------------------------------------------------------------
    def on_client_start(self, ctx: ClientContext) -> None:
        self._global = self.representation_state(ctx.global_state)
        self._previous = ctx.state.get("previous")

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
        own = {k: v.detach().clone() for k, v in self.state_dict().items() if k.split(".", 1)[0] in REPRESENTATION_PREFIXES}
        ctx.state["previous"] = self.representation_state(own)
        self._global = self._previous = None
        return {}
