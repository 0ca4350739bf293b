"""FederatedModule: one method of the benchmark, as a LightningModule plus the per-client contract
that the Fabric orchestrator (bench/engine/federation.py) drives.

A round, for each sampled client (on the rank that owns it):

    load the global shared state (+ the client's personal tensors); module.train()
    ctx     = ClientContext(...)              everything about this client and round (below)
    batches = client_batches(ctx)             how its batches are drawn (default: EpochBatches)
    samples = local_update(ctx, batches)      its local training (default: ``train_epochs``:
                                              one optimizer, ctx.local_epochs passes over
                                              ``batches`` minimising client_objective(ctx))
    on_client_end(ctx)                        after training: put extra uploads in ctx.uploads
    evaluate_client(ctx, evaluate)            per-client protocols only: score this client's model
    -> the shared state (weighted) and ctx.uploads go into the round's one buffer

then, on every rank after the all-reduce, the method's server part (``module.server_side``, a ServerPart:
lightning_modules/server_part.py): server_side.step(global_state, summed uploads, round, server).

Where a method says what it does:
  training_step(batch)        the loss of a batch when it needs nothing of the client (FedAvg: CE)
  client_objective(ctx)       the client's loss on a batch when it does (a client prior, the received
                              model as a teacher, prototypes): called once per local update, it returns
                              a function batch -> loss; per-client scratch lives in that closure, never
                              on the module. Default: ``training_step``.
  client_batches(ctx)         declares the client's batches (BalanceFL's class-balanced draws,
                              FST-CBDG's index batches with their synthetic share)
  local_update(ctx, batches)  replaces the default loop where local training is not one loop
                              (FedRep: head epochs, then body epochs; Scaffold and FedDyn: a
                              gradient correction after every backward pass via ``train_epochs``)
  on_client_end(ctx)          after local training, with the trained model loaded
  evaluate_client(ctx, eval)  per-client protocol: personalise, evaluate, restore (FedBABU)
  global_logits(x)            the global protocol's scores (default eval_logits; FedRoD: its generic head)
  prepare_splits(train, val, test)       once before the first round (frozen-encoder caches)
  feature_loss(ctx)           the loss on pooled features that objective terms add to (default: CE of the head)
Parts, not base classes: the server side is a ServerPart the module holds (``server_side``: its upload
shapes, server step, per-round scalars and checkpointed state); ``objective_terms`` (ObjectiveTerm: NPR,
FedProx's proximal term, MOON's model-contrastive term, FedNTD's distillation) each bring options and a loss
added by ``feature_objective``;
``compose`` registers a host class (an algorithm on a model: FedBABU, the CLIP fine-tune, the CLIP linear
probe) with terms as a new method without writing a class.
Declared by class attributes: personal_prefixes, frozen_prefixes, protocol, runs_centrally,
keeps_client_state (the method writes ``ctx.state``: its clients train on the rank that keeps it; a
method that does not may have its clients trained on any rank, and ``ctx.state`` refuses writes).

The local loop calls no Lightning hook (no on_after_backward, on_train_batch_end, ...): a step is
zero_grad -> loss = objective(batch) under ctx.autocast() -> backward -> [after_backward] -> step
(with float16 autocast, the loss is scaled and the gradients unscaled before after_backward: run_epochs).

What Fabric does here, and what it deliberately does not: the orchestrator uses Fabric for the ranks
(launch, the process group, all_reduce/broadcast/barrier), devices (``fabric.to_device``, ``fabric.device``)
and precision (``fabric.autocast`` is ctx.autocast). It never calls ``fabric.setup(module)``: that wraps
the module in DistributedDataParallel, which all-reduces gradients after every backward pass, i.e.
averages the steps of *different clients* trained at the same time on different ranks. In federated
learning each rank trains its own clients independently and models meet only at the round's one
all-reduce of the weighted states (bench/engine/aggregation.py). For the same reason the loss is scaled by a
GradScaler of its own per local update, not Fabric's shared one: a shared scaler's state would carry
over from one client to the next and depend on which rank trained which client.
"""
from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from bench.core.batches import DeviceData, EpochBatches
from bench.core.errors import FedbenchError
from bench.core.registry import Registry
from lightning_modules.backbones import GRAY_STEMS, build_backbone, fresh_gray_stem
from lightning_modules.server_part import ServerContext, ServerPart  # noqa: F401 (ServerContext: methods, engine)

METHODS: Registry[type[FederatedModule]] = Registry("method", "lightning_modules")

Batch = tuple[torch.Tensor, ...]  # (inputs, one entry per sample, ...): (x, y) unless a method declares otherwise
Objective = Callable[[Batch], torch.Tensor]  # the loss of one batch
FeatureLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (pooled features, labels) -> loss
TermLoss = Callable[[Batch, torch.Tensor], torch.Tensor]  # (batch, its pooled features) -> an objective term


class NonFiniteLossError(FedbenchError):
    pass


class UndeclaredClientStateError(FedbenchError):
    pass


class NoClientState(dict):
    """``ctx.state`` of a method that declares no per-client state (``keeps_client_state = False``):
    always empty, and writing to it is refused, because its clients may train on any rank
    (bench/engine/placement.py), where the state would not be kept."""

    def __init__(self, method: str) -> None:
        super().__init__()
        self.method = method

    def refuse(self, key: Any) -> None:
        raise UndeclaredClientStateError(
            f"{self.method} stores per-client state (ctx.state[{key!r}]) but does not declare it: set "
            "`keeps_client_state: ClassVar[bool] = True` on its class, so that each client trains on the rank "
            "that keeps its state.")

    def __setitem__(self, key: Any, value: Any) -> None:
        self.refuse(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self.refuse(key)

    def update(self, *args: Any, **kwargs: Any) -> None:
        items = dict(*args, **kwargs)
        if items:
            self.refuse(next(iter(items)))


class ClientBatches(Protocol):
    """What ``client_batches`` returns: one epoch of batches per iteration (``set_epoch`` first)."""

    def set_epoch(self, epoch: int) -> None: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Batch]: ...


def matches_prefix(key: str, prefixes: tuple[str, ...]) -> bool:
    """True if a state_dict key lies under one of the prefixes ('' matches everything)."""
    return any(p == "" or key == p or key.startswith(p + ".") for p in prefixes)


@dataclass
class ClientContext:
    """What a method sees of the client it is training now (built by the orchestrator per client
    and round; lives exactly as long as the client's local update)."""

    client_id: int
    round_idx: int
    seed: int
    data: DeviceData  # the whole training set, on the device
    indices: torch.Tensor  # this client's training samples (indices into data)
    num_classes: int
    global_state: dict[str, torch.Tensor]  # the shared state received this round (read only)
    generator: torch.Generator  # for the method's own draws: derived from (seed, round, client)
    state: dict[str, Any] = field(default_factory=dict)  # persistent per-client state, kept on its rank
    lr: float = 0.01  # this round's learning rate (after the schedule)
    batch_size: int = 32
    local_epochs: int = 1
    augment: str = "none"  # the run's data augmentation (default batches only)
    keep_optimizer_state: bool = False  # carry the local optimizer's state over to the next round
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext  # Fabric's precision
    loss_scaling: bool = False  # float16 autocast: scale the loss (run_epochs, needs_loss_scaling)
    losses: list = field(default_factory=list)  # (loss x batch size, batch size) per local step, for logging
    term_losses: dict = field(default_factory=dict)  # term name -> its (loss x batch size, batch size) per step
    uploads: dict[str, torch.Tensor] = field(default_factory=dict)  # extra tensors sent this round (summed)

    @property
    def labels(self) -> torch.Tensor:
        return self.data.labels[self.indices]

    def class_counts(self) -> torch.Tensor:
        return torch.bincount(self.labels, minlength=self.num_classes)


def run_epochs(batches: ClientBatches, epochs: int, objective: Objective, optimizer: torch.optim.Optimizer,
               autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
               after_backward: Callable[[], None] | None = None, where: str = "",
               loss_scaling: bool = False, losses: list | None = None) -> int:
    """The local loop: ``epochs`` passes over ``batches``, one optimizer step per batch.

    Returns the number of samples trained (``len(batch[1])`` summed). Non-finite losses are detected
    once at the end (one device sync, not one per step) and raise NonFiniteLossError.

    ``loss_scaling`` (float16 autocast, see ``needs_loss_scaling``): the loss is scaled before backward
    so that small float16 gradients do not flush to zero, the gradients are unscaled before
    ``after_backward`` (which sees and edits true gradients: Scaffold, FedDyn), and a step whose
    gradients overflowed is skipped. The scaler is fresh for every call (every local update starts at
    the same scale), so a client's update does not depend on which rank trained it or what it trained
    before. Without loss scaling the scaler is disabled and the loop is the plain one.

    ``losses`` (a ClientContext's): each step appends (loss x batch size, batch size), detached and on the
    device (no host sync), from which the orchestrator reports the round's training loss.
    """
    step_losses: list[torch.Tensor] = []  # checked for NaN/inf once, at the end (no per-step check ops)
    scaler: torch.amp.GradScaler | None = None
    seen = 0
    for epoch in range(epochs):
        batches.set_epoch(epoch)
        for batch in batches:
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss = objective(batch)
            step_losses.append(loss.detach())
            if losses is not None:
                losses.append((step_losses[-1] * len(batch[1]), len(batch[1])))
            if scaler is None:
                scaler = torch.amp.GradScaler(loss.device.type, enabled=loss_scaling)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            if after_backward is not None:
                after_backward()
            scaler.step(optimizer)  # skipped when the unscaled gradients hold inf/NaN
            scaler.update()
            seen += len(batch[1])
    if step_losses and not bool(torch.isfinite(torch.stack(step_losses)).all()):
        raise NonFiniteLossError(
            f"The loss became NaN/inf {where}. Lower method.lr, check the data normalisation, "
            "or the method's hyperparameters."
        )
    return seen


def needs_loss_scaling(precision: str, device: torch.device) -> bool:
    """Whether local training at ``precision`` on ``device`` needs a loss scaler: float16 autocast
    ("16-mixed") off the CPU. (On the CPU Fabric runs "16-mixed" as bfloat16, whose range needs none.)"""
    return precision == "16-mixed" and torch.device(device).type != "cpu"


class ObjectiveTerm:
    """An extra term of a method's local objective, a part the method holds (``objective_terms``; FedNPR's
    NPR, fednpr.py; FedProx's proximal term, fedprox.py; MOON's model-contrastive term, moon.py). Its
    options are its constructor's keywords and come from ``method.args``; ``name`` keys it in
    ``module.terms``. Once per local update, ``for_client`` returns its loss on (batch, pooled features)
    (or None when it is off), added by ``FederatedModule.feature_objective``; ``on_client_end`` runs
    after local training (MOON keeps the client's model there)."""

    name: ClassVar[str] = "term"
    keeps_client_state: ClassVar[bool] = False  # it writes ctx.state (then so does every method holding it)
    supervised: ClassVar[bool] = False  # its loss holds the head's CE too (FedNTD's, sharing its logits): it
    #                                     then stands in for the host's feature loss while it is on

    def for_client(self, module: FederatedModule, ctx: ClientContext) -> TermLoss | None:
        raise NotImplementedError

    def on_client_end(self, module: FederatedModule, ctx: ClientContext) -> None:
        pass


def option_names(kind: type) -> set[str]:
    """The keyword options of a part's constructor."""
    return {p.name for p in inspect.signature(kind).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def compose(name: str, host: type[FederatedModule], *, terms: tuple[type[ObjectiveTerm], ...] = (),
            defaults: dict[str, Any] | None = None, doc: str | None = None, module: str | None = None,
            **attributes: Any) -> type[FederatedModule]:
    """A registered method made of parts: ``host`` (an algorithm on a model: FedBABU, FedRep, the CLIP
    fine-tune, the CLIP linear probe) with extra objective ``terms`` (NPR, FedProx's, MOON's), new
    ``defaults`` of the terms' options and class attributes (``protocol``); it adds no code, e.g.
    ``METHODS.register("fedrep-npr")(compose("FedRepNPR", FedRep, terms=(NPRegulariser,)))``."""
    body = {"objective_terms": host.objective_terms + tuple(terms),
            "term_defaults": {**host.term_defaults, **(defaults or {})},
            "__doc__": doc or host.__doc__, "__module__": module or host.__module__, **attributes}
    return type(name, (host,), body)


class FederatedModule(L.LightningModule):
    """Base of every method: backbone -> pooled features -> linear head, trained with CE (FedAvg).

    Class attributes declare the federated shape:
      personal_prefixes  state kept per client, never aggregated (FedRep's head, Local's everything)
      frozen_prefixes    state identical everywhere and never trained or aggregated (LKCC's classifier)
      protocol           default evaluation: 'global' (global model on the global test set),
                         'per_client' (each client's model on its own split) or 'local_mean' (each
                         client's model on the global test set); a run's ``fed.protocol`` overrides it
      runs_centrally     trained as one client holding the pooled data (bench/assembly/central.py)
      keeps_client_state writes ``ctx.state`` (control variates, a previous model, prototypes): each
                         client then trains on the rank that keeps its state (rank c % N)
      trains             False: nothing is ever trained (zero-shot CLIP), so a constant prediction is
                         its answer, never a collapse (bench/engine/health.py)
      adam_eps           Adam's eps when method.optimizer is adam/adamw (torch's 1e-8; CLIP's 1e-6)
    Methods that read class prompts set ``prompt_info`` (the concepts and templates used, where they
    came from); the run record keeps it.
    """

    personal_prefixes: ClassVar[tuple[str, ...]] = ()
    frozen_prefixes: ClassVar[tuple[str, ...]] = ()
    protocol: ClassVar[str] = "global"
    runs_centrally: ClassVar[bool] = False
    prompt_info: dict | None = None
    keeps_client_state: ClassVar[bool] = False
    objective_terms: ClassVar[tuple[type[ObjectiveTerm], ...]] = ()
    term_defaults: ClassVar[dict[str, Any]] = {}  # this method's defaults of its terms' options
    trains: ClassVar[bool] = True
    adam_eps: float = 1e-8

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if any(t.keeps_client_state for t in cls.objective_terms):
            cls.keeps_client_state = True

    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        backbone: str = "resnet18",
        pretrained: bool = False,
        optimizer: str = "sgd",
        lr: float = 0.01,
        momentum: float = 0.9,
        weight_decay: float = 5e-4,
        betas: tuple[float, float] = (0.9, 0.999),
        class_names: list[str] | None = None,
        dataset_name: str | None = None,
        gray_stem: str = "sum",
        **term_options: Any,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["class_names"])
        self.terms = self.build_terms(term_options)
        self.num_classes = num_classes
        self.class_names = class_names
        self.backbone, self.feature_dim = self.build_backbone(backbone, in_channels, pretrained)
        if gray_stem == "fresh":  # a new 1-channel stem instead of the summed ImageNet one (method.gray_stem)
            fresh_gray_stem(self.backbone)
        elif gray_stem != "sum":
            raise FedbenchError(f"method.gray_stem must be one of {list(GRAY_STEMS)}, got {gray_stem!r}.")
        self.head = self.build_head()
        self.server_side: ServerPart = ServerPart(self)  # a method with a server step sets its own part

    @classmethod
    def term_option_names(cls) -> set[str]:
        """The ``method.args`` its objective terms take."""
        return set().union(*(option_names(t) for t in cls.objective_terms))

    def build_terms(self, options: dict[str, Any]) -> dict[str, ObjectiveTerm]:
        """Each objective term built from its own options (``name -> term``)."""
        if unknown := sorted(set(options) - self.term_option_names()):
            raise TypeError(f"{type(self).__name__} got unexpected keyword argument(s) {unknown}")
        options = {**self.term_defaults, **options}
        return {t.name: t(**{k: v for k, v in options.items() if k in option_names(t)})
                for t in self.objective_terms}

    def method_name(self) -> str:
        """The registered name (``fedavg``), or the class name of an unregistered method."""
        return vars(type(self)).get("registry_name", type(self).__name__)

    # ---- model ---------------------------------------------------------------------------
    def build_backbone(self, name: str, in_channels: int, pretrained: bool) -> tuple[nn.Module, int]:
        """The feature extractor and its width (frozen-encoder methods override this)."""
        return build_backbone(name, in_channels, pretrained)

    def describe_backbone(self) -> str:
        """How the run record and table header name the feature extractor."""
        hp = self.hparams
        if hp.backbone == "efficientnet_lite0" and hp.pretrained:
            return "efficientnet_lite0 (packaged ImageNet weights; offline stand-in for EfficientNet-B0)"
        return f"{hp.backbone} ({'ImageNet' if hp.pretrained else 'from scratch'})"

    def build_head(self) -> nn.Module:
        return nn.Linear(self.feature_dim, self.num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def eval_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Scores used for evaluation (methods with a training-only logit adjustment override)."""
        return self(x)

    def global_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Scores of the global model under the global protocol (the orchestrator has loaded the
        aggregated state and the initial per-client parts); FedRoD scores its generic head only."""
        return self.eval_logits(x)

    # ---- the local objective and optimizer -----------------------------------------------
    def training_step(self, batch: Batch) -> torch.Tensor:
        """The loss of a batch for methods whose loss needs nothing of the client."""
        x, y = batch
        return F.cross_entropy(self(x), y)

    def feature_loss(self, ctx: ClientContext) -> FeatureLoss:
        """The client's loss on pooled features (default: CE of the head), to which objective terms add."""
        return lambda f, y: F.cross_entropy(self.head(f), y)

    def client_objective(self, ctx: ClientContext) -> Objective:
        """The client's local loss (called once per local update, with the received model loaded):
        ``training_step``, or with objective terms, ``feature_objective(ctx, feature_loss(ctx))``."""
        if not self.objective_terms:
            return self.training_step
        return self.feature_objective(ctx, self.feature_loss(ctx))

    def feature_objective(self, ctx: ClientContext, loss: FeatureLoss) -> Objective:
        """batch -> loss(f, y) + each objective term's loss(batch, f), f = self.features(x) computed once; a
        term is prepared for this client first (NPR: its prototypes from the received model). A
        ``supervised`` term that is on replaces loss(f, y) (its own loss holds the head's CE)."""
        prepared = [(term, term.for_client(self, ctx)) for term in self.terms.values()]
        extra = [(term.name, term_loss) for term, term_loss in prepared if term_loss is not None]
        host = None if any(term.supervised and term_loss is not None for term, term_loss in prepared) else loss

        def objective(batch: Batch) -> torch.Tensor:
            f = self.features(batch[0])
            total = None if host is None else host(f, batch[1])
            for name, term in extra:
                value = term(batch, f)
                # kept per step for the round's curve of this term (detached, on the device: no host sync)
                ctx.term_losses.setdefault(name, []).append((value.detach() * len(batch[1]), len(batch[1])))
                total = value if total is None else total + value
            return total

        return objective

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """The local optimizer over the parameters that require grad (its lr is set per round)."""
        hp = self.hparams
        params = [p for p in self.parameters() if p.requires_grad]
        if hp.optimizer == "sgd":
            return torch.optim.SGD(params, lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay)
        eps = self.adam_eps
        if hp.optimizer == "adam":
            return torch.optim.Adam(params, lr=hp.lr, betas=tuple(hp.betas), eps=eps, weight_decay=hp.weight_decay)
        if hp.optimizer == "adamw":
            return torch.optim.AdamW(params, lr=hp.lr, betas=tuple(hp.betas), eps=eps, weight_decay=hp.weight_decay)
        raise FedbenchError(f"Unknown optimizer {hp.optimizer!r}; choose sgd, adam or adamw.")

    # ---- the client's local update (defaults: FedAvg) ------------------------------------
    def client_batches(self, ctx: ClientContext) -> ClientBatches:
        """The client's batches: its samples reshuffled per (seed, round, client, epoch), augmented
        as configured; a trailing batch of one sample is dropped (BatchNorm)."""
        return EpochBatches(ctx.data, ctx.indices, ctx.batch_size, ctx.seed, ctx.round_idx, ctx.client_id,
                            ctx.augment)

    def local_update(self, ctx: ClientContext, batches: ClientBatches) -> int:
        """The client's local training; returns the number of samples trained."""
        return self.train_epochs(ctx, batches, self.client_objective(ctx))

    def train_epochs(self, ctx: ClientContext, batches: ClientBatches, objective: Objective,
                     after_backward: Callable[[], None] | None = None) -> int:
        """ctx.local_epochs passes over ``batches`` minimising ``objective`` with the local optimizer
        (``configure_optimizers`` at ctx.lr; with ctx.keep_optimizer_state its state is restored from
        and saved to ctx.state). ``after_backward`` may edit the gradients before each step."""
        optimizer = self.configure_optimizers()
        if ctx.keep_optimizer_state and "optimizer" in ctx.state:
            optimizer.load_state_dict(ctx.state["optimizer"])
        for group in optimizer.param_groups:
            group["lr"] = ctx.lr
        seen = run_epochs(batches, ctx.local_epochs, objective, optimizer, ctx.autocast, after_backward,
                          f"in round {ctx.round_idx}, client {ctx.client_id} ({self.method_name()})",
                          loss_scaling=ctx.loss_scaling, losses=ctx.losses)
        if ctx.keep_optimizer_state:
            ctx.state["optimizer"] = optimizer.state_dict()
        return seen

    def on_client_end(self, ctx: ClientContext) -> None:
        """Runs after local training with the trained model loaded; extra uploads go in ctx.uploads.
        Default: each objective term's ``on_client_end``."""
        for term in self.terms.values():
            term.on_client_end(self, ctx)

    def evaluate_client(self, ctx: ClientContext, evaluate: Callable[[], dict[str, float]]) -> dict[str, float]:
        """Per-client protocol: return ``evaluate()`` for this client's model. Override to
        personalise first (e.g. fine-tune a head) and restore afterwards: the state uploaded is
        the one left after this hook."""
        return evaluate()

    def idle_options(self, rounds: int) -> list[str]:
        """Warnings for options of this method that never act in a run of ``rounds`` rounds (an option
        that only acts after some round): the run then equals another method's, which a user comparing
        the two must be told. Stored in the record and shown in tables (bench/engine/health.py)."""
        return []

    # ---- federated shape -----------------------------------------------------------------
    def prepare_splits(self, train: DeviceData, val: DeviceData | None, test: DeviceData):
        """Runs once before the first round, on every rank, with the device-resident splits;
        returns the (train, val, test) the rounds use. Frozen-encoder methods return cached
        features here (DeviceData.images as float [N, D]) so rounds never re-run the encoder."""
        return train, val, test

    def shared_keys(self) -> list[str]:
        """State-dict keys that are aggregated: everything not personal and not frozen."""
        return [
            k for k in self.state_dict()
            if not matches_prefix(k, self.personal_prefixes) and not matches_prefix(k, self.frozen_prefixes)
        ]

    def personal_keys(self) -> list[str]:
        return [k for k in self.state_dict() if matches_prefix(k, self.personal_prefixes)]
