"""SCAFFOLD (Karimireddy et al., ICML 2020, Algorithm 1 with option II), server learning rate 1.

Client i keeps its control variate c_i (zero at first); the server keeps c (zero at first).
Client i's local update from the received model x:
    K local steps  y_i <- y_i - lr (g_i(y_i) - c_i + c)        (the correction c - c_i is added to
                                                                 the gradient after each backward)
    c_i+ = c_i - c + (x - y_i) / (K lr)                          (option II)
    upload delta c_i = c_i+ - c_i in the round's flat buffer;  c_i <- c_i+
Server: x is the orchestrator's average (global learning rate 1) and
    c <- c + (1/N) sum_{i in S} delta c_i                        (N = all clients in the federation)
so c is the sum of all clients' c_i divided by N (clients not yet sampled count with c_i = 0).

Deviation: local SGD with (heavy-ball) momentum moves the weights by more than K lr per unit
gradient, which would make option II unstable; ``K lr`` is therefore generalised to the
displacement a constant unit gradient produces under the optimizer's momentum in these K steps
(exactly K lr for plain SGD; the count restarts each round, so with fed.keep_optimizer_state the
carried-over momentum is not counted). Adam is treated as plain SGD here. Lee-Gihun/FedNTD's
Scaffold (``adaptive_divison``) divides by the same displacement (tests/golden/scaffold.json).
No hyperparameters (FedBM Sec. IV-B runs Scaffold with the common FedAvg settings).
"""
from __future__ import annotations

from typing import ClassVar

import torch

from lightning_modules.base import METHODS, ClientBatches, ClientContext, FederatedModule
from lightning_modules.components.gradients import add_to_gradients
from lightning_modules.components.state import trainable_shared_parameters
from lightning_modules.server_part import ServerContext, ServerPart


def unit_displacement(steps: int, lr: float, momentum: float) -> float:
    """How far ``steps`` SGD steps at ``lr`` with heavy-ball ``momentum`` (PyTorch's, no dampening)
    move a weight whose gradient is constantly 1: K lr without momentum."""
    buffer, total = 0.0, 0.0
    for _ in range(steps):
        buffer = 1.0 if buffer == 0.0 else momentum * buffer + 1.0  # PyTorch: buf = g at the first step
        total += lr * buffer
    return total


@METHODS.register("scaffold")
class Scaffold(FederatedModule):
    keeps_client_state: ClassVar[bool] = True  # ctx.state: its control variate c_i

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.server_side = ScaffoldServer(self)

    def controlled_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        return trainable_shared_parameters(self)

    def server_c(self, name: str, like: torch.Tensor) -> torch.Tensor:
        c = self.server_side.c.get(name)
        return torch.zeros_like(like) if c is None else c.to(like.device, like.dtype)

    # ---- client ----------------------------------------------------------------------------
    def control_variate_correction(self, ctx: ClientContext):
        """The function adding c - c_i to every controlled gradient (after each backward pass)."""
        params = self.controlled_parameters()
        if "c_local" not in ctx.state:
            ctx.state["c_local"] = {n: torch.zeros_like(p) for n, p in params}
        c_local = ctx.state["c_local"]
        live = [p for _, p in params]
        corrections = [self.server_c(n, p) - c_local[n] for n, p in params]

        def correct() -> None:
            add_to_gradients(live, corrections, copy_missing=True)  # one foreach add, not one per parameter

        return correct

    def local_update(self, ctx: ClientContext, batches: ClientBatches) -> int:
        correct = self.control_variate_correction(ctx)
        seen = self.train_epochs(ctx, batches, self.client_objective(ctx), after_backward=correct)
        hp = self.hparams
        momentum = float(hp.momentum) if hp.optimizer == "sgd" else 0.0
        self.update_control_variate(ctx, unit_displacement(ctx.local_epochs * len(batches), ctx.lr, momentum))
        return seen

    def update_control_variate(self, ctx: ClientContext, displacement: float) -> None:
        """Option II: c_i+ = c_i - c + (x - y_i) / (K lr); uploads delta c_i."""
        c_local = ctx.state["c_local"]
        for n, p in self.controlled_parameters():
            if displacement > 0:
                new = c_local[n] - self.server_c(n, p) + (ctx.global_state[n] - p.detach()) / displacement
            else:  # no local step was taken
                new = c_local[n]
            ctx.uploads[f"dc.{n}"] = new - c_local[n]
            c_local[n] = new


class ScaffoldServer(ServerPart):
    """Scaffold's server: the control variate c (= c_sum / N) the clients read, and its sum over all
    clients' c_i, the state a resumed run continues from."""

    def __init__(self, module: Scaffold) -> None:
        super().__init__(module)
        self.c_sum: dict[str, torch.Tensor] = {}  # sum over all clients of c_i (float64; absent = zero)
        self.c: dict[str, torch.Tensor] = {}  # server control variate c = c_sum / N (absent = zero)

    def upload_shapes(self) -> dict[str, tuple[int, ...]]:
        return {f"dc.{n}": tuple(p.shape) for n, p in self.module.controlled_parameters()}

    def step(self, global_state: dict[str, torch.Tensor], extras: dict[str, torch.Tensor], round_idx: int,
             server: ServerContext) -> None:
        num_clients = server.num_clients
        for n, p in self.module.controlled_parameters():
            dc = extras[f"dc.{n}"]
            total = self.c_sum.get(n)
            self.c_sum[n] = dc.clone() if total is None else total.to(dc.device) + dc
            self.c[n] = (self.c_sum[n] / num_clients).to(p.dtype)

    def scalars(self, round_idx: int) -> dict[str, float]:
        """The server control variate's L2 norm (one host read per round)."""
        if not self.c:
            return {}
        return {"control_variate_norm": float(torch.sqrt(sum(t.double().pow(2).sum() for t in self.c.values())))}

    def state(self) -> dict[str, torch.Tensor]:
        return {f"c_sum.{n}": t for n, t in self.c_sum.items()}

    def load_state(self, state: dict[str, torch.Tensor], server: ServerContext) -> None:
        self.c_sum = {k[len("c_sum."):]: v.clone() for k, v in state.items() if k.startswith("c_sum.")}
        dtypes = {n: p.dtype for n, p in self.module.controlled_parameters()}  # as step: the run's precision
        num_clients = server.num_clients
        self.c = {n: (t / num_clients).to(dtypes[n]) for n, t in self.c_sum.items()}
