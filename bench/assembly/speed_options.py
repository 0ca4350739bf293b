"""The model-side speed options of a run: ``channels_last`` and ``compile`` (the third one,
``precision: bf16-mixed``, is Fabric's: ``fabric.autocast()`` around every forward pass).

Neither changes what is computed, only how: ``channels_last`` stores 4-D weights and image batches
as NHWC (faster convolutions on GPUs with tensor cores; on this suite's 2-core CPU measured 0.96x,
issue 19), ``compile`` runs the backbone through ``torch.compile`` (kernel fusion; on CPU it needs a
C++ compiler and pays a compilation per process). Both are off by default and recorded in the run's
config; ``fedbench bench`` measures each one's speed-up on the machine at hand.
"""
from __future__ import annotations

import torch

from bench.core.batches import DeviceData


def apply_speed_options(module: torch.nn.Module, channels_last: bool, compile_backbone: bool) -> None:
    """Lay out and compile ``module`` in place (state-dict keys and values are unchanged)."""
    if channels_last:
        module.to(memory_format=torch.channels_last)  # 4-D parameters and buffers only
    if compile_backbone:
        backbone = getattr(module, "backbone", None)
        if isinstance(backbone, torch.nn.Module):
            # in place (the state-dict keys keep no ``_orig_mod.`` prefix); dynamic from the first call, so
            # every batch size runs the same kernels whatever order a rank meets them in (a kernel
            # specialised to the first size seen would make the result depend on the rank count)
            backbone.compile(dynamic=True)


def with_channels_last(data: DeviceData | None, channels_last: bool) -> DeviceData | None:
    """``data`` whose image batches come out channels-last (features and the default: unchanged)."""
    if data is None or not channels_last or data.images.dim() != 4:
        return data
    return DeviceData(data.images, data.labels, data.mean, data.std, channels_last=True, origin=data.origin)
