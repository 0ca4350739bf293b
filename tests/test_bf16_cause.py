"""Issue 42, item 4: one mechanism by which bf16-mixed can send a convolution astray on degenerate batches.

The Kvasir-layout test fixtures are solid colours per class, so a non-iid client's batch can hold identical
images; at 16 px, layer3's output (layer4.0.conv1's input) is 1x1. In this two-layer stand-in (a conv, then
a BatchNorm) with identical inputs at 1x1 and random upstream gradients, the BatchNorm sees zero batch
variance: its backward gives per-sample output gradients of size ~1/sqrt(eps) = 316 that sum to exactly
zero over the batch, so conv1's weight gradient sum_n x_n (x) dh_n = x (x) sum_n dh_n is ~0 in float32.
Under CPU bf16 autocast the convolution's backward works on bf16-rounded dh (8-bit mantissa, ~1 absolute
error at 316): the sum no longer cancels and the weight gradient is ~4e4 times float32's. Running the
BatchNorm itself in float32 does not help (the rounding is in the convolution's backward). Measured below.

What this does NOT show: that it caused the NaN issue 42 reported. In a whole ResNet-18 on identical images
every layer before layer4.0.conv1 is constant too and its gradient stayed exactly 0, and 9 end-to-end bf16
runs on this CPU stayed finite (docs/speed.md); the reported NaN's cause is not established.
"""
from __future__ import annotations

import torch
from torch import nn


def conv1_weight_gradient(bf16: bool, bn_in_fp32: bool = False) -> float:
    torch.manual_seed(0)
    conv, bn = nn.Conv2d(256, 512, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(512)
    x = torch.randn(1, 256, 1, 1).repeat(8, 1, 1, 1)  # one class, one colour: identical samples at 1x1
    upstream = torch.randn(8, 512, 1, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        h = conv(x)
        y = bn(h.float()) if bn_in_fp32 else bn(h)
        (y.float() * upstream).sum().backward()
    return float(conv.weight.grad.abs().max())


def test_identical_samples_at_1x1_give_a_spurious_conv_gradient_under_bf16_only():
    fp32, bf16, bf16_fp32_bn = conv1_weight_gradient(False), conv1_weight_gradient(True), conv1_weight_gradient(True, True)
    # measured: fp32 7.3e-4, bf16 30, bf16 with a float32 BatchNorm 34
    assert fp32 < 1e-2
    assert bf16 > 1e3 * fp32 and bf16_fp32_bn > 1e3 * fp32
