"""Published client splits read from a file: FedNPR's ``ich_datasplit_10cl.npy`` (RSNA-ICH, 10 clients).

The file (Jwicaksana/FedNPR, commit 1dbe3ae) is a NumPy ``.npy`` holding one pickled Python dict::

    {"train": {0: {"image": array(["ID_777d19086", ...], dtype=object),
                   "label": array([3, 3, 4, ...], dtype=object)},
               1: {...}, ..., 9: {...}},
     "test":  {0: {...}, ..., 9: {...}}}

i.e. for every client its training and test slices (RSNA slice ids) and their labels 0-4. An object
array can only be stored by pickling, and unpickling can run arbitrary code, so ``np.load(...,
allow_pickle=True)`` is never used: the pickle is read by an unpickler that resolves only the NumPy
names an object array needs (``_reconstruct``, ``ndarray``, ``dtype``, ``scalar``); any other global
(``os.system``, ``builtins.eval``, ...) is refused before it is called, with one clear error (datamodules/safe_pickle.py). The
contents are then checked (keys, one id per label, integer labels, the same clients in both folds, no
id twice) and returned as plain arrays.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.core.errors import DatasetNotFoundError
from datamodules.safe_pickle import NUMPY_ARRAY, restricted_load

FOLDS = ("train", "test")
SPLIT_FILE_HINT = "Use the split file as published (FedNPR's ich_datasplit_10cl.npy)."


@dataclass(frozen=True)
class ClientSplitFile:
    """Per fold ("train", "test"), per client (0..N-1 in order): the sample ids and their labels."""

    ids: dict[str, list[np.ndarray]]  # str arrays
    labels: dict[str, list[np.ndarray]]  # int64 arrays

    @property
    def num_clients(self) -> int:
        return len(self.ids["train"])


def read_npy_object(path: Path) -> object:
    """The Python object pickled in an ``.npy`` file, through the NumPy-only unpickler (a plain numeric
    array is returned as is)."""
    raw = path.read_bytes()
    fh = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(fh)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _fortran, dtype = read_header(fh)
    except ValueError as err:
        raise DatasetNotFoundError(f"'{path}' is not a NumPy .npy file ({err}).") from err
    if not dtype.hasobject:
        return np.load(io.BytesIO(raw), allow_pickle=False)
    array = restricted_load(fh, str(path), NUMPY_ARRAY, "a client split file", DatasetNotFoundError,
                            SPLIT_FILE_HINT)
    if not isinstance(array, np.ndarray) or array.shape != tuple(shape):
        raise DatasetNotFoundError(f"'{path}': the pickled contents are not the array its header describes.")
    return array.item() if array.shape == () else array


def read_client_split(path: str | Path, num_classes: int) -> ClientSplitFile:
    """Read and check a client split file (module docstring); DatasetNotFoundError naming what is wrong."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise DatasetNotFoundError(
            f"Client split file '{path}' not found. FedNPR's RSNA-ICH split is ich_datasplit_10cl.npy of "
            "https://github.com/Jwicaksana/FedNPR (download it and pass its path as data.client_split_file).")
    obj = read_npy_object(path)
    if not isinstance(obj, dict) or set(obj) != set(FOLDS):
        got = sorted(map(str, obj)) if isinstance(obj, dict) else type(obj).__name__
        raise DatasetNotFoundError(f"'{path}' must hold a dict with the keys {list(FOLDS)}, got {got}.")
    ids: dict[str, list[np.ndarray]] = {}
    labels: dict[str, list[np.ndarray]] = {}
    for fold in FOLDS:
        clients = obj[fold]
        if not isinstance(clients, dict) or sorted(clients) != list(range(len(clients))) or not clients:
            raise DatasetNotFoundError(f"'{path}': {fold!r} must map the clients 0..N-1 to their samples.")
        ids[fold], labels[fold] = [], []
        for c in range(len(clients)):
            entry = clients[c]
            if not isinstance(entry, dict) or not {"image", "label"} <= set(entry):
                raise DatasetNotFoundError(f"'{path}': {fold} client {c} needs 'image' and 'label' arrays.")
            image, label = np.asarray(entry["image"]), np.asarray(entry["label"])
            if image.ndim != 1 or image.shape != label.shape or len(image) == 0:
                raise DatasetNotFoundError(f"'{path}': {fold} client {c} needs as many labels as images (got "
                                           f"{image.shape} and {label.shape}), at least one.")
            if not all(isinstance(i, str) for i in image.tolist()):
                raise DatasetNotFoundError(f"'{path}': {fold} client {c}'s images must be sample ids (strings).")
            values = label.tolist()
            if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= v < num_classes
                       for v in values):
                raise DatasetNotFoundError(f"'{path}': {fold} client {c} has labels outside 0..{num_classes - 1}.")
            ids[fold].append(image.astype(str))
            labels[fold].append(np.asarray(values, dtype=np.int64))
    if len(ids["train"]) != len(ids["test"]):
        raise DatasetNotFoundError(f"'{path}': {len(ids['train'])} clients in train but {len(ids['test'])} in test.")
    every = np.concatenate([a for fold in FOLDS for a in ids[fold]])
    if len(np.unique(every)) != len(every):
        raise DatasetNotFoundError(f"'{path}': some sample ids appear twice (a sample belongs to one client "
                                   "and one fold).")
    return ClientSplitFile(ids, labels)
