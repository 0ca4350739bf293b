"""`make gpu-check` at the table's shape (issue 42, item 5): ResNet-18 with BatchNorm at 128 px, batch 8,
SGD (momentum 0.9, weight decay 5e-4), the repo's own backbone and ``apply_gpu_math``. Each check returns
(verdict, detail): True/False is judged, None is reported only.

Measured on an NVIDIA H200 (torch 2.11.0+cu130; docs/gpu.md), with exactly these inputs:
- conv and matmul error against float64: strict 1.0e-6 / 3.1e-7, tf32 and fast 3.3e-4 / 3.2e-4;
- two identical 8-step trainings: bitwise-equal weights under strict and tf32; fast differs (6.6e-4);
- GPU against CPU after 8 steps (strict): weights 3.0e-7 apart at most, losses 2.4e-7; under tf32 1.9e-3
  and 1.1e-3. The tolerance below (1e-5 on weights and losses) is 33x the strict spread;
- bf16-mixed against float32 over 60 steps: the last 5 steps' mean loss 2.5446 vs 2.5365 (0.3 %), weights
  finite; judged within 5 %;
- peak memory of one client's step: 0.25 GiB.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.numerics import apply_gpu_math

GPU_CPU_TOLERANCE = 1e-5  # 33x the strict GPU-CPU spread measured on the H200 (3.0e-7 weights, 2.4e-7 loss)
BF16_LOSS_TOLERANCE = 0.05  # relative; measured 0.3 % on the H200 over 60 steps


def _model(device: str) -> nn.Module:
    from lightning_modules.backbones import build_backbone

    torch.manual_seed(0)
    body, dim = build_backbone("resnet18", 3, False)
    return nn.Sequential(body, nn.Linear(dim, 8)).to(device)


def _batches(steps: int, size: int, seed: int, batch: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)  # drawn on the CPU: the same values on any device
    return [(torch.randn(batch, 3, size, size, generator=gen), torch.randint(0, 8, (batch,), generator=gen))
            for _ in range(steps)]


def train(device: str, data: list, bf16: bool = False) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Train the table-shape model on ``data``; its state (weights and BatchNorm buffers, on the CPU)
    and the loss of every step."""
    model = _model(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    model.train()
    losses = []
    for x, y in data:
        x, y = x.to(device), y.to(device)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {k: v.detach().float().cpu() for k, v in model.state_dict().items()}, losses


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a if a[k].numel())


def check_math_modes(device: torch.device) -> tuple[bool, str]:
    """A convolution (ResNet's 3x3, 64 channels) and a matmul against float64 under each gpu_math mode:
    strict must be float32-exact (< 1e-5 relative); tf32 and fast are reported (~3e-4 on tensor cores)."""
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 64, 32, 32, generator=gen), torch.randn(64, 64, 3, 3, generator=gen)
    a, b = torch.randn(512, 512, generator=gen), torch.randn(512, 512, generator=gen)
    exact_conv, exact_mm = F.conv2d(x.double(), w.double(), padding=1), a.double() @ b.double()
    errors = {}
    for mode in ("strict", "tf32", "fast"):
        apply_gpu_math(mode, device.type)
        conv = F.conv2d(x.to(device), w.to(device), padding=1).double().cpu()
        mm = (a.to(device) @ b.to(device)).double().cpu()
        errors[mode] = (float((conv - exact_conv).abs().max() / exact_conv.abs().max()),
                        float((mm - exact_mm).abs().max() / exact_mm.abs().max()))
    apply_gpu_math("strict", device.type)
    text = ", ".join(f"{m} {c:.1e}/{mm:.1e}" for m, (c, mm) in errors.items())
    return max(errors["strict"]) < 1e-5, f"conv/matmul relative error: {text} (strict: < 1e-5)"


def check_bitwise_weights(device: torch.device, size: int, steps: int) -> tuple[bool, str]:
    """Two identical trainings give bitwise-equal weights under the deterministic modes (strict, tf32);
    fast (cuDNN autotuning) is reported."""
    data, equal, parts = _batches(steps, size, seed=1), {}, []
    for mode in ("strict", "tf32", "fast"):
        apply_gpu_math(mode, device.type)
        diff = max_difference(train(str(device), data)[0], train(str(device), data)[0])
        equal[mode] = diff == 0.0
        parts.append(f"{mode} {'equal' if equal[mode] else f'{diff:.1e} apart'}")
    apply_gpu_math("strict", device.type)
    return equal["strict"] and equal["tf32"], (f"ResNet-18 {size} px, {steps} steps twice: " + ", ".join(parts)
                                               + " (strict and tf32 must be equal)")


def check_gpu_against_cpu(device: torch.device, size: int, steps: int) -> tuple[bool | None, str]:
    """The same training on the device and on the CPU: strict within GPU_CPU_TOLERANCE (weights and every
    step's loss); tf32 reported."""
    if device.type == "cpu":
        return None, "CPU: no second device to compare with"
    data = _batches(steps, size, seed=1)
    cpu_state, cpu_losses = train("cpu", data)
    gaps = {}
    for mode in ("strict", "tf32"):
        apply_gpu_math(mode, device.type)
        state, losses = train(str(device), data)
        gaps[mode] = (max_difference(cpu_state, state), max(abs(u - v) for u, v in zip(cpu_losses, losses)))
    apply_gpu_math("strict", device.type)
    ok = max(gaps["strict"]) <= GPU_CPU_TOLERANCE
    text = ", ".join(f"{m} weights {w:.1e} losses {lo:.1e}" for m, (w, lo) in gaps.items())
    return ok, f"{steps} steps: {text} (strict within {GPU_CPU_TOLERANCE:g})"


def check_bf16(device: torch.device, size: int, steps: int) -> tuple[bool, str]:
    """bf16-mixed trains as float32 does on the same data: finite weights, and the mean loss of the last
    5 steps within BF16_LOSS_TOLERANCE of float32's."""
    apply_gpu_math("strict", device.type)
    data = _batches(steps, size, seed=2)
    _, fp32 = train(str(device), data)
    state, bf16 = train(str(device), data, bf16=True)
    finite = all(bool(torch.isfinite(v).all()) for v in state.values())
    tail32, tail16 = sum(fp32[-5:]) / len(fp32[-5:]), sum(bf16[-5:]) / len(bf16[-5:])
    gap = abs(tail16 - tail32) / tail32
    return finite and gap <= BF16_LOSS_TOLERANCE, (
        f"{steps} steps at {size} px: last losses bf16 {tail16:.4f} vs float32 {tail32:.4f} ({100 * gap:.1f} %, "
        f"at most {100 * BF16_LOSS_TOLERANCE:g} %), weights {'finite' if finite else 'NOT finite'}")


def check_step_memory(device: torch.device, size: int) -> tuple[None, str]:
    if device.type != "cuda":
        return None, "CPU: no device memory to measure"
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    train(str(device), _batches(3, size, seed=1))
    free, total = torch.cuda.mem_get_info()
    return None, (f"one client's step at {size} px: peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB; "
                  f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free")
