"""Local training phases besides the client's main loop: FedRep's head epochs before its body
epochs, FedBABU's fine-tuning before a client is evaluated.

A phase trains only some parameters, with a fresh optimizer of the module's configured kind at the
round's learning rate, over the client's own samples in batches of the round's batch size: the
core's batches (``EpochBatches``, one length rule) reshuffled each epoch with the client's
``ctx.generator`` and without augmentation, through the core's loop (``run_epochs``).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from bench.core.batches import EpochBatches
from lightning_modules.base import ClientContext, FederatedModule, Objective, run_epochs


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


def train_params(module: FederatedModule, ctx: ClientContext, params: list[nn.Parameter], epochs: int,
                 objective: Objective | None = None, phase: str = "extra phase") -> int:
    """Train only ``params`` (module in train mode) for ``epochs`` over the client's samples with a
    fresh optimizer like the module's at ctx.lr, batches of ctx.batch_size reshuffled with
    ctx.generator; returns the number of samples trained. Default objective: ``module.training_step``."""
    if epochs <= 0 or not params:
        return 0
    batches = EpochBatches(ctx.data, ctx.indices, ctx.batch_size, ctx.seed, ctx.round_idx, ctx.client_id,
                           generator=ctx.generator)
    optimizer = optimizer_like(module, params, ctx.lr)
    module.train()
    try:
        with trainable_only(module, params):
            return run_epochs(batches, epochs, objective or module.training_step, optimizer, ctx.autocast,
                              where=f"in round {ctx.round_idx}, client {ctx.client_id} ({module.method_name()}: {phase})",
                              loss_scaling=ctx.loss_scaling, losses=ctx.losses)
    finally:
        for p in params:
            p.grad = None
