"""Frozen CLIP encoders (open_clip) behind one small interface, plus tensor-only preprocessing.

Names accepted by :func:`load_clip`:

- ``vit-b-16``        open_clip ViT-B-16 with OpenAI weights (FACMIC's backbone);
- ``rn50``            open_clip RN50 with OpenAI weights (FST-CBDG's backbone);
- ``biomedclip``      hf-hub:microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224;
- ``tiny-random``     a small CLIP with fixed-seed random weights, built offline (tests, laptops);
- ``vit-b-16-random`` the ViT-B-16 architecture with fixed-seed random weights (timing only).

OpenAI checkpoints were trained with QuickGELU, so both OpenAI names are built with it.
open_clip is imported inside functions: the method registry imports every module at startup.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from bench.core.errors import FedbenchError

OFFLINE_CLIP = "tiny-random"
RANDOM_SEED = 0

# A small ViT CLIP: ~3.5 M parameters, most of them the 49408 x 64 token embedding.
TINY_CLIP_CONFIG: dict[str, Any] = {
    "embed_dim": 64,
    "vision_cfg": {"image_size": 32, "patch_size": 8, "width": 64, "layers": 2, "head_width": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
}
_OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
_OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class _ClipSpec:
    """How to build one named CLIP."""

    model_name: str
    pretrained: str | None = None
    quick_gelu: bool = False
    random: bool = False  # fixed-seed random weights, no download


CLIP_SPECS: dict[str, _ClipSpec] = {
    "vit-b-16": _ClipSpec("ViT-B-16", "openai", quick_gelu=True),
    "rn50": _ClipSpec("RN50", "openai", quick_gelu=True),
    "biomedclip": _ClipSpec("hf-hub:microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224"),
    "vit-b-16-random": _ClipSpec("ViT-B-16", None, quick_gelu=True, random=True),
    OFFLINE_CLIP: _ClipSpec("tiny", None, random=True),
}


@dataclass(eq=False)
class FrozenClip:
    """A CLIP model in eval mode with every parameter frozen; encodes without autograd.

    Deliberately not an ``nn.Module``: assigned to a LightningModule it does not enter the
    module's state_dict, so the frozen encoder is never aggregated, checkpointed or moved by accident.
    ``logit_scale`` is the exponentiated scale (about 100 for the OpenAI weights).
    """

    model: torch.nn.Module
    tokenizer: Any
    image_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    embed_dim: int
    logit_scale: float
    name: str = ""
    image_encoder_calls: int = field(default=0)
    text_encoder_calls: int = field(default=0)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device: str | torch.device) -> FrozenClip:
        """Move the encoders to ``device`` (in place) and return self."""
        self.model.to(device)
        return self

    @torch.no_grad()
    def encode_images(self, x: torch.Tensor) -> torch.Tensor:
        """Image features [N, D] (float32, not normalised) of a preprocessed float batch [N, 3, S, S]."""
        self.image_encoder_calls += 1
        return self.model.encode_image(x.to(self.device, torch.float32)).float()

    @torch.no_grad()
    def encode_texts(self, texts: Sequence[str], batch_size: int = 256) -> torch.Tensor:
        """Text features [len(texts), D] (float32, not normalised)."""
        self.text_encoder_calls += 1
        texts = list(texts)
        out = [
            self.model.encode_text(self.tokenizer(texts[i : i + batch_size]).to(self.device)).float()
            for i in range(0, len(texts), batch_size)
        ]
        return torch.cat(out) if out else torch.empty(0, self.embed_dim, device=self.device)


def describe_weights(name: str) -> str:
    """Which weights the named CLIP carries, as tables and records say it."""
    spec = CLIP_SPECS.get(name)
    if spec is None:
        return "unknown weights"
    if spec.random:
        return "fixed-seed RANDOM weights, an offline stand-in, not a pretrained CLIP"
    if spec.pretrained == "openai":
        return f"OpenAI {spec.model_name} weights"
    return f"pretrained weights {spec.model_name}"


def _freeze(model: torch.nn.Module) -> torch.nn.Module:
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _build_tiny() -> torch.nn.Module:
    from open_clip.model import CLIP

    cfg = TINY_CLIP_CONFIG
    # log(100): the scale a trained CLIP ends with, so losses see realistic logit magnitudes.
    return CLIP(cfg["embed_dim"], cfg["vision_cfg"], cfg["text_cfg"], init_logit_scale=math.log(100.0))


def _create(spec: _ClipSpec, cache_dir: str | None) -> tuple[torch.nn.Module, Any]:
    import open_clip

    if spec.random:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(RANDOM_SEED)
            if spec.model_name == "tiny":
                model = _build_tiny()
            else:
                model = open_clip.create_model(
                    spec.model_name, pretrained=None, force_quick_gelu=spec.quick_gelu, pretrained_text=False
                )
        return model, open_clip.tokenizer.SimpleTokenizer()
    model = open_clip.create_model(
        spec.model_name, pretrained=spec.pretrained, force_quick_gelu=spec.quick_gelu, cache_dir=cache_dir
    )
    return model, open_clip.get_tokenizer(spec.model_name, cache_dir=cache_dir)


def load_clip(name: str, cache_dir: str | None = None, device: str | torch.device = "cpu") -> FrozenClip:
    """Build the named CLIP (see module docstring), frozen, on ``device``.

    Pretrained weights come from the Hugging Face Hub (or ``cache_dir``); when they cannot be
    reached, one :class:`FedbenchError` says so and names the offline option ``tiny-random``.
    """
    spec = CLIP_SPECS.get(name)
    if spec is None:
        raise FedbenchError(f"unknown CLIP '{name}'; choose one of {sorted(CLIP_SPECS)}")
    try:
        model, tokenizer = _create(spec, cache_dir)
    except ImportError:
        raise
    except Exception as err:  # open_clip wraps every hub/network failure in RuntimeError/OSError
        if spec.random:
            raise
        raise FedbenchError(
            f"could not load pretrained CLIP '{name}' ({spec.model_name}"
            f"{', ' + spec.pretrained if spec.pretrained else ''}): {type(err).__name__}: {err}. "
            "Weights are fetched from the Hugging Face Hub on first use: run once with network access, "
            "point cache_dir at a folder that already holds them, or use clip='tiny-random' "
            "(random weights, works offline) for a smoke run."
        ) from err
    import open_clip

    _freeze(model).to(device)
    cfg = open_clip.get_model_preprocess_cfg(model)
    size = cfg.get("size", TINY_CLIP_CONFIG["vision_cfg"]["image_size"])
    size = int(size if isinstance(size, int) else size[0])
    clip = FrozenClip(
        model=model,
        tokenizer=tokenizer,
        image_size=size,
        mean=tuple(float(m) for m in cfg.get("mean", _OPENAI_MEAN)),
        std=tuple(float(s) for s in cfg.get("std", _OPENAI_STD)),
        embed_dim=0,
        logit_scale=float(model.logit_scale.exp().item()),
        name=name,
    )
    clip.embed_dim = int(clip.encode_texts(["a photo"]).shape[-1])
    clip.text_encoder_calls = 0
    return clip


def clip_resize_uint8(images_uint8: torch.Tensor, image_size: int) -> torch.Tensor:
    """CLIP's image geometry on tensors: uint8 [N, C, H, W] -> uint8 [N, 3, S, S].

    Grayscale is repeated to 3 channels; the shorter side is resized to ``image_size`` (bicubic,
    antialiased, rounded to the uint8 grid as PIL would), then centre-cropped. For square inputs this
    is a plain resize. Runs on the input's device.
    """
    if images_uint8.dtype != torch.uint8 or images_uint8.ndim != 4:
        raise FedbenchError(
            f"CLIP preprocessing expects uint8 images [N, C, H, W], got {images_uint8.dtype} "
            f"{tuple(images_uint8.shape)}"
        )
    channels = images_uint8.shape[1]
    if channels not in (1, 3):
        raise FedbenchError(f"CLIP needs 1 (grayscale) or 3 (RGB) channels, got {channels}")
    x = images_uint8
    if channels == 1:
        x = x.expand(-1, 3, -1, -1)
    h, w = x.shape[-2:]
    if (h, w) == (image_size, image_size):
        return x.contiguous()
    short, long = (h, w) if h <= w else (w, h)
    new_long = int(image_size * long / short)
    new_hw = (image_size, new_long) if h <= w else (new_long, image_size)
    if (h, w) != new_hw:
        x = F.interpolate(x.float(), size=new_hw, mode="bicubic", antialias=True, align_corners=False)
        x = x.round_().clamp_(0, 255).to(torch.uint8)
    top = round((new_hw[0] - image_size) / 2.0)
    left = round((new_hw[1] - image_size) / 2.0)
    return x[..., top : top + image_size, left : left + image_size].contiguous()


def preprocess_uint8(
    images_uint8: torch.Tensor, image_size: int, mean: Sequence[float], std: Sequence[float]
) -> torch.Tensor:
    """CLIP's preprocessing on tensors: uint8 [N, C, H, W] -> normalised float [N, 3, S, S]
    (``clip_resize_uint8``'s geometry, then scaled to [0, 1] and normalised)."""
    x = clip_resize_uint8(images_uint8, image_size).float()
    mean_t = torch.tensor(mean, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    std_t = torch.tensor(std, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    return ((x / 255.0 - mean_t) / std_t).contiguous()
