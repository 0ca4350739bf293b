"""Every loader that reads a pickle (CIFAR-10/100's batch and meta files, FedNPR's client split file) goes
through datamodules/safe_pickle.py: a crafted file whose ``__reduce__`` calls os.system is refused with one
error naming the file and the global, and the command never runs; the official layout still loads."""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from official_layouts import cifar_rows, write_cifar10, write_cifar100, write_ich_split_file

from bench.core.errors import CorruptDataError, DatasetNotFoundError
from datamodules.base import DATASETS
from datamodules.client_split_file import read_client_split
from datamodules.safe_pickle import NUMPY_ARRAY, PY3_BYTES, restricted_load


class Payload:
    """What a crafted data file could carry: unpickling it runs a shell command that creates a marker."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def dump(path: Path, obj: dict, protocol: int) -> None:
    with open(path, "wb") as fh:
        pickle.dump({k.encode(): v for k, v in obj.items()}, fh, protocol=protocol)


def setup_cifar(name: str, root: Path):
    dm = DATASETS.get(name)(root=str(root), cache_dir=str(root.parent / "cache"), val_fraction=0.2)
    dm.setup()
    return dm


# (dataset, folder, file, the file's contents with the payload in one value)
CIFAR_FILES = [
    ("cifar10", "cifar-10-batches-py", "data_batch_1", lambda p: {"data": cifar_rows(np.arange(6)), "labels": p}),
    ("cifar10", "cifar-10-batches-py", "test_batch", lambda p: {"data": p, "labels": list(range(10))}),
    ("cifar10", "cifar-10-batches-py", "batches.meta", lambda p: {"label_names": [p]}),
    ("cifar100", "cifar-100-python", "train", lambda p: {"data": cifar_rows(np.arange(4)), "fine_labels": p}),
    ("cifar100", "cifar-100-python", "meta", lambda p: {"fine_label_names": p}),
]


def write_official(name: str, base: Path) -> None:
    if name == "cifar10":
        write_cifar10(base, per_batch=6)
    else:
        write_cifar100(base, np.arange(40) % 10, np.arange(10))


@pytest.mark.parametrize("protocol", [2, 5])
@pytest.mark.parametrize("name, folder, file, contents", CIFAR_FILES, ids=[f"{c[0]}-{c[2]}" for c in CIFAR_FILES])
def test_a_crafted_cifar_file_is_refused_and_never_runs(tmp_path, name, folder, file, contents, protocol):
    base = tmp_path / "data" / folder
    write_official(name, base)
    marker = tmp_path / "pwned"
    dump(base / file, contents(Payload(marker)), protocol)
    with pytest.raises(CorruptDataError) as info:
        setup_cifar(name, tmp_path / "data")
    message = str(info.value)
    assert message.startswith(f"'{base / file}' references ") and "system, which a CIFAR file has no use for" in message
    assert "Re-download the archive" in message
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_official_cifar_pickles_load_under_every_protocol(tmp_path, protocol):
    """The original archive (Python 2 pickles), or one re-pickled by Python 3 at any protocol, still loads."""
    base = tmp_path / "data" / "cifar-10-batches-py"
    write_cifar10(base, per_batch=6)
    for i in range(1, 6):
        labels = [(i + j) % 10 for j in range(6)]
        dump(base / f"data_batch_{i}", {"data": cifar_rows(np.array(labels)), "labels": labels,
                                        "batch_label": b"training batch", "filenames": [b"a.png"] * 6}, protocol)
    dm = setup_cifar("cifar10", tmp_path / "data")
    assert len(dm.train) + len(dm.val) == 30 and dm.test.labels.tolist() == list(range(10))


def test_a_cifar_file_that_is_not_a_dict_is_one_clear_error(tmp_path):
    base = tmp_path / "data" / "cifar-100-python"
    write_official("cifar100", base)
    with open(base / "train", "wb") as fh:
        pickle.dump([1, 2, 3], fh, protocol=2)
    with pytest.raises(CorruptDataError, match=r"CIFAR file '.*train' holds a list, not the dict of the official"):
        setup_cifar("cifar100", tmp_path / "data")


def test_a_crafted_client_split_file_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    write_ich_split_file(tmp_path / "legit.npy", {f"ID_{k}": 1 + k % 2 for k in range(8)}, num_clients=2)
    legit = read_client_split(tmp_path / "legit.npy", 5)
    assert [a.tolist() for a in legit.labels["train"]] == [[1, 2], [1, 2]]
    np.save(tmp_path / "evil.npy", np.array({"train": {0: {"image": Payload(marker)}}}, dtype=object),
            allow_pickle=True)
    with pytest.raises(DatasetNotFoundError, match=r"'.*evil\.npy' references (posix|os|nt)\.system, which a client "
                                                   r"split file has no use for.*FedNPR's ich_datasplit_10cl\.npy"):
        read_client_split(tmp_path / "evil.npy", 5)
    assert not marker.exists()


@pytest.mark.parametrize("call", ["builtins.eval", "subprocess.Popen", "builtins.getattr"])
def test_the_restricted_unpickler_admits_only_its_list(tmp_path, call):
    module, name = call.split(".")
    crafted = b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"X\x01\x00\x00\x001\x85R."  # call(1)
    with open(tmp_path / "f", "wb") as fh:
        fh.write(crafted)
    with open(tmp_path / "f", "rb") as fh, pytest.raises(CorruptDataError, match=f"references {call}, which x has no"):
        restricted_load(fh, str(tmp_path / "f"), NUMPY_ARRAY | PY3_BYTES, "x")
