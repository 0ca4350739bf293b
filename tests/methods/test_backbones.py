"""Backbones by name: the simple CNN's width option and the unknown-name error."""
import pytest
import torch

from bench.core.errors import FedbenchError
from lightning_modules.backbones import build_backbone


@pytest.mark.parametrize(("name", "width"), [("simple-cnn", 32), ("simple-cnn-w16", 16), ("simple-cnn-w8", 8)])
def test_simple_cnn_width(name, width):
    net, dim = build_backbone(name, in_channels=3)
    assert dim == 4 * width
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [width, 2 * width, 4 * width]
    assert net(torch.zeros(2, 3, 28, 28)).shape == (2, 4 * width)


@pytest.mark.parametrize("name", ["simple-cnn-w0", "simple-cnn-16", "resnet19"])
def test_unknown_backbone_names_the_choices(name):
    with pytest.raises(FedbenchError, match="choose one of|width must be >= 1"):
        build_backbone(name, in_channels=1)
