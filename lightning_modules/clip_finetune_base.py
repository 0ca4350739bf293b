"""Base of FACMIC's fine-tuning baselines: the WHOLE CLIP trained with its batch contrastive loss.

FACMIC (Sec. 3.3): "FedAVG fine-tunes and aggregates all the parameters of the CLIP image and text
encoders"; MOON, FedProx and FedFocal extend that FedAvg. Its public code (AIPMLab/FACMIC,
utils/training.py; README: ``freeze_param`` set to True for FedAVG/MOON/FedProx) optimises every
parameter of the CLIP model: the image tower, the text tower and the logit scale, and averages the
whole state dict. Paper and code agree on the towers; the logit scale is the code's. So here every
parameter of the CLIP trains and is aggregated: the state dict is the CLIP model itself
(``backbone.model.*``), nothing is frozen, no feature cache is possible (the image tower changes
every step). The trainable CLIP starts from the same weights as the frozen one of the cached methods.

Per batch of (image, class): image embedding I = image tower(x) and the text embedding of each
sample's class prompt ("a picture of a {class}", FACMIC's prompt) T_y = text tower(prompt_y); the loss
is CLIP's symmetric contrastive loss over the batch with scale exp(logit_scale) (FACMIC Eq. 4, the
code's loss for every baseline). The K class prompts are encoded once per batch and indexed by the
labels, which gives the loss and gradients of encoding every sample's prompt (CLIP has no dropout).
Prediction: argmax over classes of exp(logit_scale) * cos(I, T_k), as the code tests.

Images are brought to CLIP's geometry once in ``prepare_splits`` (``clip_resize_uint8``: 3 channels,
short side resized, centre crop; uint8 kept on the device) and normalised per batch with CLIP's mean
and std, so a batch is exactly CLIP's preprocessing of the image. No augmentation (FACMIC uses none).

Options (``method.args``): clip (default ``tiny-random``), prompt, clip_cache_dir, adam_eps (1e-6, CLIP
fine-tuning's). Optimiser (FACMIC): Adam, betas (0.9, 0.98) (the defaults here), lr 5e-5, weight decay
0.02 from the run config. The code's fp16 weights between steps are not reproduced (fp32 throughout).
"""
from __future__ import annotations

import copy
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.batches import DeviceData
from bench.core.errors import FedbenchError
from lightning_modules.base import ClientContext, FeatureLoss, FederatedModule
from lightning_modules.clip_feature_base import shared_clip
from lightning_modules.components import prompts as prompt_sets
from lightning_modules.components.clip_losses import clip_contrastive_loss
from lightning_modules.components.clip_models import (
    OFFLINE_CLIP,
    FrozenClip,
    clip_resize_uint8,
    describe_weights,
)


class ClipTowers(nn.Module):
    """A trainable CLIP: ``forward(x)`` is the image tower (so a stored state can be run on images
    through ``FrozenModel``), ``encode_text`` the text tower; ``logit_scale`` is the log-scale parameter."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(images)

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.encode_text(tokens)

    @property
    def logit_scale(self) -> torch.Tensor:
        return self.model.logit_scale


class ClipFinetuneModule(FederatedModule):
    default_prompt: ClassVar[str] = "a picture of a {}"

    def __init__(self, *args, clip: str = OFFLINE_CLIP, prompt: str | None = None, clip_cache_dir: str | None = None,
                 adam_eps: float = 1e-6, betas: tuple[float, float] = (0.9, 0.98), **kwargs) -> None:
        # Set before FederatedModule.__init__, which calls build_backbone.
        self.clip_name = clip
        self.prompt = prompt or self.default_prompt
        if "{}" not in self.prompt:
            raise FedbenchError(f"method.args.prompt must contain '{{}}' for the class name, got {self.prompt!r}.")
        self.adam_eps = adam_eps
        self.reference: FrozenClip = shared_clip(clip, clip_cache_dir)  # tokenizer, image size, mean/std
        super().__init__(*args, betas=betas, **kwargs)
        names = self.class_names or [str(k) for k in range(self.num_classes)]
        concepts = prompt_sets.class_prompts(self.hparams.get("dataset_name"), list(names)).concepts
        prompts = [self.prompt.format(c) for c in concepts]
        self.register_buffer("prompt_tokens", self.reference.tokenizer(prompts).long(), persistent=False)

    # ---- model -----------------------------------------------------------------------------
    def build_backbone(self, name: str, in_channels: int, pretrained: bool) -> tuple[nn.Module, int]:
        """The CLIP itself, every parameter trainable (a copy: the shared frozen CLIP stays frozen)."""
        model = copy.deepcopy(self.reference.model).float()
        model.requires_grad_(True)
        return ClipTowers(model), self.reference.embed_dim

    def build_head(self) -> nn.Module:
        return nn.Identity()  # prediction compares image and text embeddings: no classifier

    def describe_backbone(self) -> str:
        return (f"CLIP {self.clip_name!r} fine-tuned in full: image and text towers and logit scale "
                f"({describe_weights(self.clip_name)})")

    def class_text_features(self) -> torch.Tensor:
        """Text embeddings [K, D] of the class prompts under the current text tower (with grad in training)."""
        return self.backbone.encode_text(self.prompt_tokens)

    def scale(self) -> torch.Tensor:
        return self.backbone.logit_scale.exp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """exp(logit_scale) * cos(image embedding, class text embedding) [B, K]."""
        image = F.normalize(self.features(x), dim=-1)
        return self.scale() * image @ F.normalize(self.class_text_features(), dim=-1).T

    def contrastive(self, image: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """CLIP's symmetric batch contrastive loss of image embeddings against their class prompts."""
        return clip_contrastive_loss(image, self.class_text_features()[labels], self.scale())

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return self.contrastive(self.features(x), y)

    def feature_loss(self, ctx: ClientContext) -> FeatureLoss:
        """CLIP's contrastive loss on the image embeddings, to which objective terms add (FedProx, MOON)."""
        return self.contrastive

    # ---- data: CLIP's geometry, once ----------------------------------------------------------
    def to_clip_input(self, split: DeviceData | None) -> DeviceData | None:
        """uint8 images at CLIP's size (3 channels) normalised by CLIP's mean and std per batch."""
        if split is None:
            return None
        ref = self.reference
        dtype, device = split.mean.dtype, split.images.device
        mean = torch.tensor(ref.mean, dtype=dtype, device=device).view(1, 3, 1, 1)
        std = torch.tensor(ref.std, dtype=dtype, device=device).view(1, 3, 1, 1)
        images = torch.cat([clip_resize_uint8(chunk, ref.image_size) for chunk in split.images.split(1024)])
        return DeviceData(images, split.labels, mean, std)

    def prepare_splits(self, train: DeviceData, val: DeviceData | None, test: DeviceData):
        return self.to_clip_input(train), self.to_clip_input(val), self.to_clip_input(test)
