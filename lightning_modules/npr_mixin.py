"""NPR as a plug-in: add FedNPR's non-parametric regulariser to any method's local objective.

``class FedXNPR(NPRMixin, FedX)`` trains ``FedX``'s own loss plus ``weight * NPR`` (Eq. 5 of
FedNPR with FedX's loss in place of BSM). What the mixin adds, per sampled client:

* ``on_client_start``: the client's ``K`` prototypes per class (``ctx.state``, created from
  ``ctx.generator`` the first time) are refreshed from the features of all its training
  images, extracted by the received model in eval mode without gradient, by Sinkhorn
  equipartition sub-clustering (``npr_variant="paper"``) or by the public code's effectively
  random assignment (``"public_code"``).
* ``training_step``: the host method's loss, plus ``npr_weight(variant, lam)`` times the NPR
  loss on the pooled features of the same forward pass (captured in :meth:`features`, so the
  host's forward runs once). Prototypes are detached constants and the NPR loss never sees
  the head: its gradient reaches the backbone only.

Prototypes are a plain attribute while a client trains and live in ``ctx.state`` otherwise:
never in the state dict, so never aggregated nor uploaded. Without a client (central
training) the mixin is inert. It leaves ``protocol`` to the concrete method (FedNPR's methods
evaluate per client). With weight 0 (``lam=0``, paper variant) it is skipped entirely,
so ``fedavg-npr`` with ``lam: 0`` is FedAvg under FedNPR's per-client protocol.

Host requirements: its ``training_step`` computes the batch's features through ``self.features``
(the last such call in the step must be on the batch itself), and ``NPRMixin`` comes first in the
bases so its hooks wrap the host's. FedBABU, FedRep and FedRoD satisfy this as written: their
extra phases (head fine-tuning, head epochs) run outside the NPR-weighted step and get no NPR.
"""
from __future__ import annotations

import torch
from torch import Tensor

from datamodules.errors import FedbenchError
from lightning_modules.base import ClientContext, FederatedModule
from lightning_modules.components.npr import init_prototypes, npr_loss, npr_weight, update_prototypes

NPR_VARIANTS = ("paper", "public_code")
PROTOTYPES_KEY = "npr_prototypes"  # in ctx.state: [C, K, D] unit-norm, on the client's rank
EXTRACT_BATCH = 256


class NPRMixin(FederatedModule):
    """Non-parametric regularisation (FedNPR, Sec. 3.3) on top of the next class in the MRO.

    Options (``method.args``): ``num_subclusters`` K, ``lam`` the NPR weight, ``sinkhorn_eps``
    and ``sinkhorn_iters`` of the equipartition solve, ``npr_variant`` paper | public_code.
    """

    def __init__(self, *args, num_subclusters: int = 4, lam: float = 0.1, sinkhorn_eps: float = 0.05,
                 sinkhorn_iters: int = 100, npr_variant: str = "paper", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if npr_variant not in NPR_VARIANTS:
            raise FedbenchError(f"npr_variant must be one of {NPR_VARIANTS}, got {npr_variant!r}.")
        if num_subclusters < 1:
            raise FedbenchError(f"num_subclusters must be >= 1, got {num_subclusters}.")
        if lam < 0 or sinkhorn_eps <= 0 or sinkhorn_iters < 0:
            raise FedbenchError(f"need lam >= 0, sinkhorn_eps > 0 and sinkhorn_iters >= 0; got lam={lam}, "
                                f"sinkhorn_eps={sinkhorn_eps}, sinkhorn_iters={sinkhorn_iters}.")
        self.num_subclusters = int(num_subclusters)
        self.lam = float(lam)
        self.sinkhorn_eps = float(sinkhorn_eps)
        self.sinkhorn_iters = int(sinkhorn_iters)
        self.npr_variant = npr_variant
        self.prototypes: Tensor | None = None  # the training client's, a plain attribute (not state)
        self._captured: Tensor | None = None  # pooled features of the current training forward

    @property
    def npr_weight(self) -> float:
        """Weight of NPR in the local loss: ``lam`` (paper) or 1 (public code)."""
        return npr_weight(self.npr_variant, self.lam)

    # ---- features of the training forward ------------------------------------------------
    def features(self, x: Tensor) -> Tensor:
        feats = super().features(x)
        if self.training and self.client is not None and torch.is_grad_enabled():
            self._captured = feats
        return feats

    # ---- prototypes ----------------------------------------------------------------------
    @torch.no_grad()
    def extract_features(self, ctx: ClientContext) -> Tensor:
        """Pooled features of all the client's training images (no augmentation), by the model
        as received, in eval mode; the module's train/eval mode is restored afterwards."""
        was_training = self.training
        self.eval()
        try:
            chunks = [self.features(ctx.data.to_float(ctx.indices[i : i + EXTRACT_BATCH])[0]).to(ctx.data.mean.dtype)
                      for i in range(0, len(ctx.indices), EXTRACT_BATCH)]
        finally:
            self.train(was_training)
        return torch.cat(chunks)

    def refresh_prototypes(self, ctx: ClientContext) -> Tensor:
        """The client's prototypes updated for this round (stored back into ``ctx.state``)."""
        protos = ctx.state.get(PROTOTYPES_KEY)
        if protos is None:
            protos = init_prototypes(self.num_classes, self.num_subclusters, self.feature_dim,
                                     generator=ctx.generator, device=ctx.data.labels.device, dtype=ctx.data.mean.dtype)
        feats = self.extract_features(ctx)
        protos = update_prototypes(feats, ctx.labels, protos, self.sinkhorn_eps, self.sinkhorn_iters,
                                   self.npr_variant, ctx.generator)
        ctx.state[PROTOTYPES_KEY] = protos
        return protos

    # ---- federated hooks -----------------------------------------------------------------
    def on_client_start(self, ctx: ClientContext) -> None:
        super().on_client_start(ctx)
        self.prototypes = self.refresh_prototypes(ctx) if self.npr_weight > 0 else None

    def on_client_end(self, ctx: ClientContext) -> dict[str, Tensor]:
        self.prototypes, self._captured = None, None
        return super().on_client_end(ctx)

    def evaluate_client(self, ctx: ClientContext, evaluate) -> dict[str, float]:
        """The host's per-client scores under the ``test/<metric>`` keys the orchestrator
        tabulates (the core's ``evaluate_local`` returns bare metric names, which it would
        record as NaN); keys that already carry a split are left alone."""
        scores = super().evaluate_client(ctx, evaluate)
        return {k if "/" in k else f"test/{k}": v for k, v in scores.items()}

    # ---- local objective -----------------------------------------------------------------
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        self._captured = None
        loss = super().training_step(batch, batch_idx)
        if self.client is None or self.prototypes is None:
            return loss
        feats, y = self._captured, batch[1]
        self._captured = None
        if feats is None or feats.shape[0] != y.shape[0]:
            raise FedbenchError(
                f"{type(self).__name__}: NPR needs the pooled features of the batch from the host method's "
                "training_step (via self.features); none with one row per label were computed.")
        return loss + self.npr_weight * npr_loss(feats, y, self.prototypes)
