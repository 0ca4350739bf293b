"""Decoded datasets as uint8 tensors, plus the on-disk cache they are decoded into once."""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.core.atomic_io import atomic_torch_save


@dataclass
class TensorSplit:
    """One split of a dataset, decoded: images uint8 [N, C, H, W], labels int64 [N].

    ``groups`` optionally holds a site / centre id per sample (used by the natural partition).
    """

    images: torch.Tensor
    labels: torch.Tensor
    groups: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.ndim != 4:
            raise TypeError(f"images must be uint8 [N, C, H, W], got {self.images.dtype} {tuple(self.images.shape)}")
        self.labels = self.labels.long()
        if len(self.images) != len(self.labels):
            raise ValueError(f"{len(self.images)} images but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, index: torch.Tensor) -> TensorSplit:
        index = torch.as_tensor(index, dtype=torch.long)
        groups = None if self.groups is None else self.groups[index]
        return TensorSplit(self.images[index], self.labels[index], groups)


def resize_uint8(images: torch.Tensor, size: int) -> torch.Tensor:
    """Resize a uint8 [N, C, H, W] batch to size x size once, at decode time (antialiased bilinear)."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images.contiguous()
    out = []
    for chunk in images.split(1024):
        x = F.interpolate(chunk.float(), size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        out.append(x.round_().clamp_(0, 255).to(torch.uint8))
    return torch.cat(out)


def cached_decode(
    cache_dir: str | os.PathLike, key: str, decode: Callable[[], dict[str, TensorSplit]]
) -> dict[str, TensorSplit]:
    """Return the decoded splits for ``key``, decoding with ``decode()`` only the first time."""
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"{digest}.pt"
    if path.exists():
        raw = torch.load(path, weights_only=True)
        return {name: TensorSplit(**fields) for name, fields in raw.items()}
    splits = decode()
    atomic_torch_save({name: vars(s) for name, s in splits.items()}, path)
    return splits
