"""How float32 arithmetic is done on a GPU: ``gpu_math`` "strict" (the default), "tf32" or "fast".

In torch 2.14 a CUDA fp32 convolution runs as TF32 unless told otherwise
(``torch.backends.cudnn.allow_tf32`` is True by default) and cuDNN picks its algorithms
freely, some non-deterministic. "32-true" would then not be float32, and two runs (or 1 vs N ranks)
could differ. So every run sets the flags explicitly and records them (run record, "execution.math";
the CLIP feature cache keys on them):

- "strict": IEEE fp32 for CUDA matmuls and cuDNN convolutions, cuDNN deterministic, no autotuning.
  What the tables claim ("32-true" is float32) and what the rank-invariance guarantee needs.
- "tf32": TF32 matmuls and convolutions on tensor cores (10-bit mantissa), still deterministic: cuDNN
  deterministic, no autotuning. Its own result identity (its numbers differ from strict's in the last
  digits), and two runs, or 1 vs N ranks, give the same bits on the same GPU and software.
- "fast": TF32 matmuls and convolutions (10-bit mantissa, ~1e-3 relative error per product) and
  ``cudnn.benchmark`` autotuning for fixed shapes (e.g. 224 px): Ampere+ GPUs run several times faster;
  numbers move in the last digits and the bit-exact 1-vs-N-rank guarantee does not hold.

The deterministic modes (strict, tf32) on a CUDA device also call
``torch.use_deterministic_algorithms(True, warn_only=True)`` and set ``CUBLAS_WORKSPACE_CONFIG``
(deterministic cuBLAS): ops with a deterministic implementation use it (scatter/index_put
accumulations, ...). ``warn_only``: a few ops this suite runs have none on CUDA (AdaptiveAvgPool2d's
backward in the simple CNN, bilinear interpolation's backward in FedBM's generator); they warn, naming
the op, instead of ending a run mid-way. ``fill_uninitialized_memory`` stays off: filling every
``torch.empty`` with NaN is a debugging aid that adds a launch per allocation to the hot loop.

Only CUDA/cuDNN flags are touched: CPU (oneDNN) arithmetic, and so every CPU number, is the same
under any mode (deterministic algorithms are left off on the CPU, where no op this suite runs needs them).
"""
from __future__ import annotations

import os
from typing import Any

import torch

GPU_MATH_MODES = ("strict", "tf32", "fast")
DETERMINISTIC_MODES = ("strict", "tf32")
CUBLAS_WORKSPACE = ":4096:8"  # cuBLAS's deterministic workspace setting (CUDA >= 10.2)


def _flags(mode: str) -> dict[str, bool]:
    tf32, fast = mode in ("tf32", "fast"), mode == "fast"
    return {"tf32_matmul": tf32, "tf32_cudnn": tf32, "cudnn_deterministic": not fast, "cudnn_benchmark": fast}


def math_settings(mode: str, device_type: str) -> dict[str, Any]:
    """What ``apply_gpu_math(mode, device_type)`` sets: the CUDA/cuDNN flags, and on a CUDA device whether
    deterministic algorithms are required (and cuBLAS's workspace for it)."""
    if mode not in GPU_MATH_MODES:
        raise ValueError(f"gpu_math must be one of {GPU_MATH_MODES}, got {mode!r}")
    deterministic = device_type == "cuda" and mode in DETERMINISTIC_MODES
    return {**_flags(mode), "deterministic_algorithms": deterministic,
            "cublas_workspace_config": CUBLAS_WORKSPACE if deterministic else None}


def apply_gpu_math(mode: str, device_type: str = "cpu") -> None:
    """Set this process's CUDA/cuDNN float32 flags for ``mode`` (one of GPU_MATH_MODES) on a device of type
    ``device_type`` (``math_settings``). The flags are
    the ``allow_tf32`` ones: torch 2.14 refuses ``torch.get_float32_matmul_precision()`` (which Lightning's
    CUDA accelerator calls) once its newer ``fp32_precision`` API has been mixed in."""
    flags = math_settings(mode, device_type)
    torch.backends.cuda.matmul.allow_tf32 = flags["tf32_matmul"]
    torch.backends.cudnn.allow_tf32 = flags["tf32_cudnn"]
    torch.backends.cudnn.deterministic = flags["cudnn_deterministic"]
    torch.backends.cudnn.benchmark = flags["cudnn_benchmark"]
    if flags["cublas_workspace_config"]:  # read when cuBLAS first initialises (before any CUDA matmul)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", flags["cublas_workspace_config"])
    torch.use_deterministic_algorithms(flags["deterministic_algorithms"], warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False


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
