"""Dataset loaders on tiny fixtures of each official layout: shapes, labels, splits, cache, errors."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from official_layouts import (
    BT_DIRS,
    CINIC_DIRS,
    KVASIR_DIRS,
    OCT_DIRS,
    SC_DIRS,
    SC_WRAPPER,
    colour,
    dump,
    grey,
    write_cifar10,
    write_cifar100,
    write_class_tree,
    write_kvasir,
    write_medmnist,
    write_oct,
)
from PIL import Image

from bench.core.errors import CorruptDataError, DatasetNotFoundError
from datamodules.base import DATASETS
from datamodules.image_files import decode_image_files, scan_class_folders
from datamodules.medmnist import choose_medmnist_file


# ---- fixtures of the official layouts (writers in tests/official_layouts.py) ------------------------------
def build_kvasir(tmp: Path) -> tuple[Path, Path]:
    base = tmp / "kvasir" / "kvasir-dataset-v2"
    write_kvasir(base, 10)  # JPEGs of the archive's mixed sizes, plus its debris
    return tmp / "kvasir", base / "polyps"


def build_oct(tmp: Path) -> tuple[Path, Path]:
    write_oct(tmp / "oct", {"train": 3, "val": 1, "test": 2})
    return tmp / "oct", tmp / "oct" / "RetinalOCT_Dataset" / "RetinalOCT_Dataset" / "test" / "DR"


def build_cinic(tmp: Path) -> tuple[Path, Path]:
    for split in ("train", "valid", "test"):
        write_class_tree(tmp / "cinic" / split, CINIC_DIRS, 2, ext="png")
    return tmp / "cinic", tmp / "cinic" / "valid" / "cat"


def build_brain_tumor(tmp: Path) -> tuple[Path, Path]:
    write_class_tree(tmp / "bt" / "Training", BT_DIRS, 10)
    write_class_tree(tmp / "bt" / "Testing", BT_DIRS, 2)
    return tmp / "bt", tmp / "bt" / "Training" / "no_tumor"


def build_skin_cancer(tmp: Path) -> tuple[Path, Path]:
    base = tmp / "sc" / SC_WRAPPER
    write_class_tree(base / "Train", SC_DIRS, 10)
    write_class_tree(base / "Test", SC_DIRS, 1, ext="png")
    return tmp / "sc", base / "Train" / "melanoma"


def build_flat_folder(tmp: Path) -> tuple[Path, Path]:
    # written in non-sorted order; labels follow the sorted folder names
    for name, label in (("zebra", 2), ("apple", 0), ("mango", 1)):
        folder = tmp / "flat" / name
        folder.mkdir(parents=True)
        for i in range(10):
            Image.new("RGB", (9, 13), colour(label)).save(folder / f"{i}.png")
    return tmp / "flat", tmp / "flat" / "mango"


def build_split_folder(tmp: Path) -> tuple[Path, Path]:
    for split, n in (("train", 4), ("val", 2), ("test", 3)):
        write_class_tree(tmp / "splits" / split, ["a", "b"], n, ext="bmp")
    return tmp / "splits", tmp / "splits" / "train" / "b"


@dataclass
class Case:
    name: str
    build: Callable[[Path], tuple[Path, Path]]  # -> (root, a class folder to corrupt)
    sizes: dict[str, int]  # after setup (val carved from train when the archive has none)
    image_size: int
    num_classes: int
    grey: bool = False


IMAGE_CASES = [
    Case("kvasir", build_kvasir, {"train": 56, "val": 8, "test": 16}, 16, 8),  # 7:1:2 of 80
    Case("oct-c8", build_oct, {"train": 24, "val": 8, "test": 16}, 12, 8, grey=True),
    Case("cinic10", build_cinic, {"train": 20, "val": 20, "test": 20}, 8, 10),
    Case("brain-tumor", build_brain_tumor, {"train": 36, "val": 4, "test": 8}, 16, 4),
    Case("skin-cancer", build_skin_cancer, {"train": 81, "val": 9, "test": 9}, 8, 9),
    Case("class-folder", build_flat_folder, {"train": 21, "val": 3, "test": 6}, 8, 3),  # 7:1:2 of 30
    Case("class-folder", build_split_folder, {"train": 8, "val": 4, "test": 6}, 8, 2),
]
IDS = [f"{c.name}-{c.build.__name__}" for c in IMAGE_CASES]


def make(name: str, root: Path, tmp: Path, **kw):
    return DATASETS.get(name)(root=str(root), cache_dir=str(tmp / "cache"), **kw)


def no_decode(self):
    raise AssertionError("decoded a second time instead of reading the cache")


def assert_pixels_match_labels(split, in_channels: int, grey_images: bool) -> None:
    means = split.images.float().mean(dim=(2, 3))  # [N, C]
    expected = torch.tensor([(grey if grey_images else colour)(int(y))[:in_channels] for y in split.labels])
    assert (means - expected).abs().max() <= 4, "decoded pixels do not match the labels they were filed under"


# ---- image-folder datasets ----------------------------------------------------------------------
@pytest.mark.parametrize("case", IMAGE_CASES, ids=IDS)
def test_image_dataset_decodes_official_layout(case, tmp_path, monkeypatch):
    root, _ = case.build(tmp_path)
    dm = make(case.name, root, tmp_path, image_size=case.image_size)
    dm.setup()
    assert dm.num_classes == case.num_classes == len(dm.class_names)
    assert {s: len(getattr(dm, s)) for s in ("train", "val", "test")} == case.sizes
    for split in (dm.train, dm.val, dm.test):
        assert split.images.dtype == torch.uint8
        assert split.images.shape[1:] == (dm.in_channels, case.image_size, case.image_size)
        assert_pixels_match_labels(split, dm.in_channels, case.grey)
    assert torch.bincount(dm.train.labels, minlength=case.num_classes).min() > 0

    # a second instance reads the cache: decoding again would raise
    monkeypatch.setattr(type(dm), "decode", no_decode)
    again = make(case.name, root, tmp_path, image_size=case.image_size)
    again.setup()
    assert torch.equal(again.train.images, dm.train.images) and torch.equal(again.test.labels, dm.test.labels)


@pytest.mark.parametrize("case", IMAGE_CASES, ids=IDS)
def test_corrupt_image_names_the_file(case, tmp_path):
    root, folder = case.build(tmp_path)
    (folder / "broken_scan.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not really a JPEG")
    with pytest.raises(CorruptDataError) as err:
        make(case.name, root, tmp_path, image_size=case.image_size).setup()
    assert "broken_scan.jpg" in str(err.value)
    cache = tmp_path / "cache"
    assert not cache.exists() or not any(cache.iterdir())  # nothing half-written left behind


def test_truncated_jpeg_is_corrupt(tmp_path):
    path = tmp_path / "full.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(path)
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(path.read_bytes()[:400])
    with pytest.raises(CorruptDataError, match="cut.jpg"):
        decode_image_files([path, cut], 16, 3)


def test_decode_image_files_grey_and_rgb(tmp_path):
    Image.new("L", (30, 20), 77).save(tmp_path / "g.png")
    Image.new("RGB", (5, 40), (10, 20, 30)).save(tmp_path / "c.png")
    as_rgb = decode_image_files([tmp_path / "g.png", tmp_path / "c.png"], 8, 3)
    as_grey = decode_image_files([tmp_path / "g.png", tmp_path / "c.png"], 8, 1)
    assert as_rgb.shape == (2, 3, 8, 8) and as_grey.shape == (2, 1, 8, 8)
    assert as_rgb[0].unique().tolist() == [77]
    assert as_rgb[1, :, 0, 0].tolist() == [10, 20, 30]
    assert as_grey[1].unique().tolist() == [round(0.299 * 10 + 0.587 * 20 + 0.114 * 30)]  # ITU-R 601 luma


def test_scan_class_folders_errors(tmp_path):
    write_class_tree(tmp_path, ["a", "b"], 2)
    (tmp_path / "empty").mkdir()
    paths, labels = scan_class_folders(tmp_path, ["b", ("x", "a")], dataset="toy")
    assert labels.tolist() == [0, 0, 1, 1] and paths[0].parent.name == "b" and paths[2].parent.name == "a"
    with pytest.raises(DatasetNotFoundError, match="'c' is missing .*expected one folder per class: a, c"):
        scan_class_folders(tmp_path, ["a", "c"], dataset="toy")
    with pytest.raises(DatasetNotFoundError, match="empty' holds no image files"):
        scan_class_folders(tmp_path, ["a", "empty"], dataset="toy")


def test_kvasir_missing_class_folder(tmp_path):
    root, _ = build_kvasir(tmp_path)
    for f in (root / "kvasir-dataset-v2" / "ulcerative-colitis").iterdir():
        f.unlink()
    (root / "kvasir-dataset-v2" / "ulcerative-colitis").rmdir()
    with pytest.raises(DatasetNotFoundError) as err:
        make("kvasir", root, tmp_path).setup()
    msg = str(err.value)
    assert "'kvasir'" in msg and "'ulcerative-colitis' is missing" in msg and "kvasir-dataset-v2.zip" in msg


def test_kvasir_folders_directly_under_root(tmp_path):
    write_class_tree(tmp_path / "flat", KVASIR_DIRS, 10)
    dm = make("kvasir", tmp_path / "flat", tmp_path, image_size=8)
    dm.setup()
    assert (len(dm.train), len(dm.val), len(dm.test)) == (56, 8, 16)
    assert dm.class_names[5] == "Z-line"


def test_oct_without_split_folders(tmp_path):
    write_class_tree(tmp_path / "oct", OCT_DIRS, 1)  # class folders but no train/val/test
    with pytest.raises(DatasetNotFoundError) as err:
        make("oct-c8", tmp_path / "oct", tmp_path).setup()
    assert "'oct-c8'" in str(err.value) and "'train/' and 'test/'" in str(err.value)


def test_oct_class_names_not_swapped():
    names = DATASETS.get("oct-c8").class_names
    assert names[4] == "Diabetic retinopathy" and names[6] == "Macular hole"


def test_class_folder_names_are_sorted_folders(tmp_path):
    root, _ = build_flat_folder(tmp_path)
    assert make("class-folder", root, tmp_path).class_names == ["apple", "mango", "zebra"]


def test_class_folder_half_split_layout(tmp_path):
    write_class_tree(tmp_path / "half" / "train", ["a", "b"], 2)  # train/ but no test/
    with pytest.raises(DatasetNotFoundError, match="no 'train/' and 'test/' folders"):
        make("class-folder", tmp_path / "half", tmp_path).setup()


# ---- MedMNIST+ --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "flag", "num_classes"), [("ham10000", "dermamnist", 7), ("pbc", "bloodmnist", 8)]
)
def test_medmnist_reads_npz(name, flag, num_classes, tmp_path, monkeypatch):
    root = tmp_path / name
    root.mkdir()
    write_medmnist(root / f"{flag}_64.npz", 64, {"train": 21, "val": 9, "test": 11}, num_classes)
    dm = make(name, root, tmp_path, image_size=32)  # no 32 px file: the 64 px one is resized
    dm.setup()
    assert dm.num_classes == num_classes
    assert (len(dm.train), len(dm.val), len(dm.test)) == (21, 9, 11)
    assert dm.train.images.shape == (21, 3, 32, 32) and dm.train.images.dtype == torch.uint8
    assert dm.train.labels.tolist() == [i % num_classes for i in range(21)]
    assert_pixels_match_labels(dm.test, 3, False)

    monkeypatch.setattr(type(dm), "decode", no_decode)
    again = make(name, root, tmp_path, image_size=32)
    again.setup()
    assert torch.equal(again.val.images, dm.val.images)


def test_medmnist_file_choice(tmp_path):
    for name in ("dermamnist.npz", "dermamnist_128.npz"):
        (tmp_path / name).write_bytes(b"")
    assert choose_medmnist_file(tmp_path, "dermamnist", 28).name == "dermamnist.npz"
    assert choose_medmnist_file(tmp_path, "dermamnist", 64).name == "dermamnist_128.npz"
    assert choose_medmnist_file(tmp_path, "dermamnist", 128).name == "dermamnist_128.npz"
    assert choose_medmnist_file(tmp_path, "dermamnist", 300).name == "dermamnist_128.npz"
    assert choose_medmnist_file(tmp_path, "bloodmnist", 28) is None


def test_medmnist_corrupt_file(tmp_path):
    (tmp_path / "bloodmnist_128.npz").write_bytes(b"PK\x03\x04 truncated zip")
    with pytest.raises(CorruptDataError, match="bloodmnist_128.npz"):
        make("pbc", tmp_path, tmp_path).setup()
    np.savez(tmp_path / "dermamnist_128.npz", train_images=np.zeros((2, 4, 4, 3), np.uint8))
    with pytest.raises(CorruptDataError, match=r"dermamnist_128.npz.*missing"):
        make("ham10000", tmp_path, tmp_path).setup()


# ---- CIFAR ------------------------------------------------------------------------------------
def build_cifar10(tmp: Path) -> Path:
    write_cifar10(tmp / "c10" / "cifar-10-batches-py")
    return tmp / "c10"


def build_cifar100(tmp: Path) -> Path:
    write_cifar100(tmp / "c100" / "cifar-100-python", np.arange(40) % 11 * 9, np.arange(11))  # fine labels 0..90
    return tmp / "c100"


def test_cifar10_reads_pickles(tmp_path, monkeypatch):
    root = build_cifar10(tmp_path)
    dm = make("cifar10", root, tmp_path, val_fraction=0.2)
    dm.setup()
    assert dm.num_classes == 10
    assert len(dm.train) + len(dm.val) == 30 and len(dm.test) == 10
    assert dm.test.images.shape == (10, 3, 32, 32) and dm.test.labels.tolist() == list(range(10))
    # channel planes decoded in R, G, B order
    assert dm.test.images[3, :, 5, 7].tolist() == list(colour(3))
    assert_pixels_match_labels(dm.train, 3, False)

    monkeypatch.setattr(type(dm), "decode", no_decode)
    same = make("cifar10", root, tmp_path, val_fraction=0.2)
    same.setup()
    assert torch.equal(same.test.images, dm.test.images) and torch.equal(same.val.labels, dm.val.labels)


def test_cifar100_fine_labels_and_resize(tmp_path):
    root = build_cifar100(tmp_path) / "cifar-100-python"  # the unpacked folder itself works as root too
    dm = make("cifar100", root, tmp_path, image_size=16, val_fraction=0.3)
    dm.setup()
    assert dm.num_classes == 100 and dm.class_names[1] == "aquarium fish"
    assert dm.test.images.shape == (11, 3, 16, 16)
    assert dm.test.labels.tolist() == list(range(11))
    assert set(torch.cat([dm.train.labels, dm.val.labels]).tolist()) == {9 * k for k in range(11)}


def test_cifar_corrupt_and_missing(tmp_path):
    root = build_cifar10(tmp_path)
    (root / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"garbage, not a pickle")
    with pytest.raises(CorruptDataError, match="data_batch_3"):
        make("cifar10", root, tmp_path).setup()
    (root / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(DatasetNotFoundError, match=r"missing: cifar-10-batches-py/data_batch_3"):
        make("cifar10", root, tmp_path).setup()
    c100 = build_cifar100(tmp_path)
    dump(c100 / "cifar-100-python" / "meta", {"fine_label_names": [b"cat"] * 100})
    with pytest.raises(CorruptDataError, match="not the cifar100 classes"):
        make("cifar100", c100, tmp_path).setup()


# ---- missing data: one message naming the dataset and what to download ------------------------------
@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("kvasir", "datasets.simula.no"),
        ("oct-c8", "obulisainaren/retinal-oct-c8"),
        ("ham10000", "dermamnist_128.npz"),
        ("pbc", "bloodmnist_128.npz"),
        ("cifar10", "cifar-10-python.tar.gz"),
        ("cifar100", "cifar-100-python.tar.gz"),
        ("class-folder", "one folder per class"),
        ("cinic10", "CINIC-10.tar.gz"),
        ("brain-tumor", "sartajbhuvaji/brain-tumor-classification-mri"),
        ("skin-cancer", "nodoubttome/skin-cancer9-classesisic"),
    ],
)
def test_missing_dataset_message(name, hint, tmp_path):
    with pytest.raises(DatasetNotFoundError) as err:
        make(name, tmp_path / "not-downloaded", tmp_path).setup()
    msg = str(err.value)
    assert repr(name) in msg and hint in msg and "not-downloaded" in msg and "--data.root" in msg
