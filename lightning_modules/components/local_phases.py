"""Local training phases outside the orchestrator's loop, and the round's local schedule.

FedRep trains its head for some epochs before the body; FedBABU fine-tunes on a client's data
before evaluating it; Scaffold's option-II control variate divides by K * lr. The core does not
hand the method the round's learning rate or batch size, so:
  - ``KeepsLocalOptimizer`` remembers the optimizer ``configure_optimizers`` built; the
    orchestrator sets the round's learning rate on exactly that object before training;
  - the batch size is read from the batches the orchestrator trains (see each method).
Extra phases shuffle the client's samples with ``ctx.generator`` (a pure function of seed,
round and client) and use no augmentation.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from bench.seeding import METHOD, derive_seed, torch_generator
from datamodules.errors import FedbenchError
from lightning_modules.base import ClientContext, FederatedModule


class KeepsLocalOptimizer:
    """Mixin for a FederatedModule: keeps the local optimizer so the method can read the round's lr."""

    local_optimizer: torch.optim.Optimizer | None = None

    def configure_optimizers(self) -> torch.optim.Optimizer:
        self.local_optimizer = super().configure_optimizers()  # type: ignore[misc]
        return self.local_optimizer

    def round_lr(self) -> float:
        """The learning rate of the round being trained (the configured lr before any round)."""
        if self.local_optimizer is None:
            return float(self.hparams.lr)  # type: ignore[attr-defined]
        return float(self.local_optimizer.param_groups[0]["lr"])


@contextlib.contextmanager
def trainable_only(module: nn.Module, params: list[nn.Parameter]) -> Iterator[None]:
    """Within the block only ``params`` require grad; every flag is restored afterwards."""
    keep = {id(p) for p in params}
    saved = [(p, p.requires_grad) for p in module.parameters()]
    for p in module.parameters():
        p.requires_grad_(id(p) in keep)
    try:
        yield
    finally:
        for p, flag in saved:
            p.requires_grad_(flag)


def optimizer_like(module: FederatedModule, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """An optimizer of the module's configured kind (sgd/adam/adamw with its momentum, betas and
    weight decay) over ``params`` only, at learning rate ``lr``."""
    with trainable_only(module, params):
        opt = FederatedModule.configure_optimizers(module)
    for group in opt.param_groups:
        group["lr"] = lr
    return opt


def client_generator(ctx: ClientContext) -> torch.Generator:
    if ctx.generator is not None:
        return ctx.generator
    return torch_generator(derive_seed(ctx.seed, ctx.round_idx, ctx.client_id, METHOD), ctx.indices.device)


def shuffled_batches(ctx: ClientContext, batch_size: int, epochs: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``epochs`` passes over the client's samples in batches, reshuffled each pass with the
    client's generator; a trailing batch of one sample is dropped (BatchNorm), as the core does."""
    if batch_size < 1:
        raise FedbenchError(f"batch size must be >= 1, got {batch_size}")
    gen = client_generator(ctx)
    n = len(ctx.indices)
    num_batches = n // batch_size if (n % batch_size == 1 and n > 1) else -(-n // batch_size)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen, device=gen.device).to(ctx.indices.device)
        order = ctx.indices[perm]
        for b in range(num_batches):
            yield ctx.data.to_float(order[b * batch_size : (b + 1) * batch_size])


def train_params(
    module: FederatedModule,
    ctx: ClientContext,
    params: list[nn.Parameter],
    epochs: int,
    batch_size: int,
    lr: float,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> int:
    """Train only ``params`` (module in train mode) for ``epochs`` over the client's data with a
    fresh optimizer like the module's; returns the number of steps. Default loss: CE of module(x)."""
    if epochs <= 0 or not params:
        return 0
    loss_fn = loss_fn or (lambda x, y: F.cross_entropy(module(x), y))
    opt = optimizer_like(module, params, lr)
    module.train()
    steps = 0
    nonfinite = False
    with trainable_only(module, params):
        for x, y in shuffled_batches(ctx, batch_size, epochs):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(x, y)
            nonfinite |= not bool(torch.isfinite(loss.detach()))
            loss.backward()
            opt.step()
            steps += 1
    for p in params:
        p.grad = None
    if nonfinite:
        raise FedbenchError(
            f"The loss became NaN/inf in an extra local phase of client {ctx.client_id}, round {ctx.round_idx}. "
            "Lower method.lr or check the method's hyperparameters."
        )
    return steps


class PerClientProtocol:
    """Mixin for per-client methods: evaluation of each client's own model on its own test split.

    ``personalised_scores`` is where a method personalises before ``evaluate()`` (and restores).
    The scores are returned under the ``test/<metric>`` keys the orchestrator tabulates: the core's
    ``evaluate_local`` returns bare metric names, which the per-client table does not find
    (every per-client metric would be NaN); idempotent once the core prefixes them itself.
    """

    protocol = "per_client"

    def personalised_scores(self, ctx: ClientContext, evaluate: Callable[[], dict[str, float]]) -> dict[str, float]:
        return evaluate()

    def evaluate_client(self, ctx: ClientContext, evaluate: Callable[[], dict[str, float]]) -> dict[str, float]:
        scores = self.personalised_scores(ctx, evaluate)
        return {k if "/" in k else f"test/{k}": v for k, v in scores.items()}
