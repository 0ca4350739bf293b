"""sklearn's 8x8 digits (1797 images): a tiny real dataset for fast tests."""
from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from datamodules.base import DATASETS, FederatedDataModule
from datamodules.splits import stratified_split
from datamodules.tensors import TensorSplit, resize_uint8


@DATASETS.register("digits")
class Digits(FederatedDataModule):
    class_names: ClassVar[list[str]] = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    in_channels = 1
    cross_validation = "no official split (sklearn's digits; the 80/20 split is ours)"
    default_image_size = 8
    mean = (0.3,)
    std = (0.37,)

    def decode(self) -> dict[str, TensorSplit]:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        images = torch.from_numpy(np.round(bunch.images * (255 / 16)).astype(np.uint8)).unsqueeze(1)
        labels = torch.from_numpy(bunch.target.astype(np.int64))
        train_idx, test_idx = stratified_split(bunch.target, [0.8, 0.2], seed=0)
        images = resize_uint8(images, self.image_size)
        return {
            "train": TensorSplit(images[train_idx], labels[train_idx]),
            "test": TensorSplit(images[test_idx], labels[test_idx]),
        }
