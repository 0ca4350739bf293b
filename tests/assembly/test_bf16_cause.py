"""Issue 42, item 4: why bf16-mixed sent ResNet-18's layer4.0.conv1 to NaN on the CPU, and the refusal.

The cause (bench/core/cpu_bf16.py): oneDNN's bf16 weight gradient of a padded convolution whose stride exceeds
its input (3x3, stride 2, padding 1 on a 1x1 input: layer4.0.conv1 at 16 px) reads uninitialised memory with
its AVX-512 / AVX-512-BF16 / AMX kernels. Measured on 2026-11-28 (an AVX-512 Xeon with AMX, torch 2.14.1,
oneDNN 3.12.0) by leaving a value in the process's freed memory and computing the same gradient again:

- 3x3 stride 2 padding 1 on 1x1, 256 -> 512 channels: the gradient moved by 7.9e31 after 1e30 was left there,
  and became NaN after NaN was; with ``ONEDNN_MAX_CPU_ISA=AVX2`` or oneDNN off it did not move;
- of the 66 (kernel 1-7, stride 1-3, padding, input 1-4 px) shapes below, scanned at 64, 256->512 and 3->64
  channels, every one that moved has a stride larger than the input, with padding (20 seen moving); no other
  shape moved, nor ResNet-18's strided shapes on inputs of 1-32 px, channels_last included.

The first test below holds that property on whatever CPU runs it: no shape outside the rule reads freed
memory (on an AVX2-only CPU none does, and the test still checks the unaffected shapes). The run-level tests
check that such a run is refused before its rounds, and that the image size the refusal suggests passes.
"""
from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from bench.core.cpu_bf16 import affected_convolutions, reads_past_its_input

pytestmark = pytest.mark.slow  # end-to-end (>= 6 s): make test-fast leaves this file out

# (kernel, stride, padding, input) shapes seen reading freed memory on the AVX-512 Xeon (any channel count)
MEASURED_AFFECTED = {(3, 2, 1, 1), (3, 3, 1, 1), (3, 3, 1, 2), (5, 2, 2, 1), (5, 3, 2, 1), (5, 3, 2, 2), (7, 2, 3, 1),
                     (7, 3, 3, 1), (7, 3, 3, 2)}


def leave_in_freed_memory(value: float) -> None:
    for _ in range(5):
        blocks = [torch.full((n,), value) for n in (1 << 12, 1 << 16, 1 << 18, 1 << 20, 3 << 18)]
        del blocks


def bf16_weight_gradient(channels: int, kernel: int, stride: int, padding: int, size: int, left: float) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, channels, size, size, generator=gen).bfloat16()
    w = (torch.randn(2 * channels, channels, kernel, kernel, generator=gen) * 0.02).bfloat16()
    out = (size + 2 * padding - kernel) // stride + 1
    grad_out = torch.randn(8, 2 * channels, out, out, generator=gen).bfloat16()
    leave_in_freed_memory(left)
    return torch.ops.aten.convolution_backward(grad_out, x, w, None, [stride, stride], [padding, padding], [1, 1], False,
                                               [0, 0], 1, [False, True, False])[1].float()


def shapes():
    for kernel, stride, size in itertools.product((1, 3, 5, 7), (1, 2, 3), (1, 2, 3, 4)):
        for padding in range(kernel // 2 + 1):
            if (size + 2 * padding - kernel) // stride + 1 >= 1:
                yield kernel, stride, padding, size


def test_no_convolution_outside_the_rule_reads_freed_memory_under_bf16():
    assert len(list(shapes())) == 66
    moved = []
    for kernel, stride, padding, size in shapes():
        first = bf16_weight_gradient(32, kernel, stride, padding, size, 0.0)
        if any(not torch.equal(first, bf16_weight_gradient(32, kernel, stride, padding, size, v)) for v in (1e30, -3.0)):
            moved.append((kernel, stride, padding, size))
    conv = lambda k, s, p: nn.Conv2d(1, 1, k, stride=s, padding=p)
    assert [m for m in moved if not reads_past_its_input(conv(*m[:3]), m[3], m[3])] == []
    # the rule is the measurement: every shape seen moving is in it, and it adds none with stride <= input
    assert all(reads_past_its_input(conv(k, s, p), n, n) for k, s, p, n in MEASURED_AFFECTED)
    assert not any(reads_past_its_input(conv(k, s, p), n, n) for k, s, p, n in shapes() if s <= n or p == 0)


@pytest.mark.parametrize(("size", "expected"), [
    (8, ["backbone.layer3.0.conv1 (input 1x1, stride 2, padding 1)", "backbone.layer4.0.conv1 (input 1x1, stride 2, padding 1)"]),
    (16, ["backbone.layer4.0.conv1 (input 1x1, stride 2, padding 1)"]),
    (32, []), (128, [])])
def test_resnet18s_affected_layers_by_image_size(size, expected):
    from lightning_modules.base import FederatedModule

    module = FederatedModule(num_classes=8, in_channels=3, backbone="resnet18")
    state = {k: v.clone() for k, v in module.state_dict().items()}
    rng = torch.get_rng_state()
    assert affected_convolutions(module, module.features, torch.zeros(2, 3, size, size)) == expected
    assert module.training and torch.equal(torch.get_rng_state(), rng)  # no mode, draw or statistic changed
    assert all(torch.equal(v, module.state_dict()[k]) for k, v in state.items())


def test_a_cpu_bf16_run_on_an_affected_shape_is_refused_before_its_rounds(tmp_path, capsys):
    from bench.cli import main

    argv = ["run", "--data.name", "digits", "--method.backbone", "resnet18", "--fed.rounds", "1",
            "--partition.num_clients", "2", "--accelerator", "cpu", "--devices", "1", "--threads", "1",
            "--progress", "false", "--output_dir", str(tmp_path / "runs"), "--checkpoint_dir", str(tmp_path / "ckpt"),
            "--data.cache_dir", str(tmp_path / "cache"), "--data.max_train_samples", "200",
            "--data.max_test_samples", "100"]  # the refusal reads the model, not the data; the rerun needs only to run
    assert main([*argv, "--precision", "bf16-mixed"]) == 2
    err = capsys.readouterr().err
    assert err.count("fedbench: error: --precision bf16-mixed on the CPU: oneDNN's bf16 weight gradient") == 1
    assert "at 8x8 px this model has 2 such layer(s): backbone.layer3.0.conv1 (input 1x1" in err
    assert "Use --precision 32-true" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "ckpt").exists()  # nothing written
    assert main([*argv, "--precision", "bf16-mixed", "--data.image_size", "32"]) == 0  # the size it suggests runs


def test_a_model_the_probe_cannot_run_is_not_judged_and_keeps_its_mode():
    """A trainable strided, padded convolution behind a forward that refuses the probe's input (say, a model
    that wants another image size): no refusal, no error from the check, the training mode restored."""
    class Picky(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)

        def forward(self, x):
            if x.shape[-1] != 224:
                raise ValueError("224 px only")
            return self.conv(x)

    model = Picky()
    assert affected_convolutions(model, model, torch.zeros(2, 3, 1, 1)) == [] and model.training
