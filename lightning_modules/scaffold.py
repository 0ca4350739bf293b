"""SCAFFOLD (Karimireddy et al., ICML 2020, Algorithm 1 with option II), server learning rate 1.

Client i keeps its control variate c_i (zero at first); the server keeps c. Every local step
uses the corrected gradient  g + c - c_i  (added after backward). After K local steps of size lr:
    c_i+ = c_i - c + (x - y_i) / (K lr)          (option II; x = received model, y_i = trained one)
and the client uploads delta c_i = c_i+ - c_i in the round's flat buffer. The server model is the
orchestrator's average; the server control variate moves by (|S|/N) mean_S(delta c_i), N = all
clients in the federation, i.e. c = (1/N) sum_i c_i (all start at zero; a client not yet sampled
counts with c_i = 0).

A choice the paper leaves open:
- Local SGD with (heavy-ball) momentum moves the weights by more than K * lr per unit gradient,
  which would make option II unstable; ``K lr`` is therefore generalised to the displacement a
  constant unit gradient produces under the optimizer's momentum in these K steps (exactly K lr
  for plain SGD; the count restarts each round, so with fed.keep_optimizer_state the carried-over
  momentum is not counted). Adam is treated as plain SGD here.
No hyperparameters (FedBM Sec. IV-B runs Scaffold with the common FedAvg settings).
"""
from __future__ import annotations

import torch

from lightning_modules.base import METHODS, ClientContext, FederatedModule
from lightning_modules.components.local_phases import KeepsLocalOptimizer
from lightning_modules.components.state import trainable_shared_parameters


@METHODS.register("scaffold")
class Scaffold(KeepsLocalOptimizer, FederatedModule):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.c: dict[str, torch.Tensor] = {}  # server control variate (absent = zero)
        self.c_sum: dict[str, torch.Tensor] = {}  # sum over all clients of c_i (float64)
        self._corrections: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        self._unit_displacement = 0.0  # sum over steps of lr * (momentum amplification of a unit gradient)
        self._momentum_buffer = 0.0

    def controlled_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        return trainable_shared_parameters(self)

    def upload_shapes(self) -> dict[str, tuple[int, ...]]:
        return {f"dc.{n}": tuple(p.shape) for n, p in self.controlled_parameters()}

    # ---- client ----------------------------------------------------------------------------
    def on_client_start(self, ctx: ClientContext) -> None:
        params = self.controlled_parameters()
        if "c_local" not in ctx.state:
            ctx.state["c_local"] = {n: torch.zeros_like(p) for n, p in params}
        c_local = ctx.state["c_local"]
        self._corrections = [(p, self.server_c(n, p) - c_local[n]) for n, p in params]
        self._unit_displacement, self._momentum_buffer = 0.0, 0.0

    def server_c(self, name: str, like: torch.Tensor) -> torch.Tensor:
        c = self.c.get(name)
        return torch.zeros_like(like) if c is None else c.to(like.device, like.dtype)

    def on_after_backward(self) -> None:
        if self.client is None:
            return
        for p, correction in self._corrections:
            if p.grad is None:
                p.grad = correction.clone()
            else:
                p.grad.add_(correction)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if self.client is None or self.local_optimizer is None:
            return
        group = self.local_optimizer.param_groups[0]
        momentum = float(group.get("momentum", 0.0)) if isinstance(self.local_optimizer, torch.optim.SGD) else 0.0
        dampening = float(group.get("dampening", 0.0)) if momentum else 0.0
        # a constant unit gradient through PyTorch's SGD: buf = m buf + (1 - d) (buf = 1 at the first step)
        self._momentum_buffer = 1.0 if self._momentum_buffer == 0.0 else momentum * self._momentum_buffer + (1 - dampening)
        step = 1.0 + momentum * self._momentum_buffer if group.get("nesterov", False) else self._momentum_buffer
        self._unit_displacement += float(group["lr"]) * step

    def on_client_end(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        c_local = ctx.state["c_local"]
        extras: dict[str, torch.Tensor] = {}
        for n, p in self.controlled_parameters():
            if self._unit_displacement > 0:
                new = c_local[n] - self.server_c(n, p) + (ctx.global_state[n] - p.detach()) / self._unit_displacement
            else:  # no local step was taken
                new = c_local[n]
            extras[f"dc.{n}"] = new - c_local[n]
            c_local[n] = new
        self._corrections = []
        return extras

    # ---- server ----------------------------------------------------------------------------
    def server_step(self, global_state: dict[str, torch.Tensor], extras: dict[str, torch.Tensor], round_idx: int) -> None:
        num_clients = self.server_comm.num_clients
        for n, p in self.controlled_parameters():
            dc = extras[f"dc.{n}"]
            total = self.c_sum.get(n)
            self.c_sum[n] = dc.clone() if total is None else total.to(dc.device) + dc
            self.c[n] = (self.c_sum[n] / num_clients).to(p.dtype)

    def server_state(self) -> dict[str, torch.Tensor]:
        return {f"c_sum.{n}": t for n, t in self.c_sum.items()}

    def load_server_state(self, state: dict[str, torch.Tensor]) -> None:
        self.c_sum = {k[len("c_sum."):]: v.clone() for k, v in state.items() if k.startswith("c_sum.")}
        self.c = {n: (t / self.server_comm.num_clients).float() for n, t in self.c_sum.items()}
