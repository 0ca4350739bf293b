"""Frozen-encoder features computed once and kept on disk.

Head-only methods (FACMIC, FST-CBDG, CLIP-ZS) never re-run the CLIP encoders per round: they
read these cached features. A cache file is keyed by the CLIP key, the preprocessing and the
images: their ``origin`` (a digest of the decoded dataset's cache key, its source files' names,
sizes and mtimes, the split and every subset taken; datamodules/tensors.py), so that a run names
its images without reading them, or, for images of unknown origin, a SHA-256 of their bytes and
shape; for text, of the prompt list. A changed dataset (files or decoding) or model is never served
stale features. Files are written atomically.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from pathlib import Path

import torch

from bench.core.atomic_io import save_cache
from bench.core.numerics import gpu_math_settings
from lightning_modules.components.clip_models import FrozenClip, preprocess_uint8

CACHE_FORMAT = 1


def _safe(clip_key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", clip_key)[:64] or "clip"


def images_digest(images_uint8: torch.Tensor) -> str:
    """SHA-256 of a uint8 image tensor's shape and bytes (device-agnostic, no copy when on CPU)."""
    h = hashlib.sha256(repr(tuple(images_uint8.shape)).encode())
    array = images_uint8.detach().cpu().contiguous().numpy()
    h.update(memoryview(array).cast("B"))
    return h.hexdigest()


def _key(clip: FrozenClip, clip_key: str, kind: str, content_digest: str) -> str:
    # the CUDA float32 flags (TF32 or not) change GPU-computed features: part of the key; so does the device
    # type (a GPU's kernels give other last bits than the CPU's). CPU features keep the key they had before
    # the device type counted (their caches stay valid); any other device adds its type
    meta = [CACHE_FORMAT, kind, clip_key, clip.image_size, list(clip.mean), list(clip.std), content_digest,
            gpu_math_settings()["gpu_math"]]
    device_type = torch.device(clip.device).type
    if device_type != "cpu":
        meta.append(device_type)
    return hashlib.sha256(json.dumps(meta).encode()).hexdigest()


def _load(path: Path, key: str, rows: int) -> torch.Tensor | None:
    """The cached features if the file is there and matches ``key``; None (with a warning if broken)."""
    if not path.exists():
        return None
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
        feats = blob["features"]
        if blob["key"] == key and feats.ndim == 2 and feats.shape[0] == rows:
            return feats
        warnings.warn(f"feature cache {path} does not match its key; recomputing", stacklevel=3)
    except Exception as err:  # noqa: BLE001 - a truncated/foreign file: recompute, don't stop the run
        warnings.warn(f"unreadable feature cache {path} ({err}); recomputing", stacklevel=3)
    return None


def cached_image_features(
    clip: FrozenClip,
    clip_key: str,
    images_uint8: torch.Tensor,
    cache_dir: str,
    batch_size: int = 256,
    progress: bool = True,
    origin: str | None = None,
) -> torch.Tensor:
    """Image features [N, D] (float32, CPU, not normalised) of uint8 images [N, C, H, W].

    The first call preprocesses and encodes in batches of ``batch_size`` on the CLIP's device
    (with a tqdm bar when ``progress``) and saves the result; later calls with the same
    (clip_key, preprocessing, images) load it without touching the encoder. The images are named by
    ``origin`` (the split's dataset fingerprint and subset, datamodules/tensors.py) when it is given,
    else by a SHA-256 of their bytes and shape (which reads every image, and copies them off a GPU).
    """
    content = f"origin:{origin}:{tuple(images_uint8.shape)}" if origin else images_digest(images_uint8)
    key = _key(clip, clip_key, "image", content)
    path = Path(cache_dir) / f"{_safe(clip_key)}-img-{key[:24]}.pt"
    feats = _load(path, key, len(images_uint8))
    if feats is not None:
        return feats
    from tqdm.auto import tqdm

    chunks = []
    starts = range(0, len(images_uint8), batch_size)
    for start in tqdm(starts, desc=f"encoding images ({clip_key})", disable=not progress, leave=False):
        batch = images_uint8[start : start + batch_size].to(clip.device)
        x = preprocess_uint8(batch, clip.image_size, clip.mean, clip.std)
        chunks.append(clip.encode_images(x).float().cpu())
    feats = torch.cat(chunks) if chunks else torch.empty(0, clip.embed_dim)
    save_cache({"key": key, "features": feats}, path, "the feature cache")
    return feats


def cached_text_features(clip: FrozenClip, clip_key: str, prompts: list[str], cache_dir: str) -> torch.Tensor:
    """Text features [len(prompts), D] (float32, CPU, not normalised), encoded once per prompt list."""
    digest = hashlib.sha256(json.dumps(list(prompts)).encode()).hexdigest()
    key = _key(clip, clip_key, "text", digest)
    path = Path(cache_dir) / f"{_safe(clip_key)}-txt-{key[:24]}.pt"
    feats = _load(path, key, len(prompts))
    if feats is not None:
        return feats
    feats = clip.encode_texts(prompts).float().cpu()
    save_cache({"key": key, "features": feats}, path, "the feature cache")
    return feats
