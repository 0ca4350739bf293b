"""CIFAR-10 and CIFAR-100 read from the official python pickles (the layout torchvision uses).

Nothing is downloaded: the pickles are read directly. The class names are fixed here (with
spaces instead of underscores, as concepts for language models) and checked against the
archive's meta file when it is present.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from bench.core.errors import CorruptDataError
from datamodules.base import DATASETS, FederatedDataModule
from datamodules.safe_pickle import NUMPY_ARRAY, PY3_BYTES, restricted_load
from datamodules.tensors import TensorSplit, resize_uint8

CIFAR_HINT = "Re-download the archive (https://www.cs.toronto.edu/~kriz/cifar.html) and unpack it again."
CIFAR100_FINE = [
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle", "bottle",
    "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle", "caterpillar", "cattle",
    "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch", "crab", "crocodile", "cup",
    "dinosaur", "dolphin", "elephant", "flatfish", "forest", "fox", "girl", "hamster", "house",
    "kangaroo", "keyboard", "lamp", "lawn_mower", "leopard", "lion", "lizard", "lobster", "man",
    "maple_tree", "motorcycle", "mountain", "mouse", "mushroom", "oak_tree", "orange", "orchid",
    "otter", "palm_tree", "pear", "pickup_truck", "pine_tree", "plain", "plate", "poppy",
    "porcupine", "possum", "rabbit", "raccoon", "ray", "road", "rocket", "rose", "sea", "seal",
    "shark", "shrew", "skunk", "skyscraper", "snail", "snake", "spider", "squirrel", "streetcar",
    "sunflower", "sweet_pepper", "table", "tank", "telephone", "television", "tiger", "tractor",
    "train", "trout", "tulip", "turtle", "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm",
]


def read_cifar_pickle(path: Path) -> dict[str, object]:
    """One CIFAR pickle as a dict with str keys (the files are pickled with bytes keys), read through the
    restricted unpickler (datamodules/safe_pickle.py: plain containers and NumPy arrays only)."""
    try:
        with open(path, "rb") as fh:
            raw = restricted_load(fh, str(path), NUMPY_ARRAY | PY3_BYTES, "a CIFAR file", CorruptDataError,
                                  CIFAR_HINT, encoding="bytes")
    except OSError as err:
        raise CorruptDataError(f"Cannot read CIFAR file '{path}': {err}. {CIFAR_HINT}") from err
    if not isinstance(raw, dict):
        raise CorruptDataError(f"CIFAR file '{path}' holds a {type(raw).__name__}, not the dict of the official "
                               f"archive. {CIFAR_HINT}")
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in raw.items()}


def cifar_batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, 3, 32, 32], labels int64 [N]) from one data pickle."""
    d = read_cifar_pickle(path)
    try:
        data = np.asarray(d["data"], dtype=np.uint8)
        labels = np.asarray(d[label_key], dtype=np.int64)
        images = data.reshape(len(data), 3, 32, 32)
    except (KeyError, ValueError) as err:
        raise CorruptDataError(
            f"CIFAR file '{path}' lacks a valid 'data' / '{label_key}' entry: {err}."
        ) from err
    if len(images) != len(labels):
        raise CorruptDataError(f"CIFAR file '{path}' holds {len(images)} images but {len(labels)} labels.")
    return images, labels


class CIFARDataset(FederatedDataModule):
    """Base of CIFAR-10/100 (not registered): subclasses name their folder, files and keys."""

    folder: ClassVar[str]
    train_files: ClassVar[list[str]]
    test_files: ClassVar[list[str]]
    meta_file: ClassVar[str]
    label_key: ClassVar[str]
    meta_names_key: ClassVar[str]
    in_channels = 3
    default_image_size = 32

    def source_paths(self) -> list[Path]:
        """The batches folder (the root is often torchvision's shared download folder)."""
        root = Path(self.root).expanduser() if self.root else None
        return [root / self.folder] if root and (root / self.folder).is_dir() else super().source_paths()

    def decode(self) -> dict[str, TensorSplit]:
        root = self.require_root()
        base = root / self.folder if (root / self.folder).is_dir() else root  # root may be the folder itself
        missing = [f for f in self.train_files + self.test_files if not (base / f).is_file()]
        if missing and base == root and len(missing) == len(self.train_files + self.test_files):
            self.require_root(self.folder)  # nothing there: name the folder to unpack
        if missing:
            self.require_root(*(str((base / f).relative_to(root)) for f in missing))
        if (base / self.meta_file).is_file():
            names = [n.decode() if isinstance(n, bytes) else str(n)
                     for n in read_cifar_pickle(base / self.meta_file).get(self.meta_names_key, [])]
            if [n.replace("_", " ") for n in names] != self.class_names:
                raise CorruptDataError(
                    f"'{base / self.meta_file}' lists classes {names[:5]}..., not the {self.name} classes. "
                    f"Check that data.root (or the data home) points at the right archive."
                )
        out = {}
        for split, files in (("train", self.train_files), ("test", self.test_files)):
            parts = [cifar_batch(base / f, self.label_key) for f in files]
            images = torch.from_numpy(np.concatenate([p[0] for p in parts]))
            labels = torch.from_numpy(np.concatenate([p[1] for p in parts]))
            out[split] = TensorSplit(resize_uint8(images, self.image_size), labels)
        return out


@DATASETS.register("cifar10")
class CIFAR10(CIFARDataset):
    folder = "cifar-10-batches-py"
    home_entries = ("cifar-10-batches-py",)
    train_files: ClassVar[list[str]] = [f"data_batch_{i}" for i in range(1, 6)]
    test_files: ClassVar[list[str]] = ["test_batch"]
    meta_file = "batches.meta"
    label_key = "labels"
    meta_names_key = "label_names"
    class_names: ClassVar[list[str]] = [
        "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
    ]
    mean = (0.4914, 0.4822, 0.4465)
    std = (0.2470, 0.2435, 0.2616)
    download_hint = (
        "Download cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html and unpack it "
        "into the data home, so that <data home>/cifar-10-batches-py/data_batch_1..5, test_batch and "
        "batches.meta exist (torchvision's download folder works as is)."
    )


@DATASETS.register("cifar100")
class CIFAR100(CIFARDataset):
    folder = "cifar-100-python"
    home_entries = ("cifar-100-python",)
    train_files: ClassVar[list[str]] = ["train"]
    test_files: ClassVar[list[str]] = ["test"]
    meta_file = "meta"
    label_key = "fine_labels"
    meta_names_key = "fine_label_names"
    class_names: ClassVar[list[str]] = [n.replace("_", " ") for n in CIFAR100_FINE]
    mean = (0.5071, 0.4865, 0.4409)
    std = (0.2673, 0.2564, 0.2762)
    download_hint = (
        "Download cifar-100-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html and unpack it "
        "into the data home, so that <data home>/cifar-100-python/train, test and meta exist "
        "(torchvision's download folder works as is). The 100 fine labels are used."
    )
