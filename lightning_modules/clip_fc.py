"""CLIP-FC: a supervised linear probe on frozen CLIP features, trained with FedAvg.

logits = W normalize(I) + b, cross-entropy with the true labels. This is the "FedAvg" row of
FST-CBDG's tables (a linear classifier on the fixed CLIP image encoder, labeled clients): FST-CBDG's
Figure 3 starts every method at the zero-shot accuracy, so W is initialised from the normalised
class text features ("a photo of a {class}.") and b = 0 by default (``init='text'``);
``init='random'`` uses nn.Linear's default initialisation. Only (W, b) is trained and averaged.
``clip-fc-central`` (clip_fc_central.py) trains the same probe on the pooled data.
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.errors import FedbenchError
from lightning_modules.base import METHODS
from lightning_modules.clip_feature_base import ClipFeatureModule
from lightning_modules.components.clip_heads import zero_shot_head


@METHODS.register("clip-fc")
class ClipLinearProbe(ClipFeatureModule):
    def __init__(self, *args, init: Literal["text", "random"] = "text", **kwargs) -> None:
        if init not in ("text", "random"):
            raise FedbenchError(f"{type(self).__name__}: init must be 'text' or 'random', got {init!r}.")
        self.init = init
        super().__init__(*args, **kwargs)

    def build_head(self) -> nn.Module:
        if self.init == "text":
            return zero_shot_head(self.class_text_features())
        return nn.Linear(self.feature_dim, self.num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1)
