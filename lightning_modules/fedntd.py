"""FedNTD (Lee et al., "Preservation of the Global Knowledge by Not-True Distillation in Federated
Learning", NeurIPS 2022, Eq. 4-5).

Local objective: CE(z, y) + beta * L_NTD, with
    L_NTD = KL( softmax(z~_g / tau) || softmax(z~ / tau) )      (mean over the batch)
where z~ and z~_g are the local and the received global model's logits with the true class's
entry removed: the global model's knowledge is kept only on the not-true classes, and the true
class is learned from the labels alone.
beta = 1, tau = 1: the authors' config (config/fedntd.json); no seed paper states other values.
There is no tau^2 factor (the paper's Eq. 4); the public code (algorithms/fedntd/criterion.py NTD_Loss)
multiplies the KL by tau^2, which is the same at tau = 1 (tests/golden/fedntd.json). The teacher is
the received global model in eval mode (the code deep-copies the model after its evaluation pass). Here the teacher runs
the live modules on the received state tensors (``FrozenModel``): nothing is copied.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from bench.core.errors import FedbenchError
from lightning_modules.base import METHODS, ClientContext, FederatedModule, Objective, ObjectiveTerm, TermLoss
from lightning_modules.components.state import FrozenModel


def not_true_logits(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[B, C-1]: each row without its true class's entry (order of the others kept)."""
    keep = torch.ones_like(logits, dtype=torch.bool).scatter_(1, y.unsqueeze(1), False)
    return logits[keep].view(len(logits), -1)


def ntd_loss(logits: torch.Tensor, teacher_logits: torch.Tensor, y: torch.Tensor, tau: float) -> torch.Tensor:
    """KL(teacher || student) over the not-true classes at temperature tau, mean over the batch."""
    student = F.log_softmax(not_true_logits(logits, y) / tau, dim=1)
    teacher = F.softmax(not_true_logits(teacher_logits.detach(), y) / tau, dim=1)
    return F.kl_div(student, teacher, reduction="batchmean")


def check_tau(tau: float) -> None:
    if tau <= 0:
        raise FedbenchError(f"FedNTD's tau must be > 0, got {tau}.")


def check_classes(num_classes: int) -> None:
    if num_classes < 2:
        raise FedbenchError("FedNTD needs at least two classes.")


@dataclass(frozen=True)
class NotTrueDistillation(ObjectiveTerm):
    """FedNTD's local loss CE(z, y) + beta * L_NTD(z, z_g), z the head's logits on the features and z_g the
    received global head's on the same features (with beta 0 it is off: the host's CE): FedNTD's term on a model that trains its head alone on fixed features (``clip-fc-fedntd``:
    the CLIP linear probe), where the received global model is its head. Options beta, tau. (A model
    with a trained backbone needs the teacher's own features: the ``fedntd`` method.)"""

    name: ClassVar[str] = "ntd"
    supervised: ClassVar[bool] = True  # CE and L_NTD on the same logits (one head pass, as FedNTD's loss)
    beta: float = 1.0
    tau: float = 1.0

    def __post_init__(self) -> None:
        check_tau(self.tau)

    def for_client(self, module: FederatedModule, ctx: ClientContext) -> TermLoss | None:
        check_classes(module.num_classes)
        if self.beta == 0:
            return None
        teacher = FrozenModel(module, ctx.global_state)  # the received global head, eval mode

        def loss(batch, f):
            logits = module.head(f)
            return F.cross_entropy(logits, batch[1]) + self.beta * ntd_loss(logits, teacher.run("head", f), batch[1],
                                                                            self.tau)

        return loss


@METHODS.register("fedntd")
class FedNTD(FederatedModule):
    def __init__(self, *args, beta: float = 1.0, tau: float = 1.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        check_tau(tau)
        check_classes(self.num_classes)
        self.beta, self.tau = beta, tau

    def client_objective(self, ctx: ClientContext) -> Objective:
        if self.beta == 0:
            return self.training_step
        teacher = FrozenModel(self, ctx.global_state)  # the received global model, eval mode

        def loss(batch):
            x, y = batch
            logits = self(x)
            return F.cross_entropy(logits, y) + self.beta * ntd_loss(logits, teacher.logits(x), y, self.tau)

        return loss
