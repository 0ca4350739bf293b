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
``prior="counts"`` is FedETF's code instead (client_funct.py balanced_softmax_loss with
nodes.py generate_sample_per_class): log of the class counts with an absent class counted as 1, so an
absent class keeps a finite prior (-log n relative to the frequencies) where ours removes it.
The personalised head starts as a copy of the generic head's initialisation, as in the FedRoD
implementations of FedETF's and FedNH's code (the paper does not say).
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from bench.core.errors import FedbenchError
from lightning_modules.base import METHODS, ClientContext, FederatedModule, Objective
from lightning_modules.components.balanced_softmax import balanced_softmax_loss, class_log_prior

PRIORS = ("frequency", "counts")


@METHODS.register("fedrod")
class FedRoD(FederatedModule):
    personal_prefixes = ("p_head",)
    protocol = "per_client"

    def __init__(self, *args, gamma: float = 1.0, prior: str = "frequency", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if prior not in PRIORS:
            raise FedbenchError(f"FedRoD's prior must be one of {PRIORS}, got {prior!r}.")
        self.gamma, self.prior = gamma, prior
        self.p_head = copy.deepcopy(self.head)

    def feature_loss(self, ctx: ClientContext):
        """The client's loss on pooled features f: generic balanced-softmax loss + personalised CE."""
        if self.prior == "counts":
            log_prior = self.gamma * ctx.class_counts().clamp(min=1).to(torch.float64).log().float()
        else:
            log_prior = self.gamma * class_log_prior(ctx.labels, self.num_classes)

        def loss(f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            generic = self.head(f)
            loss_g = balanced_softmax_loss(generic, y, log_prior)
            loss_p = F.cross_entropy(generic.detach() + self.p_head(f.detach()), y)
            return loss_g + loss_p

        return loss

    def client_objective(self, ctx: ClientContext) -> Objective:
        return self.feature_objective(ctx, self.feature_loss(ctx))

    def eval_logits(self, x: torch.Tensor) -> torch.Tensor:
        f = self.features(x)
        return self.head(f) + self.p_head(f)

    def global_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The global protocol (``fed.protocol: global``) scores the generic head alone, as FedETF's
        code tests FedRoD on the server test set (the route of FedBM's comparison)."""
        return self.head(self.features(x))
