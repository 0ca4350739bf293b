"""Fashion-MNIST: the offline default dataset (Debian's dataset-fashion-mnist IDX files)."""
from __future__ import annotations

import gzip
import struct
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from bench.core.errors import CorruptDataError
from datamodules.base import DATASETS, FederatedDataModule
from datamodules.tensors import TensorSplit, resize_uint8

_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (optionally gzipped) into a numpy array."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            data = fh.read()
        zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
        if zero != 0 or dtype_code != 0x08:
            raise ValueError(f"not an unsigned-byte IDX file (header {data[:4]!r})")
        shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
        arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
        if arr.size != int(np.prod(shape)):
            raise ValueError(f"expected {int(np.prod(shape))} values, file holds {arr.size}")
        return arr.reshape(shape)
    except (OSError, ValueError, struct.error, EOFError) as err:
        raise CorruptDataError(f"Cannot read IDX file {path}: {err}. Re-download it.") from err


def find_idx(root: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (root / name).exists():
            return root / name
    return None


@DATASETS.register("fashion-mnist")
class FashionMNIST(FederatedDataModule):
    class_names: ClassVar[list[str]] = ["T-shirt or top", "trouser", "pullover", "dress", "coat",
                   "sandal", "shirt", "sneaker", "bag", "ankle boot"]
    in_channels = 1
    default_image_size = 28
    default_root = "/usr/share/datasets/fashion-mnist"
    mean = (0.2860,)
    std = (0.3530,)
    download_hint = (
        "Install Debian's package (apt-get install dataset-fashion-mnist, files land in "
        "/usr/share/datasets/fashion-mnist) or download the four IDX files "
        "(train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, "
        "t10k-labels-idx1-ubyte.gz) from github.com/zalandoresearch/fashion-mnist into one folder."
    )

    def source_paths(self) -> list[Path]:
        """The four IDX files (the root may be a shared folder); the root itself while they are missing."""
        root = Path(self.root).expanduser() if self.root else None
        found = [find_idx(root, s) for stems in _FILES.values() for s in stems] if root else [None]
        return super().source_paths() if None in found else found

    def decode(self) -> dict[str, TensorSplit]:
        root = self.require_root()
        paths = {}
        for split, stems in _FILES.items():
            found = [find_idx(root, s) for s in stems]
            if any(p is None for p in found):
                missing = [s for s, p in zip(stems, found) if p is None]
                self.require_root(*missing)
            paths[split] = found
        out = {}
        for split, (img_path, lbl_path) in paths.items():
            images = torch.from_numpy(read_idx(img_path).copy()).unsqueeze(1)
            labels = torch.from_numpy(read_idx(lbl_path).astype(np.int64))
            out[split] = TensorSplit(resize_uint8(images, self.image_size), labels)
        return out
