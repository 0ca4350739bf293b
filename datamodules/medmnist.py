"""MedMNIST+ datasets read from their official .npz files: HAM10000 (DermaMNIST) and PBC (BloodMNIST).

The FedBM protocol uses the MedMNIST splits (HAM10000 7,007 / 1,003 / 2,005; PBC 11,959 / 1,712 /
3,421). MedMNIST+ ships each dataset at 28 px (``<flag>.npz``) and at 64, 128 and 224 px
(``<flag>_<size>.npz``). The file matching ``image_size`` is read when present; otherwise the
nearest larger one is resized down (or, if none is larger, the largest one is resized up).
"""
from __future__ import annotations

import zipfile
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from bench.core.errors import CorruptDataError, DatasetNotFoundError
from datamodules.base import DATASETS, FederatedDataModule
from datamodules.tensors import TensorSplit, resize_uint8

MEDMNIST_SIZES = (28, 64, 128, 224)
_SPLITS = ("train", "val", "test")


def medmnist_filename(flag: str, size: int) -> str:
    """The official file name of ``flag`` at ``size`` px (the 28 px file has no suffix)."""
    return f"{flag}.npz" if size == 28 else f"{flag}_{size}.npz"


def choose_medmnist_file(root: Path, flag: str, image_size: int) -> Path | None:
    """The file to read for ``image_size``: exact size, else nearest larger, else the largest present."""
    present = [s for s in MEDMNIST_SIZES if (root / medmnist_filename(flag, s)).is_file()]
    if not present:
        return None
    larger = [s for s in present if s >= image_size]
    size = min(larger) if larger else max(present)
    return root / medmnist_filename(flag, size)


def read_medmnist_npz(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{split: (images uint8 [N, H, W(, C)], labels int64 [N])} from one MedMNIST .npz file."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            keys = [f"{s}_{k}" for s in _SPLITS for k in ("images", "labels")]
            missing = [k for k in keys if k not in npz.files]
            if missing:
                raise ValueError(f"keys {missing} are missing (found {sorted(npz.files)})")
            out = {}
            for split in _SPLITS:
                images, labels = npz[f"{split}_images"], npz[f"{split}_labels"]
                if images.dtype != np.uint8 or images.ndim not in (3, 4):
                    raise ValueError(
                        f"{split}_images must be uint8 [N, H, W(, C)], got {images.dtype} {images.shape}"
                    )
                labels = labels.reshape(len(labels), -1)
                if labels.shape[1] != 1 or len(labels) != len(images):
                    raise ValueError(
                        f"{split}_labels must be [N, 1] for {len(images)} images, got {labels.shape}"
                    )
                out[split] = (images, labels[:, 0].astype(np.int64))
            return out
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise CorruptDataError(f"Cannot read MedMNIST file '{path}': {err}. Re-download it.") from err


class MedMNISTDataset(FederatedDataModule):
    """Base of the MedMNIST+ datasets (not registered): subclasses set ``flag`` and the class names."""

    flag: ClassVar[str]
    in_channels = 3
    default_image_size = 128
    default_root = "~/.medmnist"  # where the medmnist package stores its downloads

    def cache_key(self) -> str:
        """The chosen file is part of the key: downloading a better-matching size re-decodes."""
        root = Path(self.root).expanduser() if self.root else None
        path = choose_medmnist_file(root, self.flag, self.image_size) if root else None
        return f"{super().cache_key()}|{path.name if path else '-'}"

    def source_paths(self) -> list[Path]:
        """The one .npz file read (the root holds the other MedMNIST downloads too)."""
        root = Path(self.root).expanduser() if self.root else None
        path = choose_medmnist_file(root, self.flag, self.image_size) if root else None
        return [path] if path else super().source_paths()

    def decode(self) -> dict[str, TensorSplit]:
        root = self.require_root()
        path = choose_medmnist_file(root, self.flag, self.image_size)
        if path is None:
            wanted = ", ".join(medmnist_filename(self.flag, s) for s in MEDMNIST_SIZES)
            raise DatasetNotFoundError(
                f"Dataset {self.name!r} not found at '{root}' (none of {wanted}). {self.download_hint} "
                f"Then pass --data.root /path/to/it."
            )
        out = {}
        for split, (images, labels) in read_medmnist_npz(path).items():
            x = torch.from_numpy(images)
            x = x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)
            if x.shape[1] != self.in_channels:
                raise CorruptDataError(
                    f"'{path}' holds {x.shape[1]}-channel images; {self.name!r} expects {self.in_channels}."
                )
            out[split] = TensorSplit(resize_uint8(x, self.image_size), torch.from_numpy(labels))
        return out


@DATASETS.register("ham10000")
class HAM10000(MedMNISTDataset):
    """HAM10000 dermatoscopic images, 7 classes, as DermaMNIST."""

    flag = "dermamnist"
    class_names: ClassVar[list[str]] = [
        "actinic keratoses and intraepithelial carcinoma", "basal cell carcinoma",
        "benign keratosis-like lesions", "dermatofibroma", "melanoma", "melanocytic nevi", "vascular lesions",
    ]
    mean = (0.485, 0.456, 0.406)  # ImageNet statistics (FedBM normalises every dataset this way)
    std = (0.229, 0.224, 0.225)
    download_hint = (
        "Download dermamnist_128.npz (or dermamnist.npz / dermamnist_64.npz / dermamnist_224.npz) of "
        "MedMNIST+ from https://zenodo.org/records/10519652 (linked from https://medmnist.com) into one "
        "folder, the data root (default ~/.medmnist, where `pip install medmnist` downloads go)."
    )


@DATASETS.register("pbc")
class PBC(MedMNISTDataset):
    """PBC peripheral blood cell images, 8 classes, as BloodMNIST."""

    flag = "bloodmnist"
    class_names: ClassVar[list[str]] = [
        "basophil", "eosinophil", "erythroblast",
        "immature granulocytes (myelocytes, metamyelocytes and promyelocytes)",
        "lymphocyte", "monocyte", "neutrophil", "platelet",
    ]
    mean = (0.485, 0.456, 0.406)  # ImageNet statistics (FedBM normalises every dataset this way)
    std = (0.229, 0.224, 0.225)
    download_hint = (
        "Download bloodmnist_128.npz (or bloodmnist.npz / bloodmnist_64.npz / bloodmnist_224.npz) of "
        "MedMNIST+ from https://zenodo.org/records/10519652 (linked from https://medmnist.com) into one "
        "folder, the data root (default ~/.medmnist, where `pip install medmnist` downloads go)."
    )
