"""FedNPR (Wicaksana et al.): balanced softmax + non-parametric regularisation, FedAvg aggregation.

Local objective (Eq. 5): ``BSM + lambda * NPR``. BSM (Eq. 4) is the cross-entropy of the logits
shifted by the log of the client's own class frequencies (computed at the start of each round
from the client's training labels); evaluation uses the plain logits (``eval_logits`` is the
base's ``self(x)``). NPR comes from :class:`~lightning_modules.npr_mixin.NPRMixin`. Every
parameter and buffer is averaged, weighted by sample counts (Eq. 6). Protocol ``per_client``:
each client's model right after its local training, on its own stratified test split.
"""
from __future__ import annotations

from typing import ClassVar

import torch.nn.functional as F
from torch import Tensor

from lightning_modules.base import METHODS, ClientContext, FederatedModule
from lightning_modules.components.balanced_softmax import balanced_softmax_loss, class_log_prior
from lightning_modules.npr_mixin import NPRMixin


class BalancedSoftmax(FederatedModule):
    """Local loss = CE(logits + log client prior); plain logits at test. Not registered by itself.

    Without a client (central training) the loss is plain cross-entropy.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log_prior: Tensor | None = None  # the training client's, a plain attribute (not state)

    def on_client_start(self, ctx: ClientContext) -> None:
        super().on_client_start(ctx)
        self.log_prior = class_log_prior(ctx.labels, self.num_classes)

    def on_client_end(self, ctx: ClientContext) -> dict[str, Tensor]:
        self.log_prior = None
        return super().on_client_end(ctx)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x)
        if self.client is None or self.log_prior is None:
            return F.cross_entropy(logits, y)
        return balanced_softmax_loss(logits, y, self.log_prior)


@METHODS.register("fednpr")
class FedNPR(NPRMixin, BalancedSoftmax):
    """FedNPR: BSM + NPR locally, every tensor averaged."""

    protocol: ClassVar[str] = "per_client"


@METHODS.register("fednpr-code")
class FedNPRPublicCode(FedNPR):
    """FedNPR as the authors' released code trains it: ``npr_variant`` defaults to ``public_code``
    (NPR weight 1, random sub-cluster assignment). Its own name keeps its run records (named after
    the method) apart from FedNPR's in one table."""

    def __init__(self, *args, npr_variant: str = "public_code", **kwargs) -> None:
        super().__init__(*args, npr_variant=npr_variant, **kwargs)
