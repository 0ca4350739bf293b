"""The 1-channel stem (method.gray_stem; issue 28 item 2): "sum" (default) keeps the ImageNet stem's RGB
kernels summed, "fresh" is a newly initialised Conv2d(1, 32, 3, stride 2, padding 1, no bias) as FedNPR's
RSNA-ICH notebook builds its EfficientNet-B0; the FedNPR ICH tables use it."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from bench.assembly.config import RunConfig
from bench.assembly.validation import validate_config
from bench.core.errors import FedbenchError
from bench.scheduling.table_runner import load_table_config, plan_runs
from lightning_modules.backbones import first_conv
from lightning_modules.base import FederatedModule
from lightning_modules.pretrained import build_lite0

# FedNPR's [fednpr]_ich.ipynb (Jwicaksana/FedNPR 1dbe3ae), cell 9: features[0][0] = this
FEDNPR_STEM = {"in_channels": 1, "out_channels": 32, "kernel_size": (3, 3), "stride": (2, 2), "padding": (1, 1),
               "dilation": (1, 1), "groups": 1}


def model(gray_stem: str, backbone: str = "efficientnet_lite0", pretrained: bool = True, seed: int = 0):
    torch.manual_seed(seed)
    return FederatedModule(num_classes=5, in_channels=1, backbone=backbone, pretrained=pretrained, gray_stem=gray_stem)


def stem_shape(conv: nn.Conv2d) -> dict:
    return {k: getattr(conv, k) for k in FEDNPR_STEM}


@pytest.mark.parametrize(("backbone", "pretrained"), [("efficientnet_lite0", True), ("efficientnet_b0", False)])
def test_the_fresh_stem_has_fednpr_shape_and_pytorch_default_init(backbone, pretrained):
    net = model("fresh", backbone, pretrained).backbone
    conv = first_conv(net)
    assert conv is net.conv_stem
    assert stem_shape(conv) == FEDNPR_STEM and conv.bias is None
    bound = 1 / math.sqrt(1 * 3 * 3)  # nn.Conv2d's default: kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(fan_in), +)
    w = conv.weight.detach()
    assert w.abs().max() <= bound and w.std() == pytest.approx(bound / math.sqrt(3), rel=0.2)


def test_fresh_replaces_only_the_summed_imagenet_stem():
    summed, fresh = model("sum").backbone, model("fresh").backbone
    imagenet_rgb = build_lite0(in_channels=3).conv_stem.weight.detach()
    assert torch.equal(summed.conv_stem.weight.detach(), imagenet_rgb.sum(dim=1, keepdim=True))  # default: sum
    assert fresh.conv_stem.weight.shape == summed.conv_stem.weight.shape
    assert not torch.allclose(fresh.conv_stem.weight, summed.conv_stem.weight, atol=1e-3)
    others = [k for k in summed.state_dict() if k != "conv_stem.weight"]
    assert others and all(torch.equal(summed.state_dict()[k], fresh.state_dict()[k]) for k in others)
    assert torch.equal(model("fresh", seed=3).backbone.conv_stem.weight, model("fresh", seed=3).backbone.conv_stem.weight)


def test_sum_is_the_default_and_the_fednpr_ich_tables_use_fresh():
    assert RunConfig().method.gray_stem == "sum"
    for config, stem in [("fednpr_ich", "fresh"), ("fednpr-ablation_ich", "fresh"), ("fednpr_isic", "sum"),
                         ("fednpr_fashion-mnist", "sum")]:
        assert {r.cfg.method.gray_stem for r in plan_runs(load_table_config(f"configs/tables/{config}.yaml"))} == {stem}


@pytest.mark.parametrize(("changes", "message"), [
    ({"data": "kvasir"}, "'kvasir' has 3 channels: leave method.gray_stem at 'sum'"),
    ({"data": "digits", "method": "clip-zs"}, "'clip-zs' brings its own encoder"),
])
def test_a_fresh_stem_without_a_grey_imagenet_stem_is_one_clear_error(changes, message):
    cfg = RunConfig()
    cfg.method.gray_stem = "fresh"
    cfg.data.name = changes["data"]
    cfg.method.name = changes.get("method", "fedavg")
    with pytest.raises(FedbenchError) as err:
        validate_config(cfg)
    assert message in str(err.value)
