"""FedNTD on FST-CBDG's CLIP linear probe: the FedNTD row of FST-CBDG's Tables 1-2.

The model is CLIP-FC's (clip_fc.py): logits = W normalize(I) + b on frozen CLIP features, W initialised
from the class text features, b = 0, only (W, b) trained and averaged. The local objective is FedNTD's
(fedntd.py, Lee et al. 2022 Eq. 4-5): CE + beta * KL over the not-true classes between the received
global probe (the teacher, on the same normalised features) and the local one; beta 1, tau 1 (FedNTD's
config/fedntd.json; FST-CBDG gives neither).
"""
from __future__ import annotations

import torch.nn.functional as F

from lightning_modules.base import METHODS, ClientContext, Objective
from lightning_modules.clip_fc import ClipLinearProbe
from lightning_modules.components.state import FrozenModel
from lightning_modules.fedntd import FedNTD, ntd_loss


@METHODS.register("clip-fc-fedntd")
class ClipFcFedNTD(FedNTD, ClipLinearProbe):
    def client_objective(self, ctx: ClientContext) -> Objective:
        if self.beta == 0:
            return self.training_step
        teacher = FrozenModel(self, ctx.global_state)  # the received global probe

        def loss(batch):
            x, y = batch
            z = self.features(x)  # normalised CLIP features, for the probe and its teacher alike
            logits = self.head(z)
            return F.cross_entropy(logits, y) + self.beta * ntd_loss(logits, teacher.run("head", z), y, self.tau)

        return loss
