"""FedRep (Collins et al., "Exploiting Shared Representations for Personalized Federated
Learning", ICML 2021, Algorithm 1).

Each client keeps its own head (personal, never aggregated). In a round, with the received body:
  1. the head is trained for ``head_epochs`` epochs with the body frozen;
  2. the body is trained for the run's ``fed.local_epochs`` with the head frozen;
only the body (with its BatchNorm buffers) is averaged. Evaluation is per client: its body and
head right after its local training, on its own test split.

head_epochs = 10: FedRep trains the head for about ten local epochs per body epoch (its code:
local_ep 10 with local_rep_ep 1 body epoch); the seed papers do not restate it. FedETF's code,
on which FedBM's comparison is built, uses as many head epochs as body epochs: set head_epochs to
fed.local_epochs to reproduce that.

Core gap: the method is not told the round's batch size or learning rate before training, so the
head phase runs at the first local training step, with that batch's size and the learning rate
the orchestrator set for the round; it reshuffles the client's samples with ``ctx.generator``
and uses no augmentation. Both phases run in train mode (BatchNorm statistics update in both),
as in FedRep's code.
"""
from __future__ import annotations

import torch

from bench.core.errors import FedbenchError
from lightning_modules.base import METHODS, ClientContext, FederatedModule
from lightning_modules.components.local_phases import KeepsLocalOptimizer, PerClientProtocol, train_params


@METHODS.register("fedrep")
class FedRep(PerClientProtocol, KeepsLocalOptimizer, FederatedModule):
    personal_prefixes = ("head",)

    def __init__(self, *args, head_epochs: int = 10, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if head_epochs < 0:
            raise FedbenchError(f"FedRep's head_epochs must be >= 0, got {head_epochs}.")
        self.head_epochs = head_epochs
        self._head_pending = False

    def on_client_start(self, ctx: ClientContext) -> None:
        self.head.requires_grad_(False)  # the round's optimizer (configure_optimizers) then holds the body only
        self._head_pending = True

    def train_head(self, ctx: ClientContext, batch_size: int) -> int:
        """Phase 1: the head alone, body frozen; returns the number of steps."""
        return train_params(self, ctx, list(self.head.parameters()), self.head_epochs, batch_size, self.round_lr())

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.client is not None and self._head_pending:
            self._head_pending = False
            self.train_head(self.client, batch_size=len(batch[1]))
        return super().training_step(batch, batch_idx)  # phase 2: the body, head frozen

    def on_client_end(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        self.head.requires_grad_(True)
        self._head_pending = False
        return {}
