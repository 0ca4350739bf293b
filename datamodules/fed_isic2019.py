"""Fed-ISIC2019 (FLamby): 23,247 dermoscopy images from six centres, 8 classes (FedNPR's skin task).

Layout read (what FLamby's ``download_isic.py`` + ``resize_images.py`` produce, plus FLamby's
split file copied next to it)::

    <root>/ISIC_2019_Training_Input_preprocessed/<image>.jpg   colour-constancy, short side 224
    <root>/train_test_split                                    (or train_test_split.csv)
    <root>/ISIC_2019_Training_GroundTruth.csv                  only needed if the split lacks labels

``train_test_split`` is FLamby's CSV (``flamby/datasets/fed_isic2019/dataset_creation_scripts/``),
with columns ``image, MEL, NV, BCC, AK, BKL, DF, VASC, SCC, UNK, target, center, fold, fold2``.
Only ``image``, ``center`` and ``fold`` (``train`` / ``test``) are required: the label is
``target`` when present, else the one-hot class columns of the row, else those of the ISIC
ground-truth CSV (``image, MEL, NV, BCC, AK, BKL, DF, VASC, SCC, UNK``). A row must have exactly
one of the eight classes (UNK is never set in ISIC 2019 training data and is rejected).

Centres (``TensorSplit.groups``, so ``partition.scheme: natural`` with 6 clients gives one client
per centre): 0 BCN, 1 ViDIR Molemax, 2 ViDIR Modern, 3 Rosendahl, 4 MSK, 5 ViDIR Old (FLamby's
HAM_vienna_dias). Splits: FLamby's per-centre train / test folds (80/20 stratified by centre), each
sample keeping its centre in ``groups``; ``setup`` carves the validation split from train unless
``data.val_fraction`` is 0. FedNPR's protocol (configs/tables/fednpr_isic.yaml): client c trains on
the train fold of centre c and is tested on its test fold (``fed.client_test: site``, with
``data.val_fraction: 0`` so that nothing of the train fold is held out). Images are resized to a square
``image_size`` (224 by default, as in FedNPR).
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from bench.core.errors import DatasetNotFoundError
from datamodules.base import DATASETS, FederatedDataModule
from datamodules.image_files import decode_image_files
from datamodules.tensors import TensorSplit

IMAGE_DIR = "ISIC_2019_Training_Input_preprocessed"
SPLIT_FILES = ("train_test_split", "train_test_split.csv")
GROUND_TRUTH = "ISIC_2019_Training_GroundTruth.csv"
CLASS_CODES = ("MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC")
CENTRE_NAMES = ("BCN", "ViDIR Molemax", "ViDIR Modern", "Rosendahl", "MSK", "ViDIR Old")


def read_csv_rows(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    """Rows of a CSV file as dicts; a missing column raises one clear error naming the file."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        columns = [c.strip() for c in (reader.fieldnames or [])]
        missing = [c for c in required if c not in columns]
        if missing:
            raise DatasetNotFoundError(f"'{path}' lacks the column(s) {missing} (found {columns}).")
        return [{k.strip(): (v or "").strip() for k, v in row.items() if k is not None} for row in reader]


def one_hot_label(row: dict[str, str], where: str) -> int:
    """The class index of a row with one-hot columns MEL..SCC (exactly one set, UNK unset)."""
    hot = [i for i, code in enumerate(CLASS_CODES) if float(row.get(code) or 0) > 0.5]
    if len(hot) != 1 or float(row.get("UNK") or 0) > 0.5:
        raise DatasetNotFoundError(f"{where}: image {row.get('image')!r} must have exactly one of "
                                   f"{', '.join(CLASS_CODES)} set (and UNK unset).")
    return hot[0]


@DATASETS.register("fed-isic2019")
class FedISIC2019(FederatedDataModule):
    class_names: ClassVar[list[str]] = [
        "melanoma", "melanocytic nevus", "basal cell carcinoma", "actinic keratosis",
        "benign keratosis", "dermatofibroma", "vascular lesion", "squamous cell carcinoma",
    ]
    centre_names: ClassVar[tuple[str, ...]] = CENTRE_NAMES
    cross_validation = "FedNPR reports five-fold cross-validation, 80/20 per centre (FLamby's folds pooled per centre)"
    home_entries = ("fed_isic2019",)
    in_channels = 3
    default_image_size = 224
    mean = (0.485, 0.456, 0.406)  # ImageNet statistics (ImageNet-pretrained EfficientNet)
    std = (0.229, 0.224, 0.225)
    download_hint = (
        "Prepare Fed-ISIC2019 with FLamby (https://github.com/owkin/FLamby, flamby/datasets/fed_isic2019): "
        "accept the ISIC 2019 and HAM10000 licences, run download_isic.py --output-folder <data home>/fed_isic2019 and "
        f"resize_images.py, so that <data home>/fed_isic2019/{IMAGE_DIR}/*.jpg exist, and copy FLamby's "
        "dataset_creation_scripts/train_test_split file into <data home>/fed_isic2019/."
    )

    def split_file(self, root: Path) -> Path:
        for name in SPLIT_FILES:
            if (root / name).is_file():
                return root / name
        raise DatasetNotFoundError(
            f"Dataset {self.name!r}: no {' or '.join(SPLIT_FILES)} under '{root}'. {self.download_hint}")

    def labels_by_image(self, root: Path, rows: list[dict[str, str]], split_path: Path) -> dict[str, int]:
        """Label of every image: the split's ``target`` column, its one-hot columns, or the ground truth."""
        if rows and "target" in rows[0]:
            return {r["image"]: int(float(r["target"])) for r in rows}
        if rows and all(code in rows[0] for code in CLASS_CODES):
            return {r["image"]: one_hot_label(r, str(split_path)) for r in rows}
        gt = root / GROUND_TRUTH
        if not gt.is_file():
            raise DatasetNotFoundError(
                f"Dataset {self.name!r}: '{split_path}' has no labels (target or {'/'.join(CLASS_CODES)} columns) "
                f"and {GROUND_TRUTH} is missing under '{root}'. Download it from "
                f"https://challenge.isic-archive.com/data/#2019 into '{root}'.")
        return {r["image"]: one_hot_label(r, str(gt)) for r in read_csv_rows(gt, ("image", *CLASS_CODES))}

    def decode(self) -> dict[str, TensorSplit]:
        root = self.require_root(IMAGE_DIR)
        split_path = self.split_file(root)
        rows = read_csv_rows(split_path, ("image", "center", "fold"))
        labels = self.labels_by_image(root, rows, split_path)
        out: dict[str, TensorSplit] = {}
        for fold in ("train", "test"):
            chosen = [r for r in rows if r["fold"] == fold]
            if not chosen:
                raise DatasetNotFoundError(f"Dataset {self.name!r}: no row with fold == {fold!r} in '{split_path}'.")
            unlabeled = [r["image"] for r in chosen if r["image"] not in labels]
            if unlabeled:
                raise DatasetNotFoundError(f"Dataset {self.name!r}: {len(unlabeled)} image(s) of '{split_path}' have "
                                           f"no ground truth, e.g. {unlabeled[:3]}.")
            paths = [root / IMAGE_DIR / f"{r['image']}.jpg" for r in chosen]
            absent = [p.name for p in paths if not p.is_file()]
            if absent:
                raise DatasetNotFoundError(
                    f"Dataset {self.name!r}: {len(absent)} image(s) listed in '{split_path}' are missing from "
                    f"'{root / IMAGE_DIR}', e.g. {absent[:3]}. {self.download_hint}")
            y = np.array([labels[r["image"]] for r in chosen], dtype=np.int64)
            if y.min() < 0 or y.max() >= len(CLASS_CODES):
                raise DatasetNotFoundError(f"Dataset {self.name!r}: labels outside 0..7 in '{split_path}'.")
            centres = np.array([int(float(r["center"])) for r in chosen], dtype=np.int64)
            if centres.min() < 0 or centres.max() >= len(CENTRE_NAMES):
                raise DatasetNotFoundError(f"Dataset {self.name!r}: centre ids outside 0..5 in '{split_path}'.")
            images = decode_image_files(paths, self.image_size, self.in_channels, desc=f"decoding {self.name} {fold}")
            out[fold] = TensorSplit(images, torch.from_numpy(y), torch.from_numpy(centres))
        return out
