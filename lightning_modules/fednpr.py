"""FedNPR (Wicaksana et al.): balanced softmax + non-parametric regularisation (NPR), FedAvg aggregation.

Each sampled client, from the received model (``client_objective``):
  1. its class log prior log(n_c / n) from its own training labels (for BSM, Eq. 4);
  2. its K prototypes per class (persistent per-client state ``ctx.state["npr_prototypes"]``,
     [C, K, D] unit-norm, random directions from the client's generator the first time): the L2-
     normalised pooled features of all its training images, extracted by the received model in eval
     mode without gradient and without augmentation, are assigned to sub-clusters by the Sinkhorn
     equipartition of Eq. 1, and each prototype becomes the normalised mean of its members (Eq. 2);
     a sub-cluster with no member keeps its prototype;
  3. local loss (Eq. 5):  BSM(head(f), y) + lambda * NPR(f, y)  on the pooled features f of each
     batch (one forward pass), where BSM (Eq. 4) is the cross-entropy of the logits shifted by the
     log prior and NPR (Eq. 3) the cross-entropy over per-sample standardised class scores, a class
     scoring the best cosine among its K prototypes; the prototypes are detached constants, so NPR's
     gradient reaches the backbone only.
Server: every parameter and buffer averaged, weighted by sample counts (Eq. 6); FedNPR-Per keeps the
classifier per client instead (Eq. 7, fednpr_per.py). Evaluation uses the plain logits, per client:
each client's model right after its local training, on its own stratified test split.

Deviations and choices: the prototypes are refreshed at the start of a client's round from the
model it received (the paper updates them "at each training round" from the latest features); the
per-sample standardisation of the scores is a LayerNorm without affine over the classes (the public
code's). ``npr_variant="public_code"`` (methods ``fednpr-code``, ``fednpr-per-code``) reproduces what
the authors' public code effectively does: an NPR weight of 1 (it adds lambda as a constant) and
uniformly random sub-cluster assignments.

Component switches (Table 4; FedNPR-Per inherits them): ``lam: 0`` drops NPR (paper variant: the
prototypes are never computed, the loss is BSM alone); ``balanced_softmax: false`` drops the
balanced softmax, the classifier is trained with plain CE on the client's labels (CE + lambda * NPR);
``num_subclusters: 1`` is single-sub-cluster NPR. Table 4's "global supervision" is BSM: the paper
calls it the common objective across clients (Sec. 3.4.1, 5.1); its rows without it are read as
CE + NPR, not NPR alone (NPR alone never trains the classifier, so its ~57-61% bACC could not come
from the classifier the rows are scored with).

NPR composes with any method whose loss can be written on pooled features: ``NPRegulariser`` is an
objective term (base.py ``ObjectiveTerm``), a part the method holds (``objective_terms``; the instance is
``module.terms["npr"]``) that brings the NPR options and is added to the method's ``feature_loss`` by
``feature_objective`` (FedAvg+NPR in fedavg_npr.py, FedBABU / FedRep / FedRoD + NPR of Table 6 in
fedbabu_npr.py, fedrep_npr.py, fedrod_npr.py: each a ``compose`` entry; README, "Adding a method").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch.nn.functional as F
from torch import Tensor

from bench.core.errors import FedbenchError
from lightning_modules.base import (
    METHODS,
    ClientContext,
    FeatureLoss,
    FederatedModule,
    ObjectiveTerm,
    TermLoss,
)
from lightning_modules.components.balanced_softmax import balanced_softmax_loss, class_log_prior
from lightning_modules.components.client_features import client_features, evaluating
from lightning_modules.components.npr import init_prototypes, npr_loss, npr_weight, update_prototypes

NPR_VARIANTS = ("paper", "public_code")
PROTOTYPES_KEY = "npr_prototypes"  # in ctx.state: [C, K, D] unit-norm, on the client's rank


@dataclass(frozen=True)
class NPRegulariser(ObjectiveTerm):
    """FedNPR's NPR (Sec. 3.3) for any host loss on pooled features; its options (``method.args``) are
    num_subclusters K, lam, sinkhorn_eps, sinkhorn_iters and npr_variant. Its per-client state is the
    client's prototypes (ctx.state)."""

    name: ClassVar[str] = "npr"
    keeps_client_state: ClassVar[bool] = True

    num_subclusters: int = 4
    lam: float = 0.1
    sinkhorn_eps: float = 0.05
    sinkhorn_iters: int = 100
    npr_variant: str = "paper"

    @property
    def variant(self) -> str:
        return self.npr_variant

    def __post_init__(self) -> None:
        for key, kind in (("num_subclusters", int), ("lam", float), ("sinkhorn_eps", float),
                          ("sinkhorn_iters", int)):
            object.__setattr__(self, key, kind(getattr(self, key)))
        if self.variant not in NPR_VARIANTS:
            raise FedbenchError(f"npr_variant must be one of {NPR_VARIANTS}, got {self.variant!r}.")
        if self.num_subclusters < 1:
            raise FedbenchError(f"num_subclusters must be >= 1, got {self.num_subclusters}.")
        if self.lam < 0 or self.sinkhorn_eps <= 0 or self.sinkhorn_iters < 0:
            raise FedbenchError(f"need lam >= 0, sinkhorn_eps > 0 and sinkhorn_iters >= 0; got lam={self.lam}, "
                                f"sinkhorn_eps={self.sinkhorn_eps}, sinkhorn_iters={self.sinkhorn_iters}.")

    @property
    def weight(self) -> float:
        """Weight of NPR in the local loss: ``lam`` (paper) or 1 (public code)."""
        return npr_weight(self.variant, self.lam)

    def client_prototypes(self, module: FederatedModule, ctx: ClientContext) -> Tensor:
        """The client's prototypes refreshed for this round (Eqs. 1-2; stored back into ctx.state)."""
        protos = ctx.state.get(PROTOTYPES_KEY)
        if protos is None:
            protos = init_prototypes(module.num_classes, self.num_subclusters, module.feature_dim,
                                     generator=ctx.generator, device=ctx.data.labels.device,
                                     dtype=ctx.data.mean.dtype)  # the run's precision
        with evaluating(module):
            feats = client_features(ctx, module.features)
        protos = update_prototypes(feats, ctx.labels, protos, self.sinkhorn_eps, self.sinkhorn_iters,
                                   self.variant, ctx.generator)
        ctx.state[PROTOTYPES_KEY] = protos
        return protos

    def for_client(self, module: FederatedModule, ctx: ClientContext) -> TermLoss | None:
        """weight * NPR(f, y) against the client's prototypes refreshed from the received model; None
        (prototypes never computed) when the weight is 0."""
        if self.weight == 0:
            return None
        prototypes = self.client_prototypes(module, ctx)
        return lambda batch, f: self.weight * npr_loss(f, batch[1], prototypes)


@METHODS.register("fednpr")
class FedNPR(FederatedModule):
    """FedNPR: BSM + NPR locally, every tensor averaged. ``balanced_softmax: false`` trains the
    classifier with plain CE instead (Table 4's rows without global supervision)."""

    protocol: ClassVar[str] = "per_client"
    objective_terms = (NPRegulariser,)

    def __init__(self, *args, balanced_softmax: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.balanced_softmax = bool(balanced_softmax)

    def feature_loss(self, ctx: ClientContext) -> FeatureLoss:
        """The classifier's loss on pooled features: BSM with the client's class prior (Eq. 4), or CE."""
        if not self.balanced_softmax:
            return lambda f, y: F.cross_entropy(self.head(f), y)
        log_prior = class_log_prior(ctx.labels, self.num_classes)
        return lambda f, y: balanced_softmax_loss(self.head(f), y, log_prior)


@METHODS.register("fednpr-code")
class FedNPRPublicCode(FedNPR):
    """FedNPR as the authors' released code trains it: ``npr_variant`` defaults to ``public_code``
    (NPR weight 1, random sub-cluster assignment). Its own name keeps its run records (named after
    the method) apart from FedNPR's in one table."""

    def __init__(self, *args, npr_variant: str = "public_code", **kwargs) -> None:
        super().__init__(*args, npr_variant=npr_variant, **kwargs)
