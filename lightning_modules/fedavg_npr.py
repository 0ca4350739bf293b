"""FedAvg + NPR: FedAvg's cross-entropy plus the NPR regulariser, every tensor averaged.

Unlike FedNPR there is no balanced softmax (it is ``fednpr`` with ``balanced_softmax: false``), so the
two isolate BSM's share. FedNPR's Table 6 row "FedAvg+NPR" prints FedNPR's own Table 3 numbers, so the
table configs compare that row with ``fednpr``, not with this method. Evaluated under FedNPR's
per-client protocol; with ``lam: 0`` it is plain FedAvg under that protocol (the prototypes are then
never computed).
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
