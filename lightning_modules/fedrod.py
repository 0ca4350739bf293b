"""FedRoD (Chen & Chao, "On Bridging Generic and Personalized Federated Learning for Image
Classification", ICLR 2022; the linear personalised head variant).

Two heads on the shared body:
  - the generic head g (aggregated with the body) is trained with the balanced softmax
    (balanced risk) loss  CE(g(f) + gamma * log pi_k, y),  pi_k the client's class frequencies;
  - the personalised head p (kept per client) is trained with CE on  g(f) + p(f)  with the body
    features and the generic logits detached, so p never moves the body or the generic head.
Total local loss = both terms in one step and one optimizer (the gradients do not overlap).
Per-client evaluation predicts with g(f) + p(f).

gamma = 1: FedBM (TMI) Sec. IV-B "set gamma = 1 in FedROD". gamma is the exponent of the class
counts in the balanced softmax, N_k^gamma exp(g_k) / sum_j N_j^gamma exp(g_j) (FedRoD's BSM;
gamma = 1 is Ren et al.'s balanced softmax). The prior uses frequencies + 1e-9 (the shared
FedNPR component), so a class absent from the client gets a very negative prior.
The personalised head starts as a copy of the generic head's initialisation, as in the FedRoD
implementations of FedETF's and FedNH's code (the paper does not say).
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from lightning_modules.base import METHODS, ClientContext, FederatedModule
from lightning_modules.components.balanced_softmax import balanced_softmax_loss, class_log_prior
from lightning_modules.components.local_phases import PerClientProtocol


@METHODS.register("fedrod")
class FedRoD(PerClientProtocol, FederatedModule):
    personal_prefixes = ("p_head",)

    def __init__(self, *args, gamma: float = 1.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gamma = gamma
        self.p_head = copy.deepcopy(self.head)
        self._log_prior: torch.Tensor | None = None

    def on_client_start(self, ctx: ClientContext) -> None:
        self._log_prior = self.gamma * class_log_prior(ctx.labels, self.num_classes)

    def losses(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(generic balanced-softmax loss, personalised CE loss) of a batch."""
        f = self.features(x)
        generic = self.head(f)
        if self.client is None or self._log_prior is None:  # central training: no client prior
            loss_g = F.cross_entropy(generic, y)
        else:
            loss_g = balanced_softmax_loss(generic, y, self._log_prior)
        loss_p = F.cross_entropy(generic.detach() + self.p_head(f.detach()), y)
        return loss_g, loss_p

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss_g, loss_p = self.losses(*batch)
        return loss_g + loss_p

    def on_client_end(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        self._log_prior = None
        return {}

    def eval_logits(self, x: torch.Tensor) -> torch.Tensor:
        f = self.features(x)
        return self.head(f) + self.p_head(f)

    def global_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The global protocol (``fed.protocol: global``) scores the generic head alone, as FedETF's
        code tests FedRoD on the server test set (the route of FedBM's comparison)."""
        return self.head(self.features(x))
