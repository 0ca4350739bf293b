"""How float32 arithmetic is done on a GPU: ``gpu_math`` "strict" (the default) or "fast".

In torch 2.14 a CUDA fp32 convolution runs as TF32 unless told otherwise
(``torch.backends.cudnn.allow_tf32`` is True by default) and cuDNN picks its algorithms
freely, some non-deterministic. "32-true" would then not be float32, and two runs (or 1 vs N ranks)
could differ. So every run sets the flags explicitly and records them (run record, "execution.math";
the CLIP feature cache keys on them):

- "strict": IEEE fp32 for CUDA matmuls and cuDNN convolutions, cuDNN deterministic, no autotuning.
  What the tables claim ("32-true" is float32) and what the rank-invariance guarantee needs.
- "fast": TF32 matmuls and convolutions (10-bit mantissa, ~1e-3 relative error per product) and
  ``cudnn.benchmark`` autotuning for fixed shapes (e.g. 224 px): Ampere+ GPUs run several times faster;
  numbers move in the last digits and the bit-exact 1-vs-N-rank guarantee does not hold.

Only CUDA/cuDNN flags are touched: CPU (oneDNN) arithmetic, and so every CPU number, is the same
under either mode.
"""
from __future__ import annotations

from typing import Any

import torch

GPU_MATH_MODES = ("strict", "fast")


def _flags(mode: str) -> dict[str, bool]:
    fast = mode == "fast"
    return {"tf32_matmul": fast, "tf32_cudnn": fast, "cudnn_deterministic": not fast, "cudnn_benchmark": fast}


def apply_gpu_math(mode: str) -> None:
    """Set this process's CUDA/cuDNN float32 flags for ``mode`` (one of GPU_MATH_MODES). The flags are
    the ``allow_tf32`` ones: torch 2.14 refuses ``torch.get_float32_matmul_precision()`` (which Lightning's
    CUDA accelerator calls) once its newer ``fp32_precision`` API has been mixed in."""
    if mode not in GPU_MATH_MODES:
        raise ValueError(f"gpu_math must be one of {GPU_MATH_MODES}, got {mode!r}")
    flags = _flags(mode)
    torch.backends.cuda.matmul.allow_tf32 = flags["tf32_matmul"]
    torch.backends.cudnn.allow_tf32 = flags["tf32_cudnn"]
    torch.backends.cudnn.deterministic = flags["cudnn_deterministic"]
    torch.backends.cudnn.benchmark = flags["cudnn_benchmark"]


def gpu_math_settings() -> dict[str, Any]:
    """The flags in effect (what a run record stores): the mode they amount to ("custom" if they were
    set by hand to neither), TF32 for CUDA matmuls and cuDNN convolutions, cuDNN's determinism and
    autotuning."""
    settings = {"tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
                "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
                "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
                "cudnn_benchmark": bool(torch.backends.cudnn.benchmark)}
    mode = next((m for m in GPU_MATH_MODES if settings == _flags(m)), "custom")
    return {"gpu_math": mode, **settings}
