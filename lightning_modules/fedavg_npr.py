"""FedAvg + NPR (FedNPR, Sec. 5.4 / Table 6): FedAvg's cross-entropy plus the NPR regulariser.

Unlike FedNPR there is no balanced softmax, so the two rows isolate BSM's share. Evaluated
under FedNPR's per-client protocol; with ``lam: 0`` it is plain FedAvg under that protocol
(the prototypes are then never computed), which is how FedNPR's tables show a FedAvg row.
"""
from __future__ import annotations

from typing import ClassVar

import torch.nn.functional as F

from lightning_modules.base import METHODS, ClientContext, Objective
from lightning_modules.fednpr import NPRMethod


@METHODS.register("fedavg-npr")
class FedAvgNPR(NPRMethod):
    protocol: ClassVar[str] = "per_client"

    def client_objective(self, ctx: ClientContext) -> Objective:
        return self.npr.objective(self, ctx, lambda f, y: F.cross_entropy(self.head(f), y))
