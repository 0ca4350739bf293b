"""FederatedModule: a LightningModule whose training_step is a method's local objective,
plus the small declarative hooks the Fabric orchestrator (bench/federation.py) calls.

Round life cycle of one sampled client (see bench/federation.py):
    load global shared state (+ the client's personal tensors)
    -> on_client_start(ctx) -> local epochs of training_step / backward / step
    -> on_client_end(ctx) returns extra uploads -> weighted shared state goes into the sum.
After the all-reduce: server_step(global_state, extras, round).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from bench.core.batches import DeviceData
from bench.core.errors import FedbenchError
from bench.core.registry import Registry
from lightning_modules.backbones import build_backbone

METHODS: Registry[type[FederatedModule]] = Registry("method", "lightning_modules")


def matches_prefix(key: str, prefixes: tuple[str, ...]) -> bool:
    """True if a state_dict key lies under one of the prefixes ('' matches everything)."""
    return any(p == "" or key == p or key.startswith(p + ".") for p in prefixes)


@dataclass
class ClientContext:
    """What a method sees of the client it is training now."""

    client_id: int
    round_idx: int
    seed: int
    data: DeviceData  # the whole training set, on the device
    indices: torch.Tensor  # this client's training samples (indices into data)
    num_classes: int
    global_state: dict[str, torch.Tensor]  # the shared state received this round (read only)
    state: dict[str, Any] = field(default_factory=dict)  # persistent per-client state, kept on its rank
    generator: torch.Generator | None = None  # for the method's own draws: derived from (seed, round, client)
    num_clients: int = 1  # clients in the federation (Scaffold/FedDyn scale by participation)
    lr: float = 0.0  # this round's learning rate (after the schedule)
    batch_size: int = 32
    local_epochs: int = 1
    augment: str = "none"
    sampled: list[int] = field(default_factory=list)  # the clients sampled this round (all ranks)

    @property
    def labels(self) -> torch.Tensor:
        return self.data.labels[self.indices]

    def class_counts(self) -> torch.Tensor:
        return torch.bincount(self.labels, minlength=self.num_classes)


class FederatedModule(L.LightningModule):
    """Base of every method: backbone -> pooled features -> linear head, trained with CE.

    Class attributes declare the federated shape:
      personal_prefixes  state kept per client, never aggregated (FedRep's head, Local's everything)
      frozen_prefixes    state identical everywhere and never trained or aggregated (LKCC's classifier)
      protocol           default evaluation: 'global' (global model on the global test set),
                         'per_client' (each client's model on its own split) or 'local_mean' (each
                         client's model on the global test set); a run's ``fed.protocol`` overrides it
    """

    personal_prefixes: ClassVar[tuple[str, ...]] = ()
    frozen_prefixes: ClassVar[tuple[str, ...]] = ()
    protocol: ClassVar[str] = "global"
    runs_centrally: ClassVar[bool] = False

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
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["class_names"])
        self.num_classes = num_classes
        self.class_names = class_names
        self.backbone, self.feature_dim = self.build_backbone(backbone, in_channels, pretrained)
        self.head = self.build_head()
        self.client: ClientContext | None = None  # set by the orchestrator while a client trains
        self.server_comm = None  # set by the orchestrator: bench.federation.ServerComm (is_server, broadcast)

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

    # ---- local objective -----------------------------------------------------------------
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        hp = self.hparams
        params = [p for p in self.parameters() if p.requires_grad]
        if hp.optimizer == "sgd":
            return torch.optim.SGD(params, lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay)
        if hp.optimizer == "adam":
            return torch.optim.Adam(params, lr=hp.lr, betas=tuple(hp.betas), weight_decay=hp.weight_decay)
        if hp.optimizer == "adamw":
            return torch.optim.AdamW(params, lr=hp.lr, betas=tuple(hp.betas), weight_decay=hp.weight_decay)
        raise FedbenchError(f"Unknown optimizer {hp.optimizer!r}; choose sgd, adam or adamw.")

    # ---- federated hooks (defaults: FedAvg) ----------------------------------------------
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

    def on_client_start(self, ctx: ClientContext) -> None:
        """Runs after the global state is loaded and before local training."""

    def on_client_end(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        """Runs after local training; returns extra tensors to upload (summed over clients)."""
        return {}

    def evaluate_client(self, ctx: ClientContext, evaluate) -> dict[str, float]:
        """Per-client protocol: return ``evaluate()`` for this client's model. Override to
        personalise first (e.g. fine-tune a head) and restore afterwards: the state uploaded is
        the one left after this hook."""
        return evaluate()

    def upload_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes of the extra uploads, known on every rank (they share the one all-reduce)."""
        return {}

    def server_step(self, global_state: dict[str, torch.Tensor], extras: dict[str, torch.Tensor], round_idx: int) -> None:
        """Runs on every rank after aggregation, with identical inputs; may edit global_state in place.
        Work that should run once (FedBM's generator training) runs where ``self.server_comm.is_server``
        and reaches the other ranks through ``self.server_comm.broadcast``."""

    def server_state(self) -> dict[str, torch.Tensor]:
        """Server-side state beyond the global model (checkpointed)."""
        return {}

    def load_server_state(self, state: dict[str, torch.Tensor]) -> None:
        pass
