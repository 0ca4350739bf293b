"""FEMNIST (LEAF): handwritten digits and letters grouped by writer, 62 classes, 28x28 greyscale (FedBM Table V).

Layout read: the JSON files LEAF's ``data/femnist/preprocess.sh`` writes, under the data root
(``<data home>/femnist/`` = LEAF's ``data/femnist`` folder, or ``leaf/data/femnist`` of a LEAF clone)::

    <root>/data/all_data/all_data_<i>.json      every writer with all samples (preferred)
    <root>/data/train/*.json + data/test/*.json  used when all_data is absent; a writer's samples in
                                                 both (LEAF's ``-t sample``) are merged

(``<root>/all_data``, ``<root>/train`` + ``<root>/test`` and JSON files directly in the root work too.)
Each file is ``{"users": [...], "num_samples": [...], "user_data": {writer: {"x": [[784 floats in
0..1]], "y": [class ids]}}}``; x is a row-major 28x28 image (white background, as LEAF writes it).
Labels follow LEAF: 0-9 digits, 10-35 upper-case A-Z, 36-61 lower-case a-z.

Protocol of FedBM Sec. IV-A (Table V): only writers with fewer than 150 samples are kept (the paper
counts 396); each trial draws 50 of them at random: 35 training writers, one client each (their
writer id is ``TensorSplit.groups``, so ``partition: {scheme: natural, num_clients: 35}`` gives one
client per writer), 5 validation writers and 10 test writers, pooled (7:1:2 by writer, so validation
and test hold unseen writers). The trial is the run seed: seed s draws its writers from a generator
seeded with s, so a table's seeds 0, 1, 2 are three trials with different writers, as in the paper.
The decoded cache holds every kept writer, so the draw costs nothing per run.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from tqdm.auto import tqdm

from bench.core.errors import CorruptDataError, DatasetNotFoundError
from datamodules.base import DATASETS, FederatedDataModule
from datamodules.tensors import TensorSplit, cached_decode, resize_uint8, split_origin

MAX_WRITER_SAMPLES = 150  # writers with fewer samples than this are kept
TRAIN_WRITERS, VAL_WRITERS, TEST_WRITERS = 35, 5, 10
PIXELS = 28 * 28
TRIAL_STREAM = 0xFE3  # separates the writer draw from other generators seeded with the run seed
CLASS_NAMES = ([f"digit {d}" for d in range(10)]
               + [f"uppercase letter {chr(ord('A') + i)}" for i in range(26)]
               + [f"lowercase letter {chr(ord('a') + i)}" for i in range(26)])


def leaf_json_files(root: Path) -> list[Path]:
    """The LEAF JSON files under ``root``: all_data/ first, else train/ + test/, else JSON in root itself."""
    for base in (root / "data", root):
        files = sorted((base / "all_data").glob("*.json"))
        if files:
            return files
        files = sorted((base / "train").glob("*.json")) + sorted((base / "test").glob("*.json"))
        if files:
            return files
    return sorted(root.glob("*.json"))


def read_leaf_json(path: Path) -> dict[str, dict[str, list]]:
    """{writer: {"x": [...], "y": [...]}} of one LEAF file; a malformed file raises CorruptDataError."""
    try:
        with open(path) as fh:
            blob = json.load(fh)
        users, data = blob["users"], blob["user_data"]
        return {str(u): {"x": data[u]["x"], "y": data[u]["y"]} for u in users}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CorruptDataError(f"Cannot read LEAF file '{path}': {err}. Re-run LEAF's preprocessing "
                               "(data/femnist/preprocess.sh) or re-download it.") from err


def writer_arrays(writer: str, x: list, y: list, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 [n, 28, 28], int64 [n]) of one writer, checked."""
    images = np.asarray(x, dtype=np.float32)
    labels = np.asarray(y, dtype=np.int64)
    if images.ndim != 2 or images.shape[1] != PIXELS or len(images) != len(labels):
        raise CorruptDataError(f"'{path}': writer {writer!r} must have x of shape [n, {PIXELS}] and n labels, "
                               f"got x {images.shape} and {labels.shape[0]} labels.")
    if labels.size and (labels.min() < 0 or labels.max() >= len(CLASS_NAMES)):
        raise CorruptDataError(f"'{path}': writer {writer!r} has labels outside 0..{len(CLASS_NAMES) - 1}.")
    pixels = np.clip(np.rint(images * 255.0), 0, 255).astype(np.uint8)
    return pixels.reshape(-1, 28, 28), labels


def draw_writers(num_writers: int, trial: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The trial's (train, val, test) writer indices: 35 / 5 / 10 distinct writers out of ``num_writers``."""
    order = np.random.default_rng([TRIAL_STREAM, trial]).permutation(num_writers)
    cut1, cut2 = TRAIN_WRITERS, TRAIN_WRITERS + VAL_WRITERS
    return order[:cut1], order[cut1:cut2], order[cut2:cut2 + TEST_WRITERS]


@DATASETS.register("femnist")
class FEMNIST(FederatedDataModule):
    class_names: ClassVar[list[str]] = CLASS_NAMES
    home_entries = ("femnist", "leaf/data/femnist")
    in_channels = 1
    default_image_size = 28
    mean = (0.9618,)  # LEAF's white-background pixels (the paper gives no normalisation)
    std = (0.1644,)
    download_hint = (
        "Build FEMNIST with LEAF (https://github.com/TalwalkarLab/leaf: cd data/femnist && ./preprocess.sh; "
        "the first step alone writes data/all_data/*.json) and copy LEAF's data/femnist folder to "
        "<data home>/femnist, so that <data home>/femnist/data/all_data/all_data_0.json exists."
    )

    def decode(self) -> dict[str, TensorSplit]:
        """Every writer with fewer than 150 samples, as one split whose groups are writer indices."""
        root = self.require_root()
        files = leaf_json_files(root)
        if not files:
            raise DatasetNotFoundError(
                f"Dataset {self.name!r}: no LEAF JSON files (data/all_data/*.json or data/train/*.json) under "
                f"'{root}'. {self.download_hint} {self.root_hint()}")
        parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}  # writer -> its (images, labels) per file
        for path in tqdm(files, desc=f"reading {self.name}", unit="file", disable=len(files) < 3):
            for writer, d in read_leaf_json(path).items():  # converted to uint8 at once: the floats are big
                parts.setdefault(writer, []).append(writer_arrays(writer, d["x"], d["y"], path))
        images, labels, groups = [], [], []
        kept = [w for w in sorted(parts) if 0 < sum(len(y) for _, y in parts[w]) < MAX_WRITER_SAMPLES]
        for index, writer in enumerate(kept):
            y = np.concatenate([y for _, y in parts[writer]])
            images.append(np.concatenate([x for x, _ in parts[writer]]))
            labels.append(y)
            groups.append(np.full(len(y), index, dtype=np.int64))
        need = TRAIN_WRITERS + VAL_WRITERS + TEST_WRITERS
        if len(kept) < need:
            raise DatasetNotFoundError(
                f"Dataset {self.name!r}: only {len(kept)} writers under '{root}' have fewer than "
                f"{MAX_WRITER_SAMPLES} samples; the FedBM protocol draws {need}. Use LEAF's full all_data "
                "(not a sampled subset).")
        x = torch.from_numpy(np.concatenate(images)).unsqueeze(1)
        return {"writers": TensorSplit(resize_uint8(x, self.image_size), torch.from_numpy(np.concatenate(labels)),
                                       torch.from_numpy(np.concatenate(groups)))}

    def load_splits(self) -> tuple[TensorSplit, TensorSplit, TensorSplit]:
        """The trial's writers (trial = run seed): train with one group per writer, val and test pooled."""
        pool = cached_decode(self.cache_dir, self.cache_key(), self.decode, self.fingerprint,
                             grouped=("writers",))["writers"]
        pool.origin = split_origin(self.cache_key(), self.fingerprint, "writers")
        assert pool.groups is not None  # cached_decode decodes again a file whose writers have no ids
        train_w, val_w, test_w = draw_writers(int(pool.groups.max()) + 1, self.run_seed)

        def pick(writers: np.ndarray) -> TensorSplit:
            client_of = torch.full((int(pool.groups.max()) + 1,), -1, dtype=torch.long)
            client_of[torch.from_numpy(writers)] = torch.arange(len(writers))
            idx = torch.nonzero(client_of[pool.groups] >= 0).squeeze(1)
            split = pool.subset(idx)
            return TensorSplit(split.images, split.labels, client_of[split.groups], split.origin)

        train, val, test = pick(train_w), pick(val_w), pick(test_w)
        return (train, TensorSplit(val.images, val.labels, origin=val.origin),
                TensorSplit(test.images, test.labels, origin=test.origin))
