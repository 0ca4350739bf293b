"""FedBABU (Oh, Kim & Yun, "FedBABU: Toward Enhanced Representation for Federated Image
Classification", ICLR 2022, Algorithm 1).

During federated training the head stays at its random initialisation (identical on every
client, never trained nor aggregated); only the body is trained and averaged (Algorithm 1). For
evaluation each client personalises the received model by fine-tuning on its own training data for
``finetune_epochs`` epochs, is evaluated on its own test split, and the fine-tuning is undone:
what the client uploads is its federated (body-only) update, never the fine-tuned model.

Defaults: finetune_epochs = 5 (FedBABU's personalisation setting tau_f = 5; the seed papers give
none); finetune_part = "head" fine-tunes the head alone as the paper's abstract and FedNPR describe
it; "full" fine-tunes body and head (the paper's evaluation also reports whole-model fine-tuning,
and FedNH's benchmark code does that).

Deviations: fine-tuning uses the run's optimizer kind at the round's learning rate and batch size,
reshuffles the client's samples with its generator and uses no augmentation. Per-client
evaluation runs after every client's local training (the core ignores fed.eval_every there), so
fine-tuning costs finetune_epochs extra epochs per client per round.
"""
from __future__ import annotations

import torch

from bench.core.errors import FedbenchError
from lightning_modules.base import METHODS, ClientContext, FederatedModule
from lightning_modules.components.local_phases import train_params

FINETUNE_PARTS = ("head", "full")


@METHODS.register("fedbabu")
class FedBABU(FederatedModule):
    frozen_prefixes = ("head",)
    protocol = "per_client"

    def __init__(self, *args, finetune_epochs: int = 5, finetune_part: str = "head", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if finetune_epochs < 0:
            raise FedbenchError(f"FedBABU's finetune_epochs must be >= 0, got {finetune_epochs}.")
        if finetune_part not in FINETUNE_PARTS:
            raise FedbenchError(f"FedBABU's finetune_part must be one of {FINETUNE_PARTS}, got {finetune_part!r}.")
        self.finetune_epochs, self.finetune_part = finetune_epochs, finetune_part
        self.head.requires_grad_(False)  # random and fixed during federated training

    def finetune(self, ctx: ClientContext) -> int:
        """Personalise on the client's training data; returns the number of samples trained."""
        params = list(self.head.parameters()) if self.finetune_part == "head" else list(self.parameters())
        return train_params(self, ctx, params, self.finetune_epochs, phase="fine-tuning")

    def evaluate_client(self, ctx: ClientContext, evaluate) -> dict[str, float]:
        if self.finetune_epochs == 0:
            return evaluate()
        saved = {k: v.detach().clone() for k, v in self.state_dict().items()}
        try:
            self.finetune(ctx)
            return evaluate()
        finally:
            with torch.no_grad():
                for k, v in self.state_dict().items():
                    v.copy_(saved[k])
