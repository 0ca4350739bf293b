"""The decode cache knows its input files, and a corrupt cache file is named, deleted and rebuilt
(issue 14, items 3 and 4a)."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bench.core.errors import FedbenchWarning
from datamodules.base import DATASETS
from datamodules.fingerprint import tree_fingerprint

CLASSES = ("cat", "dog", "fox")


def class_folders(root: Path, per_class: int = 30) -> Path:
    for label, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = np.full((10, 10, 3), 40 + 60 * label, dtype=np.uint8)
            pixels[0, 0] = i  # every file distinct
            Image.fromarray(pixels).save(root / name / f"{i:03d}.png")
    return root


def loaded(root: Path, cache: Path):
    dm = DATASETS.get("class-folder")(root=str(root), image_size=8, cache_dir=str(cache))
    dm.setup()
    return dm


def total(dm) -> int:
    return len(dm.train) + len(dm.val) + len(dm.test)


def test_changed_files_are_decoded_again(tmp_path):
    """Issue item 3: after deleting 20 images and adding a junk file, runs kept the old images."""
    root, cache = class_folders(tmp_path / "data"), tmp_path / "cache"
    before = loaded(root, cache)
    assert total(before) == 90
    for path in sorted((root / "dog").iterdir())[:20]:
        path.unlink()
    (root / "dog" / "notes.txt").write_text("junk, not an image")
    with pytest.warns(FedbenchWarning, match="built from other files"):
        after = loaded(root, cache)
    assert total(after) == 70
    assert int((torch.cat([after.train.labels, after.val.labels, after.test.labels]) == 1).sum()) == 10
    assert len(list(cache.iterdir())) == 1  # the stale file was replaced, not kept beside the new one


def test_unchanged_files_hit_the_cache(tmp_path, monkeypatch):
    root, cache = class_folders(tmp_path / "data"), tmp_path / "cache"
    first = loaded(root, cache)

    def no_decode(self):
        raise AssertionError("decoded again although no file changed")

    monkeypatch.setattr(type(first), "decode", no_decode)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FedbenchWarning)
        again = loaded(root, cache)
    assert torch.equal(again.train.images, first.train.images)


def test_touched_file_changes_the_fingerprint(tmp_path):
    root = class_folders(tmp_path / "data", per_class=2)
    before = tree_fingerprint(root)
    assert tree_fingerprint(root) == before
    target = root / "cat" / "000.png"
    stat = target.stat()
    import os

    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert tree_fingerprint(root) != before
    assert tree_fingerprint(root, skip=(root / "cat",)) == tree_fingerprint(root, skip=(root / "cat",))


def test_truncated_cache_is_named_deleted_and_rebuilt(tmp_path):
    """Issue item 4a: a truncated cache file made every later run fail with a torch error that
    never named the file."""
    root, cache = class_folders(tmp_path / "data"), tmp_path / "cache"
    first = loaded(root, cache)
    (cache_file,) = cache.iterdir()
    cache_file.write_bytes(cache_file.read_bytes()[:1000])
    with pytest.warns(FedbenchWarning) as caught:
        again = loaded(root, cache)
    message = str(caught[0].message)
    assert str(cache_file) in message and "unreadable" in message and "decoding the dataset again" in message
    assert torch.equal(again.train.images, first.train.images)
    assert torch.load(cache_file, weights_only=True)["fingerprint"] == again.fingerprint  # rebuilt whole


def test_fashion_mnist_fingerprints_only_its_idx_files(tmp_path):
    """An IDX dataset in a shared folder: other files there do not invalidate its cache."""
    from datamodules.fashion_mnist import FashionMNIST

    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (tmp_path / stem).write_bytes(b"x")
    dm = FashionMNIST(root=str(tmp_path), cache_dir=str(tmp_path / "cache"))
    before = dm.source_fingerprint()
    (tmp_path / "unrelated.bin").write_bytes(b"other dataset")
    assert dm.source_fingerprint() == before
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(b"xy")
    assert dm.source_fingerprint() != before
