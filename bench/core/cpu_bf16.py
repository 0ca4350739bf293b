"""bf16 on the CPU: the convolutions whose weight gradient oneDNN gets wrong (issue 42, item 4).

The cause of the NaN weights in ResNet-18's layer4.0.conv1 under ``--precision bf16-mixed`` on the CPU,
measured on 2026-11-28 (torch 2.14.1, oneDNN 3.12.0): the bf16 weight gradient of a convolution whose stride
exceeds its input's extent, with padding (3x3, stride 2, padding 1 on a 1x1 input: layer4.0.conv1 at 16 px,
layer3.0.conv1 at 8 px), reads uninitialised memory. The same inputs give a different gradient after the
process's freed memory held other values (1e30 left there: a gradient of ~1e31; NaN left there: NaN), with
oneDNN's AVX-512, AVX-512-BF16 and AMX kernels (an AVX-512 Xeon, ``ONEDNN_MAX_CPU_ISA`` stepped down); with
its AVX2 kernels (``ONEDNN_MAX_CPU_ISA=AVX2``, or an AVX2-only CPU such as the EPYC of earlier sessions, where
the NaN never reproduced) and with oneDNN off, and for every other shape scanned (strides 1-3, kernels 1-7,
inputs 1-32 px, channels-first and channels_last), the gradient does not depend on it. float32 is unaffected.

Such a run is refused before its rounds, naming the layers, on every CPU (a run accepted on one machine and
refused on another would make a config's validity depend on where it runs): the convolution's output is
garbage on the machines that have the kernels, and there is no cheaper honest fix than float32 or a larger
image. tests/assembly/test_bf16_cause.py holds the measurement and the refusal.
"""
from __future__ import annotations

import torch
from torch import nn

from bench.core.errors import FedbenchError


def reads_past_its_input(conv: nn.Conv2d, height: int, width: int) -> bool:
    """Whether ``conv`` on an input of ``height`` x ``width`` has the shape oneDNN's bf16 weight gradient gets
    wrong: in some spatial dimension a stride larger than the input and a padding."""
    padding = conv.padding if isinstance(conv.padding, tuple) else (0, 0)  # "valid"; "same" needs stride 1
    return any(s > extent and p > 0 for s, p, extent in zip(conv.stride, padding, (height, width), strict=True))


def affected_convolutions(model: nn.Module, forward, sample: torch.Tensor) -> list[str]:
    """The trainable Conv2d layers of ``model`` that ``forward(sample)`` runs on the affected shape, named
    with their input size. No forward pass at all when no trainable layer could be affected (strided and
    padded); otherwise one in eval mode, without gradients or random draws, the mode restored."""
    candidates = {name: m for name, m in model.named_modules() if isinstance(m, nn.Conv2d) and m.weight.requires_grad
                  and any(s > 1 for s in m.stride) and m.padding != "valid" and m.padding != (0, 0)}
    if not candidates:
        return []
    found: list[str] = []

    def check(name: str):
        def hook(conv: nn.Conv2d, args: tuple) -> None:
            height, width = args[0].shape[-2:]
            if reads_past_its_input(conv, height, width):
                found.append(f"{name} (input {height}x{width}, stride {conv.stride[0]}, padding {conv.padding[0]})")
        return hook

    hooks = [m.register_forward_pre_hook(check(name)) for name, m in candidates.items()]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            forward(sample)
    except Exception:  # noqa: BLE001 - a model that cannot take this probe input: the check cannot tell
        return []  # the check never stops a run it cannot judge
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    return list(dict.fromkeys(found))


def check_cpu_bf16(precision: str, device_type: str, model: nn.Module, forward, image_shape: tuple[int, ...]) -> None:
    """Refuse a bf16 run on the CPU whose model has an affected convolution at this image size (one clear
    error before the rounds); any other run passes without a forward pass."""
    if "bf16" not in precision or device_type != "cpu" or len(image_shape) != 3:
        return
    bad = affected_convolutions(model, forward, torch.zeros(2, *image_shape, device="cpu"))  # a CPU run's model
    if bad:
        raise FedbenchError(
            f"--precision {precision} on the CPU: oneDNN's bf16 weight gradient of a padded convolution whose stride "
            f"exceeds its input reads uninitialised memory (measured with oneDNN 3.12 on AVX-512 CPUs: NaN weights), "
            f"and at {image_shape[-2]}x{image_shape[-1]} px this model has {len(bad)} such layer(s): {', '.join(bad[:4])}"
            f"{' ...' if len(bad) > 4 else ''}. Use --precision 32-true, a larger --data.image_size (ResNet-18: 32 px "
            f"or more), or a GPU (bench/core/cpu_bf16.py).")
