"""RSNA-ICH: CT slices with exactly one intracranial haemorrhage subtype, 5 classes (FedNPR's ICH task).

FedNPR (Sec. 4.1, following FedIRM / imFedSemi) keeps the 67,969 slices of the RSNA 2019 challenge
labelled with a single haemorrhage type and resizes them to 128 x 128; the five classes are
epidural, intraparenchymal, intraventricular, subarachnoid and subdural ("any" and healthy
slices are not classes). The challenge ships DICOM; this loader reads slices already windowed
and saved as 8- or 16-bit greyscale PNG/JPEG (as FedNPR's code does: ``images/<ID>.png``), in
either of two layouts under the data root:

1. the challenge's label file plus an image folder: ``stage_2_train.csv`` (or
   ``stage_1_train.csv``; long format ``ID,Label`` with ``ID_<slice>_<subtype>`` rows, the six
   rows of a slice giving its five subtypes and ``any``) and ``images/ID_<slice>.png`` (the
   folders ``png/``, ``stage_2_train/``, ``stage_2_train_images/`` or the root itself work too).
   Slices whose label rows set exactly one of the five subtypes are kept; every kept slice
   must have an image file (a missing one is an error, never silently dropped);
2. class folders ``<root>/<subtype>/*.png`` (folder names as the class names, lower case),
   one single-subtype slice per file.

No official test labels exist: a fixed stratified 90/10 train/test split (seed 0) is made at
decode time, so the cache and every run share it; ``setup`` carves validation from train.
FedNPR's protocol (per-client 80/20 splits of each client's share) uses only train.
"""
from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from bench.core.errors import DatasetNotFoundError
from datamodules.base import DATASETS, FederatedDataModule
from datamodules.image_files import IMAGE_EXTENSIONS, decode_image_files, scan_class_folders
from datamodules.splits import stratified_split
from datamodules.tensors import TensorSplit

SUBTYPES = ("epidural", "intraparenchymal", "intraventricular", "subarachnoid", "subdural")
LABEL_FILES = ("stage_2_train.csv", "stage_1_train.csv")
IMAGE_DIRS = ("images", "png", "stage_2_train", "stage_2_train_images", "stage_1_train_images")
TEST_FRACTION = 0.1
SPLIT_SEED = 0


def single_subtype_slices(label_csv: Path) -> dict[str, int]:
    """{slice id ("ID_<hex>"): subtype index} for slices with exactly one positive subtype.

    Reads the challenge's long-format CSV (``ID_<hex>_<subtype>,<0|1>``); duplicated rows (the
    stage-2 file repeats some slices) are harmless; ``any`` rows are ignored.
    """
    masks: dict[str, int] = {}
    with open(label_csv, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:2]] != ["ID", "Label"]:
            raise DatasetNotFoundError(f"'{label_csv}' must start with the header 'ID,Label' (got {header}).")
        for row in reader:
            if len(row) < 2 or not row[0]:
                continue
            slice_id, _, subtype = row[0].rpartition("_")
            if subtype == "any":
                continue
            if subtype not in SUBTYPES:
                raise DatasetNotFoundError(f"'{label_csv}': unexpected row ID {row[0]!r} (subtype {subtype!r}).")
            bit = 1 << SUBTYPES.index(subtype)
            masks[slice_id] = masks.get(slice_id, 0) | (bit if row[1].strip() in ("1", "1.0") else 0)
    return {sid: m.bit_length() - 1 for sid, m in masks.items() if m and (m & (m - 1)) == 0}


def index_images(folder: Path) -> dict[str, Path]:
    """{file stem: path} of the image files directly in ``folder``."""
    with os.scandir(folder) as entries:
        return {Path(e.name).stem: Path(e.path) for e in entries
                if e.is_file() and Path(e.name).suffix.lower() in IMAGE_EXTENSIONS}


@DATASETS.register("rsna-ich")
class RSNAICH(FederatedDataModule):
    class_names: ClassVar[list[str]] = [f"{s} hemorrhage" for s in SUBTYPES]
    home_entries = ("rsna-intracranial-hemorrhage-detection", "rsna-ich", "rsna_ich")
    in_channels = 1
    default_image_size = 128
    mean = (0.456,)  # FedNPR's code normalises with ImageNet's green-channel statistics
    std = (0.224,)
    download_hint = (
        "Get the RSNA Intracranial Hemorrhage Detection data (https://www.kaggle.com/competitions/"
        "rsna-intracranial-hemorrhage-detection), window the DICOM slices (e.g. brain window) and save them as "
        "PNG; then put stage_2_train.csv and the folder images/ID_<slice>.png under "
        "<data home>/rsna-intracranial-hemorrhage-detection/ (the competition's archive name), or the "
        f"single-subtype slices in class folders <root>/{{{','.join(SUBTYPES)}}}/*.png."
    )

    def read_csv_layout(self, root: Path, label_csv: Path) -> tuple[list[Path], np.ndarray]:
        folder = next((root / d for d in IMAGE_DIRS if (root / d).is_dir()), root)
        labels = single_subtype_slices(label_csv)
        if not labels:
            raise DatasetNotFoundError(f"Dataset {self.name!r}: no slice of '{label_csv}' has exactly one subtype.")
        files = index_images(folder)
        ids = sorted(labels)
        missing = [i for i in ids if i not in files]
        if missing:
            raise DatasetNotFoundError(
                f"Dataset {self.name!r}: {len(missing)} of the {len(ids)} single-subtype slices of '{label_csv}' "
                f"have no image in '{folder}', e.g. {missing[:3]}. {self.download_hint}")
        return [files[i] for i in ids], np.array([labels[i] for i in ids], dtype=np.int64)

    def decode(self) -> dict[str, TensorSplit]:
        root = self.require_root()
        label_csv = next((root / f for f in LABEL_FILES if (root / f).is_file()), None)
        if label_csv is not None:
            paths, labels = self.read_csv_layout(root, label_csv)
        elif any((root / s).is_dir() for s in SUBTYPES):
            paths, labels = scan_class_folders(root, SUBTYPES, dataset=self.name, hint=self.download_hint)
        else:
            raise DatasetNotFoundError(
                f"Dataset {self.name!r}: neither {' nor '.join(LABEL_FILES)} nor class folders "
                f"({', '.join(SUBTYPES)}) found under '{root}'. {self.download_hint} {self.root_hint()}")
        images = decode_image_files(paths, self.image_size, self.in_channels, desc=f"decoding {self.name}")
        labels_t = torch.from_numpy(labels)
        train, test = (torch.from_numpy(p) for p in
                       stratified_split(labels, [1 - TEST_FRACTION, TEST_FRACTION], SPLIT_SEED))
        return {"train": TensorSplit(images[train], labels_t[train]),
                "test": TensorSplit(images[test], labels_t[test])}
