"""FedProx (Li et al., 2020): FedAvg plus (mu / 2) ||w - w_global||^2 in the local objective.

The proximal term is an objective term (``ProximalTerm``, option ``mu``), so it composes with any model:
``clip-ft-fedprox`` (clip_ft_fedprox.py) is the same term on the fine-tuned CLIP.

The term runs as a handful of foreach ops per step (``ProximalLoss``), not three ops per parameter:
its gradient mu (w - w_global) is bit-identical to the one autograd took through the per-parameter
formula (tests/methods/test_launch_counts.py); its value, which is only logged, is (mu / 2) times the sum of
the squared per-parameter norms (within float rounding of the per-parameter sums).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from bench.core.compat import foreach
from lightning_modules.base import METHODS, ClientContext, FederatedModule, ObjectiveTerm, TermLoss


class ProximalLoss(torch.autograd.Function):
    """(half_mu) sum_i ||p_i - w_i||^2 over the parameters ``params`` against the anchors ``anchors``."""

    @staticmethod
    def forward(half_mu: float, anchors: list[torch.Tensor], *params: torch.Tensor) -> torch.Tensor:
        diffs = foreach("sub")(list(params), anchors)
        return half_mu * torch.stack(foreach("norm")(diffs)).pow(2).sum(), diffs

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.half_mu = inputs[0]
        ctx.diffs = output[1]
        ctx.mark_non_differentiable(*output[1])

    @staticmethod
    def backward(ctx, grad_value: torch.Tensor, *_):
        # as autograd through half_mu * sum((p - w).pow(2)): (grad * half_mu) * (2 (p - w)), where scaling by 2
        # is exact, so (2 grad half_mu) (p - w) rounds to the same bits
        scale = (grad_value * ctx.half_mu) * 2
        return (None, None, *foreach("mul")(ctx.diffs, scale))


@dataclass(frozen=True)
class ProximalTerm(ObjectiveTerm):
    """(mu / 2) ||w - w_global||^2 over the trainable parameters the client received."""

    name: ClassVar[str] = "prox"
    mu: float = 0.001

    def for_client(self, module: FederatedModule, ctx: ClientContext) -> TermLoss | None:
        if self.mu == 0:
            return None
        pairs = [(p, ctx.global_state[n]) for n, p in module.named_parameters()
                 if p.requires_grad and n in ctx.global_state]
        params, anchors = [p for p, _ in pairs], [w for _, w in pairs]
        return lambda batch, f: ProximalLoss.apply(0.5 * self.mu, anchors, *params)[0]


@METHODS.register("fedprox")
class FedProx(FederatedModule):
    objective_terms = (ProximalTerm,)
