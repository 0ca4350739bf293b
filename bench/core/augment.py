"""Batch augmentation on the device, drawn from an explicit generator (no per-image PIL)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

AUGMENTATIONS = ("none", "flip", "npr")


def _uniform(n: int, lo: float, hi: float, gen: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """n draws in [lo, hi) on ``like``'s device and in its dtype (drawn in float32 for every dtype)."""
    return torch.rand(n, generator=gen, device=gen.device).to(like.device, like.dtype) * (hi - lo) + lo


def augment_batch(x: torch.Tensor, kind: str, gen: torch.Generator) -> torch.Tensor:
    """Augment a float batch [B, C, H, W] in [0, 1].

    ``flip``: random horizontal flips. ``npr`` (FedNPR's recipe): horizontal and vertical
    flips, rotation in +-10 degrees, Gaussian blur (sigma in [0.1, 1.0], p = 0.5).
    """
    if kind == "none":
        return x
    if kind not in AUGMENTATIONS:
        raise ValueError(f"unknown augmentation {kind!r}; choose one of {AUGMENTATIONS}")
    b, dev = x.shape[0], x.device
    hflip = _uniform(b, 0, 1, gen, x) < 0.5
    x = torch.where(hflip.view(-1, 1, 1, 1), x.flip(-1), x)
    if kind == "flip":
        return x
    vflip = _uniform(b, 0, 1, gen, x) < 0.5
    x = torch.where(vflip.view(-1, 1, 1, 1), x.flip(-2), x)
    angle = _uniform(b, -10, 10, gen, x) * (math.pi / 180)
    cos, sin, zero = angle.cos(), angle.sin(), torch.zeros_like(angle)
    theta = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    x = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    blur = _uniform(b, 0, 1, gen, x) < 0.5
    sigma = _uniform(b, 0.1, 1.0, gen, x)
    radius = 2
    offs = torch.arange(-radius, radius + 1, device=dev, dtype=x.dtype)
    kernel = torch.exp(-(offs.view(1, -1) ** 2) / (2 * sigma.view(-1, 1) ** 2))
    kernel = kernel / kernel.sum(1, keepdim=True)  # [B, 2r+1]
    c = x.shape[1]
    xb = x.reshape(1, b * c, *x.shape[-2:])
    k = kernel.repeat_interleave(c, 0)
    xb = F.conv2d(F.pad(xb, (radius, radius, 0, 0), mode="reflect"), k.view(b * c, 1, 1, -1), groups=b * c)
    xb = F.conv2d(F.pad(xb, (0, 0, radius, radius), mode="reflect"), k.view(b * c, 1, -1, 1), groups=b * c)
    return torch.where(blur.view(-1, 1, 1, 1), xb.view_as(x), x)
