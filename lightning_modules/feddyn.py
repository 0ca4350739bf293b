"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021, Algorithm 1).

Client k in round t, starting from the server model theta^{t-1}, minimises
    L_k(theta) - <g_k, theta> + (alpha / 2) ||theta - theta^{t-1}||^2
where g_k (the paper's grad L_k(theta_k^{t-1}), zero at first) is the client's persistent linear
term. The two extra terms are applied as the gradient correction
-g_k + alpha (theta - theta^{t-1}) after each backward pass (``train_epochs``' after_backward).
After training:  g_k <- g_k - alpha (theta_k^t - theta^{t-1}).
Server, after the orchestrator's average theta_avg of the round's clients:
    h^t = h^{t-1} - alpha (theta_avg - theta^{t-1}),     theta^t = theta_avg - h^t / alpha.
The paper scales the h step by |P_t| / m (participants over all clients); like FedETF's code, on
which FedBM's comparison is built, we use the participants' mean: both agree under full
participation. Only trainable parameters carry g_k and h; BatchNorm buffers are plainly averaged.

alpha = 0.01: FedBM (TMI) Sec. IV-B, "0.01 in FedDyn as suggested in their official implementations".
"""
from __future__ import annotations

from typing import ClassVar

import torch

from bench.core.compat import foreach
from bench.core.errors import FedbenchError
from lightning_modules.base import METHODS, ClientBatches, ClientContext, FederatedModule
from lightning_modules.components.gradients import add_to_gradients
from lightning_modules.components.state import trainable_shared_parameters
from lightning_modules.server_part import ServerContext, ServerPart


@METHODS.register("feddyn")
class FedDyn(FederatedModule):
    keeps_client_state: ClassVar[bool] = True  # ctx.state: its gradient memory

    def __init__(self, *args, alpha: float = 0.01, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if alpha <= 0:
            raise FedbenchError(f"FedDyn's alpha must be > 0, got {alpha}.")
        self.alpha = alpha
        self.server_side = FedDynServer(self)  # after the model is built: it keeps the initial model

    def dynamic_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """The trainable, aggregated parameters (those FedDyn regularises)."""
        return trainable_shared_parameters(self)

    # ---- client ----------------------------------------------------------------------------
    def dynamic_regulariser(self, ctx: ClientContext):
        """The function adding the gradient of the two extra terms, -g_k + alpha (theta - theta^{t-1}),
        to every regularised gradient (after each backward pass); and the client's terms."""
        params = self.dynamic_parameters()
        if "grad_memory" not in ctx.state:
            ctx.state["grad_memory"] = {n: torch.zeros_like(p) for n, p in params}
        memory = ctx.state["grad_memory"]
        terms = [(p, ctx.global_state[n], memory[n]) for n, p in params]
        live = [p for p, _, _ in terms]
        anchors, g_ks = [a for _, a, _ in terms], [g for _, _, g in terms]

        def correct() -> None:
            # alpha (theta - theta^{t-1}) - g_k, added to the gradients: a few foreach ops, not a Python loop
            # per parameter (the same arithmetic in the same order, so the same bits)
            with torch.no_grad():
                correction = foreach("mul")(foreach("sub")(live, anchors), self.alpha)
                foreach("sub_")(correction, g_ks)
            add_to_gradients(live, correction, copy_missing=False)

        return correct, terms

    def local_update(self, ctx: ClientContext, batches: ClientBatches) -> int:
        correct, terms = self.dynamic_regulariser(ctx)
        seen = self.train_epochs(ctx, batches, self.client_objective(ctx), after_backward=correct)
        self.update_grad_memory(terms)
        return seen

    def update_grad_memory(self, terms) -> None:
        """After local training: g_k <- g_k - alpha (theta_k^t - theta^{t-1}), in place."""
        with torch.no_grad():
            step = foreach("mul")(foreach("sub")([p for p, _, _ in terms], [a for _, a, _ in terms]),
                                      self.alpha)
            foreach("sub_")([g for _, _, g in terms], step)


class FedDynServer(ServerPart):
    """FedDyn's server state: h, and the previous server model theta^{t-1} (the initial model before
    round 0); its step edits the averaged model in place."""

    def __init__(self, module: FedDyn) -> None:
        super().__init__(module)
        self.h: dict[str, torch.Tensor] = {}
        self.previous_global = {n: p.detach().clone() for n, p in module.dynamic_parameters()}

    def step(self, global_state: dict[str, torch.Tensor], extras: dict[str, torch.Tensor], round_idx: int,
             server: ServerContext) -> None:
        for name, _ in self.module.dynamic_parameters():
            avg = global_state[name]
            prev = self.previous_global[name].to(avg.device, avg.dtype)
            h = self.h.get(name, torch.zeros_like(avg)).to(avg.device, avg.dtype) - self.module.alpha * (avg - prev)
            self.h[name] = h
            avg.sub_(h / self.module.alpha)
            self.previous_global[name] = avg.clone()

    def state(self) -> dict[str, torch.Tensor]:
        return {**{f"h.{n}": t for n, t in self.h.items()},
                **{f"previous.{n}": t for n, t in self.previous_global.items()}}

    def load_state(self, state: dict[str, torch.Tensor], server: ServerContext) -> None:
        self.h = {k[len("h."):]: v.clone() for k, v in state.items() if k.startswith("h.")}
        self.previous_global = {k[len("previous."):]: v.clone() for k, v in state.items() if k.startswith("previous.")}
