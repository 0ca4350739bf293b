"""Kvasir-v2: 8,000 endoscopic images in 8 class folders (FedBM / FedCB protocol)."""
from __future__ import annotations

from typing import ClassVar

import torch

from datamodules.base import DATASETS, FederatedDataModule
from datamodules.image_files import decode_image_files, find_dir_with, scan_class_folders
from datamodules.splits import stratified_split
from datamodules.tensors import TensorSplit

# The papers split randomly 7:1:2; a fixed seed (independent of the run seed) keeps the split,
# and therefore the decoded cache, the same for every run.
KVASIR_SPLIT = (0.7, 0.1, 0.2)
KVASIR_SPLIT_SEED = 0


@DATASETS.register("kvasir")
class Kvasir(FederatedDataModule):
    """Kvasir-v2 read from ``kvasir-dataset-v2/<class>/*.jpg`` (or the class folders directly under root)."""

    class_dirs: ClassVar[list[str]] = [
        "dyed-lifted-polyps", "dyed-resection-margins", "esophagitis", "normal-cecum",
        "normal-pylorus", "normal-z-line", "polyps", "ulcerative-colitis",
    ]
    class_names: ClassVar[list[str]] = [
        "dyed lifted polyp", "dyed resection margin", "esophagitis", "cecum",
        "pylorus", "Z-line", "polyps", "ulcerative colitis",
    ]
    home_entries = ("kvasir-dataset-v2", "kvasir")
    cross_validation = "no official split (the papers split it randomly 7:1:2)"
    in_channels = 3
    default_image_size = 128
    mean = (0.485, 0.456, 0.406)  # ImageNet statistics, as in the FedBM protocol
    std = (0.229, 0.224, 0.225)
    download_hint = (
        "Download the official Kvasir-v2 archive kvasir-dataset-v2.zip from "
        "https://datasets.simula.no/kvasir/ "
        "(https://datasets.simula.no/downloads/kvasir/kvasir-dataset-v2.zip) "
        "and unzip it into the data home, so that <data home>/kvasir-dataset-v2/<8 class folders>/*.jpg exist."
    )

    def decode(self) -> dict[str, TensorSplit]:
        root = self.require_root()
        base = find_dir_with(root, self.class_dirs) or (
            root / "kvasir-dataset-v2" if (root / "kvasir-dataset-v2").is_dir() else root
        )
        paths, labels = scan_class_folders(base, self.class_dirs, dataset=self.name, hint=self.download_hint)
        images = decode_image_files(paths, self.image_size, self.in_channels, desc=f"decoding {self.name}")
        labels_t = torch.from_numpy(labels)
        parts = stratified_split(labels, list(KVASIR_SPLIT), KVASIR_SPLIT_SEED)
        return {
            name: TensorSplit(images[idx], labels_t[idx])
            for name, idx in zip(("train", "val", "test"), (torch.from_numpy(p) for p in parts), strict=True)
        }
