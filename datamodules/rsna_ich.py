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

FedNPR's split (``data.client_split_file``: its ``ich_datasplit_10cl.npy``, read without running any pickled
code by datamodules/client_split_file.py): the file lists, for each of its 10 clients, the slice ids of
its training and test samples (80/20 per class within the client; 54,372 + 13,597 = all 67,969
single-subtype slices; its per-client counts are the paper's Table 2). With it the train and test
splits are the file's, each sample's client is its site (``groups``), so ``partition.scheme: natural``
with 10 clients and ``fed.client_test: site`` reproduce FedNPR's clients exactly. Every listed slice must
be among the single-subtype slices under the root with the file's label (the file's labels 0-4 follow
the order above: its class sizes 1,497 / 13,932 / 8,914 / 14,717 / 28,909 are RSNA's epidural ...
subdural counts); a missing slice or a different label is an error, never skipped.

How FedNPR drew that split (Sec. 4.5.1), and what the paper lost: a Dirichlet draw per class over the
10 clients with its own concentration for each subtype (the five values are missing from the text),
then each class removed from each client with some probability (missing too); no generation script
or seed was published. Without the file, ``partition.scheme: dirichlet_missing`` draws such a split
(datamodules/partition.py): per class, each client lacks it with probability ``missing_prob``, the
class is spread over the others with Dir(beta) (``beta`` one value or one per class). Our values are
choices, not the paper's: beta 0.5 for every class and missing_prob 0.3 (the file, like the paper's
Table 2, has 15 of its 50 client-class cells empty: 0.30).
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
from datamodules.client_split_file import FOLDS, read_client_split
from datamodules.fingerprint import tree_fingerprint
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
    client_split_format = "FedNPR's ich_datasplit_10cl.npy (https://github.com/Jwicaksana/FedNPR)"
    cross_validation = ("no official test labels; FedNPR reports five-fold cross-validation (with the split file: "
                        "per client, the file's train and test lists pooled)")

    def cache_key(self) -> str:
        """A split file changes the splits: its resolved path is part of the key."""
        if self.client_split_file is None:
            return super().cache_key()
        return f"{super().cache_key()}|split={Path(self.client_split_file).expanduser().resolve()}"

    def source_fingerprint(self) -> str:
        base = super().source_fingerprint()
        return base if self.client_split_file is None else f"{base}+{tree_fingerprint(self.client_split_file)}"

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

    def slices(self, root: Path) -> tuple[list[Path], np.ndarray]:
        """Every single-subtype slice under the root: image paths (file stem = slice id) and labels."""
        label_csv = next((root / f for f in LABEL_FILES if (root / f).is_file()), None)
        if label_csv is not None:
            return self.read_csv_layout(root, label_csv)
        if any((root / s).is_dir() for s in SUBTYPES):
            return scan_class_folders(root, SUBTYPES, dataset=self.name, hint=self.download_hint)
        raise DatasetNotFoundError(
            f"Dataset {self.name!r}: neither {' nor '.join(LABEL_FILES)} nor class folders "
            f"({', '.join(SUBTYPES)}) found under '{root}'. {self.download_hint} {self.root_hint()}")

    def decode_client_split_file(self, paths: list[Path], labels: np.ndarray) -> dict[str, TensorSplit]:
        """The train / test splits of the client split file, each sample's client in ``groups``."""
        split = read_client_split(self.client_split_file, self.num_classes)
        by_id = {p.stem: (p, int(y)) for p, y in zip(paths, labels)}
        out = {}
        for fold in FOLDS:
            ids = np.concatenate(split.ids[fold])
            want = np.concatenate(split.labels[fold])
            clients = np.concatenate([np.full(len(a), c, dtype=np.int64) for c, a in enumerate(split.ids[fold])])
            missing = [i for i in ids if i not in by_id]
            if missing:
                raise DatasetNotFoundError(
                    f"Dataset {self.name!r}: {len(missing)} of the {len(ids)} {fold} slices of the split file "
                    f"'{self.client_split_file}' are not among the single-subtype slices under '{self.root}', e.g. "
                    f"{[str(i) for i in missing[:3]]}. {self.download_hint}")
            differ = [i for i, y in zip(ids, want) if by_id[i][1] != y]
            if differ:
                i = differ[0]
                raise DatasetNotFoundError(
                    f"Dataset {self.name!r}: {len(differ)} {fold} slice(s) of '{self.client_split_file}' have another "
                    f"label than under '{self.root}', e.g. {i}: {int(want[ids.tolist().index(i)])} in the file, "
                    f"{by_id[i][1]} ({SUBTYPES[by_id[i][1]]}) in the data; the file's labels must follow "
                    f"{', '.join(SUBTYPES)}.")
            images = decode_image_files([by_id[i][0] for i in ids], self.image_size, self.in_channels,
                                        desc=f"decoding {self.name} {fold}")
            out[fold] = TensorSplit(images, torch.from_numpy(want), torch.from_numpy(clients))
        return out

    def decode(self) -> dict[str, TensorSplit]:
        root = self.require_root()
        paths, labels = self.slices(root)
        if self.client_split_file is not None:
            return self.decode_client_split_file(paths, labels)
        images = decode_image_files(paths, self.image_size, self.in_channels, desc=f"decoding {self.name}")
        labels_t = torch.from_numpy(labels)
        train, test = (torch.from_numpy(p) for p in
                       stratified_split(labels, [1 - TEST_FRACTION, TEST_FRACTION], SPLIT_SEED))
        return {"train": TensorSplit(images[train], labels_t[train]),
                "test": TensorSplit(images[test], labels_t[test])}
