"""FedProx (Li et al., 2020): FedAvg plus (mu / 2) ||w - w_global||^2 in the local objective.

The proximal term is an objective term (``ProximalTerm``, option ``mu``), so it composes with any model:
``clip-ft-fedprox`` (clip_ft_fedprox.py) is the same term on the fine-tuned CLIP.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from lightning_modules.base import METHODS, ClientContext, FederatedModule, ObjectiveTerm, TermLoss


@dataclass(frozen=True)
class ProximalTerm(ObjectiveTerm):
    """(mu / 2) ||w - w_global||^2 over the trainable parameters the client received."""

    name: ClassVar[str] = "prox"
    mu: float = 0.001

    def for_client(self, module: FederatedModule, ctx: ClientContext) -> TermLoss | None:
        if self.mu == 0:
            return None
        anchors = [(p, ctx.global_state[n]) for n, p in module.named_parameters()
                   if p.requires_grad and n in ctx.global_state]
        return lambda batch, f: 0.5 * self.mu * torch.stack([(p - w).pow(2).sum() for p, w in anchors]).sum()


@METHODS.register("fedprox")
class FedProx(FederatedModule):
    objective_terms = (ProximalTerm,)
