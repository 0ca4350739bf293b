"""FACMIC's "Real" multi-source skin cancer dataset (its code's ``RealSkin``): three sources as three
natural clients, plus a global test folder, 7 classes.

Layout read (FACMIC's ``data/RealSkin``, one torchvision ImageFolder per client)::

    <root>/client_0/<class>/*.jpg    SC, the Kaggle ISIC skin cancer set restricted to the 7 classes (1,971)
    <root>/client_1/<class>/*.jpg    ISIC 2019, its 80% part (19,766)
    <root>/client_2/<class>/*.jpg    HAM10000 (8,512)
    <root>/client_3/<class>/*.jpg    the global test set (6,233; the code's test_envs = [3])

(a wrapper folder such as ``RealSkin/`` above them is found). Classes, in label order (FACMIC's
folders are read by ImageFolder, i.e. sorted; the paper's order AK, BCC, DF, MEL, NV, PBK, VL):
actinic keratosis, basal cell carcinoma, dermatofibroma, melanoma, nevus, pigmented benign keratosis,
vascular lesion. Folder spellings with underscores and the ISIC / HAM10000 codes (AK/akiec, BCC/bcc,
DF/df, MEL/mel, NV/nv, BKL/bkl/PBK, VASC/vasc/VL) are accepted too.

Splits, as FACMIC's code makes them (``prepare_data_dg_clip.getfeadataloader``): every training
client's images are shuffled with a fixed seed and cut 8:1:1; the 80% part trains (``groups`` = the
client, so ``partition.scheme: natural`` with 3 clients gives the paper's three sources), the 10%
parts together are the validation split, and the last 10% (each client's local test) is not used:
the paper reports the global test folder. ``data.val_fraction`` does not apply.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from bench.core.errors import DatasetNotFoundError
from datamodules.base import DATASETS, FederatedDataModule
from datamodules.image_files import FolderSpec, decode_image_files, find_dir_with, scan_class_folders
from datamodules.tensors import TensorSplit

TRAIN_CLIENTS = ("client_0", "client_1", "client_2")
TEST_CLIENT = "client_3"
SPLIT = (0.8, 0.1, 0.1)  # FACMIC's per-client train / val / local test
SPLIT_SEED = 0  # FACMIC's args.seed


def client_cut(n: int, seed: int = SPLIT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) positions of a client's n images: a seeded shuffle cut at int(0.8 n), int(0.1 n)."""
    order = np.random.default_rng(seed).permutation(n)
    n_train, n_val = int(n * SPLIT[0]), int(n * SPLIT[1])
    return order[:n_train], order[n_train:n_train + n_val]


@DATASETS.register("real-skin")
class RealSkin(FederatedDataModule):
    class_dirs: ClassVar[list[FolderSpec]] = [
        ("actinic keratosis", "actinic_keratosis", "AK", "akiec"),
        ("basal cell carcinoma", "basal_cell_carcinoma", "BCC", "bcc"),
        ("dermatofibroma", "DF", "df"),
        ("melanoma", "MEL", "mel"),
        ("nevus", "NV", "nv"),
        ("pigmented benign keratosis", "pigmented_benign_keratosis", "PBK", "BKL", "bkl"),
        ("vascular lesion", "vascular_lesion", "VL", "VASC", "vasc"),
    ]
    class_names: ClassVar[list[str]] = ["actinic keratosis", "basal cell carcinoma", "dermatofibroma", "melanoma",
                                        "nevus", "pigmented benign keratosis", "vascular lesion"]
    source_names: ClassVar[tuple[str, ...]] = ("SC", "ISIC2019", "HAM10000")
    in_channels = 3
    default_image_size = 224
    mean = (0.485, 0.456, 0.406)
    std = (0.229, 0.224, 0.225)
    home_entries = ("RealSkin", "real-skin", "real_skin")
    download_hint = (
        "Build FACMIC's RealSkin folders (https://github.com/AIPMLab/FACMIC, README 'dataset'): "
        "client_0 = the Kaggle ISIC skin cancer set's 7 shared classes, client_1 = 80% of ISIC 2019, "
        "client_2 = HAM10000, client_3 = the global test set, each with one folder per class (actinic "
        "keratosis, basal cell carcinoma, dermatofibroma, melanoma, nevus, pigmented benign keratosis, "
        "vascular lesion)."
    )

    def base_dir(self) -> Path:
        root = self.require_root()
        base = find_dir_with(root, [*TRAIN_CLIENTS, TEST_CLIENT], max_depth=2)
        if base is None:
            raise DatasetNotFoundError(
                f"Dataset {self.name!r}: no folders {', '.join([*TRAIN_CLIENTS, TEST_CLIENT])} found under "
                f"'{root}'. {self.download_hint} {self.root_hint()}")
        return base

    def decode_folder(self, folder: Path) -> TensorSplit:
        paths, labels = scan_class_folders(folder, self.class_dirs, dataset=self.name, hint=self.download_hint)
        images = decode_image_files(paths, self.image_size, self.in_channels, desc=f"decoding {self.name} {folder.name}")
        return TensorSplit(images, torch.from_numpy(labels))

    def decode(self) -> dict[str, TensorSplit]:
        base = self.base_dir()
        trains, vals = [], []
        for client, name in enumerate(TRAIN_CLIENTS):
            split = self.decode_folder(base / name)
            tr, va = client_cut(len(split))
            part = split.subset(torch.from_numpy(tr))
            trains.append(TensorSplit(part.images, part.labels, torch.full((len(tr),), client, dtype=torch.long)))
            vals.append(split.subset(torch.from_numpy(va)))
        train = TensorSplit(*(torch.cat([getattr(p, k) for p in trains]) for k in ("images", "labels", "groups")))
        val = TensorSplit(*(torch.cat([getattr(p, k) for p in vals]) for k in ("images", "labels")))
        return {"train": train, "val": val, "test": self.decode_folder(base / TEST_CLIENT)}
