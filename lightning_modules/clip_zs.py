"""CLIP-ZS: zero-shot CLIP, the untrained baseline of FACMIC's and FST-CBDG's tables.

Prediction: logit_scale * cos(I, T_k) with the class-prompt text features T ("a photo of a {class}.",
CLIP's standard prompt; ``method.args.prompt`` changes it), written as a frozen linear head
W = logit_scale * normalize(T), b = 0 on normalize(I). The head is in the state_dict but frozen
(``frozen_prefixes``): never trained, aggregated or communicated (0 bytes per round). Local
training is skipped outright (``local_update`` trains nothing, so no batch is ever built).
Global protocol: every round evaluates the same zero-shot model.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lightning_modules.base import METHODS, ClientBatches, ClientContext
from lightning_modules.clip_feature_base import ClipFeatureModule
from lightning_modules.components.clip_heads import zero_shot_head


@METHODS.register("clip-zs")
class ClipZeroShot(ClipFeatureModule):
    protocol = "global"
    frozen_prefixes = ("head",)
    trains = False  # nothing is ever trained: never "collapsed" (bench/engine/health.py), every round the same

    def build_head(self) -> nn.Module:
        head = zero_shot_head(self.class_text_features(), scale=self.frozen_clip.logit_scale)
        head.requires_grad_(False)
        return head

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1)

    def local_update(self, ctx: ClientContext, batches: ClientBatches) -> int:
        return 0  # nothing to train (and nothing shared: the head is frozen)
