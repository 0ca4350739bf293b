"""Base of the CLIP methods on a frozen-feature cache (FACMIC, FedCLIP, CLIP-ZS, CLIP-FC, FST-CBDG).

The frozen CLIP runs once, in ``prepare_splits``: every split's uint8 images become cached float
image features [N, D] (``lightning_modules/components/feature_cache.py``, keyed by CLIP, preprocessing
and image bytes), so rounds, batching and evaluation only slice features. The class-prompt text
features are encoded once at construction (also cached on disk) and kept as a non-persistent buffer.

What is in the ``state_dict`` (and therefore aggregated, checkpointed and counted in
``bytes_per_client_round``) is only the method's head: the frozen CLIP is a :class:`FrozenClip`,
deliberately not an ``nn.Module``; the backbone is an ``nn.Identity`` whose width is CLIP's
``embed_dim``; text features are a non-persistent buffer.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.batches import DeviceData
from bench.core.errors import FedbenchError
from bench.core.paths import DEFAULT_CACHE_DIR
from bench.core.ranks import current_ranks
from lightning_modules.base import FederatedModule
from lightning_modules.components import prompts as prompt_sets
from lightning_modules.components.clip_models import OFFLINE_CLIP, FrozenClip, describe_weights, load_clip
from lightning_modules.components.feature_cache import cached_image_features, cached_text_features

DEFAULT_FEATURE_CACHE = str(Path(DEFAULT_CACHE_DIR) / "features")

_LOADED: dict[tuple[str, str | None], FrozenClip] = {}


def shared_clip(name: str, cache_dir: str | None = None) -> FrozenClip:
    """The named frozen CLIP, built once per process (table runs reuse it; weights never change)."""
    key = (name, cache_dir)
    if key not in _LOADED:
        _LOADED[key] = load_clip(name, cache_dir=cache_dir)
    return _LOADED[key]


class ClipFeatureModule(FederatedModule):
    """A FederatedModule whose inputs are cached frozen-CLIP image features.

    Options shared by every CLIP method (``method.args``):
      clip               CLIP name for ``load_clip`` (default ``tiny-random``: offline random weights)
      prompt             class-prompt template, ``{}`` is the class concept (default: the method's own)
      prompts            a prompts file (components/prompts.py): concepts per class name and/or templates;
                         without ``prompt``, its first template is used. Without a file, the concepts are
                         the dataset's prompt-set concepts (e.g. OCT's 'AMD' -> 'Age-related macular
                         degeneration'), else its class names (with a notice)
      feature_cache_dir  where image/text features are cached (default ~/.cache/fedbench/features)
      clip_cache_dir     where open_clip keeps downloaded weights (default: the HF hub cache)
      adam_eps           Adam's eps when method.optimizer is adam/adamw (CLIP fine-tuning uses 1e-6)
    """

    default_prompt: ClassVar[str] = "a photo of a {}."

    def __init__(
        self,
        *args,
        clip: str = OFFLINE_CLIP,
        prompt: str | None = None,
        feature_cache_dir: str | None = None,
        clip_cache_dir: str | None = None,
        adam_eps: float = 1e-6,
        prompts: str | None = None,
        **kwargs,
    ) -> None:
        # Set before FederatedModule.__init__, which calls build_backbone/build_head.
        self.clip_name = clip
        self.prompt_given, self.prompts_file = prompt, prompts
        self.prompt = prompt or self.default_prompt
        if "{}" not in self.prompt:
            raise FedbenchError(f"method.args.prompt must contain '{{}}' for the class name, got {self.prompt!r}.")
        self.prompt_info: dict | None = None  # the concepts and template used (kept in the run record)
        self.feature_cache_dir = feature_cache_dir or DEFAULT_FEATURE_CACHE
        self.adam_eps = adam_eps
        self.frozen_clip: FrozenClip = shared_clip(clip, clip_cache_dir)
        self._text_init: torch.Tensor | None = None
        super().__init__(*args, **kwargs)
        self.register_buffer("text_features", self.class_text_features(), persistent=False)

    # ---- frozen parts ----------------------------------------------------------------------
    def class_prompts(self) -> list[str]:
        """One prompt per class: the template (``prompt``, else the prompts file's first, else the
        method's default) filled with the class concept (components/prompts.py: class_prompts)."""
        names = self.class_names or [str(k) for k in range(self.num_classes)]
        dataset = self.hparams.get("dataset_name")
        cp = prompt_sets.class_prompts(dataset, list(names), self.prompts_file)
        prompt_sets.announce_defaults(cp, dataset, self.method_name(), uses_templates=False)
        if self.prompt_given is None and cp.file is not None and cp.file.templates:
            self.prompt = cp.file.templates[0]
        self.prompt_info = {**cp.to_json(), "templates": [self.prompt],
                            "templates_from": "method.args.prompt" if self.prompt_given else
                            cp.templates_from if cp.file is not None and cp.file.templates else "the method's default"}
        return [self.prompt.format(c) for c in cp.concepts]

    def class_text_features(self) -> torch.Tensor:
        """Raw (un-normalised) text features [K, D] of the class prompts, encoded once and cached."""
        if self._text_init is None:
            with current_ranks().rank_zero_first("rank 0 filling the CLIP text feature cache"):
                feats = cached_text_features(self.frozen_clip, self.clip_name, self.class_prompts(),
                                             self.feature_cache_dir)
            self._text_init = feats.float().cpu()
        return self._text_init

    def build_backbone(self, name: str, in_channels: int, pretrained: bool) -> tuple[nn.Module, int]:
        """No trainable encoder: batches already hold CLIP features; width = CLIP's embed_dim."""
        return nn.Identity(), self.frozen_clip.embed_dim

    def describe_backbone(self) -> str:
        return f"frozen CLIP {self.clip_name!r} ({describe_weights(self.clip_name)}; cached features, {self.feature_dim}-d)"

    def normalized_text(self) -> torch.Tensor:
        return F.normalize(self.text_features, dim=-1)

    # ---- the one encoder pass ----------------------------------------------------------------
    def encode_split(self, split: DeviceData | None) -> DeviceData | None:
        """uint8 images -> cached CLIP image features on the split's device (labels kept)."""
        if split is None or split.images.dtype != torch.uint8:
            return split
        device = split.images.device
        clip = self.frozen_clip.to(device)
        progress = current_ranks().is_main and len(split.images) > 20000
        feats = cached_image_features(clip, self.clip_name, split.images, self.feature_cache_dir, progress=progress,
                                      origin=split.origin)
        # in the run's precision (the normalisation's dtype: float32, or float64 under 64-true)
        return DeviceData(feats.to(device, split.mean.dtype), split.labels, split.mean, split.std)

    def prepare_splits(self, train: DeviceData, val: DeviceData | None, test: DeviceData):
        # rank 0 fills the feature cache first; the other ranks then read it (one encode per machine)
        with current_ranks().rank_zero_first("rank 0 filling the CLIP image feature cache"):
            return self.encode_split(train), self.encode_split(val), self.encode_split(test)

