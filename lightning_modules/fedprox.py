"""FedProx (Li et al., 2020): FedAvg plus (mu / 2) ||w - w_global||^2 in the local objective."""
from __future__ import annotations

import torch

from lightning_modules.base import METHODS, ClientContext, FederatedModule, Objective


@METHODS.register("fedprox")
class FedProx(FederatedModule):
    def __init__(self, *args, mu: float = 0.001, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.mu = mu

    def client_objective(self, ctx: ClientContext) -> Objective:
        if self.mu == 0:
            return self.training_step
        anchors = [(p, ctx.global_state[n]) for n, p in self.named_parameters()
                   if p.requires_grad and n in ctx.global_state]

        def loss(batch):
            ce = self.training_step(batch)
            return ce + 0.5 * self.mu * torch.stack([(p - w).pow(2).sum() for p, w in anchors]).sum()

        return loss
