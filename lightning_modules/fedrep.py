"""FedRep (Collins et al., "Exploiting Shared Representations for Personalized Federated
Learning", ICML 2021, Algorithm 1).

Each client keeps its own head (personal, never aggregated). Its local update, with the received
body (``local_update``):
  1. the head is trained for ``head_epochs`` epochs with the body frozen;
  2. the body is trained for the run's ``fed.local_epochs`` with the head frozen, minimising
     ``client_objective(ctx)`` (CE; FedRep+NPR adds NPR, fedrep_npr.py), which is built from the
     received model before phase 1;
only the body (with its BatchNorm buffers) is averaged. Evaluation is per client: its
body and head right after its local training, on its own test split.

head_epochs = 10: FedRep trains the head for about ten local epochs per body epoch (its code:
local_ep 10 with local_rep_ep 1 body epoch); the seed papers do not restate it. FedETF's code,
on which FedBM's comparison is built, uses as many head epochs as body epochs: set head_epochs to
fed.local_epochs to reproduce that.

Deviations: the paper's local steps are plain gradient steps; here both phases use the run's
optimizer (a fresh one for the head phase; the body's carries over with fed.keep_optimizer_state)
at the round's learning rate and batch size. The head phase reshuffles the client's samples with
its generator and uses no augmentation. Both phases run in train mode (BatchNorm statistics update
in both), as in FedRep's code.
"""
from __future__ import annotations

from bench.core.errors import FedbenchError
from lightning_modules.base import METHODS, ClientBatches, ClientContext, FederatedModule
from lightning_modules.components.local_phases import train_params


@METHODS.register("fedrep")
class FedRep(FederatedModule):
    personal_prefixes = ("head",)
    protocol = "per_client"

    def __init__(self, *args, head_epochs: int = 10, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if head_epochs < 0:
            raise FedbenchError(f"FedRep's head_epochs must be >= 0, got {head_epochs}.")
        self.head_epochs = head_epochs

    def train_head(self, ctx: ClientContext) -> int:
        """Phase 1: the head alone, body frozen; returns the number of samples trained."""
        return train_params(self, ctx, list(self.head.parameters()), self.head_epochs, phase="head phase")

    def local_update(self, ctx: ClientContext, batches: ClientBatches) -> int:
        body_objective = self.client_objective(ctx)  # built from the received model, before the head moves
        self.train_head(ctx)
        self.head.requires_grad_(False)  # phase 2: the local optimizer then holds the body only
        try:
            return self.train_epochs(ctx, batches, body_objective)
        finally:
            self.head.requires_grad_(True)
