"""Random (Freezing): FedAvg with a frozen, randomly initialised linear classifier (FedCB §1's pilot
experiment, FedCB Table 1 "Random"; FedBM §IV-D / Table VIII "Random (Freezing)").

FedCB §1: "the server randomly initializes the global classifier and broadcasts it to all clients.
During training, we freeze local classifiers, and only train and upload feature extractors". So:
logits = W f(x) + b on the backbone's pooled feature f(x) (no projection, normalisation or
temperature), plain cross-entropy, the backbone trained and averaged as in FedAvg. The head
(W, b) is ``nn.Linear(feature_dim, K)`` with PyTorch's default initialisation (W by
kaiming_uniform(a=sqrt 5), i.e. U(-1/sqrt(d), 1/sqrt(d)), b ~ U(-1/sqrt(d), 1/sqrt(d))), as the
FedETF framework that FedBM's public code builds on creates its ``linear_head``; it is drawn from
the run's seeded RNG exactly as FedAvg's head is, so for the same seed it starts equal to FedAvg's.
It is never trained (no gradient, so neither weight decay nor momentum moves it) and never
aggregated or communicated (``frozen_prefixes``): every client holds the same initial head in
every round. Neither public repository (meiluzhu/FedBM 556511e, ZexiLee/ICCV-2023-FedETF 092ace3)
has a mode for this baseline.
"""
from __future__ import annotations

from lightning_modules.base import METHODS, FederatedModule


@METHODS.register("fedavg-random-frozen")
class FedAvgRandomFrozen(FederatedModule):
    """FedAvg whose linear classifier stays at its random initialisation."""

    frozen_prefixes = ("head",)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.head.requires_grad_(False)  # random and fixed: only the feature extractor trains

    def describe_backbone(self) -> str:
        return f"{super().describe_backbone()} + random frozen linear classifier"
