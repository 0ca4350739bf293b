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


# ---- cache files of another format (older fedbench versions, other branches) ---------------------------------------
def _valid(raw: dict) -> dict:
    return raw


def _pre_fingerprint(raw: dict) -> dict:  # before issue 14: {split: fields}, no key, no fingerprint
    return {name: dict(fields) for name, fields in raw["splits"].items()}


def _strings(raw: dict) -> dict:  # a dict of str where the splits should be
    return {**raw, "splits": {name: "decoded" for name in raw["splits"]}}


def _other_split_fields(raw: dict) -> dict:  # a TensorSplit with another field name (sites instead of groups)
    return {**raw, "splits": {name: {"images": f["images"], "labels": f["labels"], "sites": None}
                              for name, f in raw["splits"].items()}}


def _tuples(raw: dict) -> dict:  # splits stored as (images, labels) pairs
    return {**raw, "splits": {name: [f["images"], f["labels"]] for name, f in raw["splits"].items()}}


def _float_images(raw: dict) -> dict:  # images as float [0, 1] instead of uint8
    return {**raw, "splits": {name: {**f, "images": f["images"].float() / 255} for name, f in raw["splits"].items()}}


def _list_labels(raw: dict) -> dict:  # labels as a plain list
    return {**raw, "splits": {name: {**f, "labels": f["labels"].tolist()} for name, f in raw["splits"].items()}}


def _other_split_names(raw: dict) -> dict:  # one pooled split (FEMNIST's layout) under a class-folder key
    (first, *_) = raw["splits"].values()
    return {**raw, "splits": {"writers": first}}


def _not_a_dict(raw: dict) -> list:
    return [raw["key"], raw["fingerprint"]]


FOREIGN = [_pre_fingerprint, _strings, _other_split_fields, _tuples, _float_images, _list_labels, _other_split_names,
           _not_a_dict]


@pytest.mark.parametrize("rewrite", FOREIGN, ids=[f.__name__.strip("_") for f in FOREIGN])
def test_a_cache_file_of_another_format_is_decoded_again(tmp_path, rewrite):
    """A cache file written by an older or another fedbench (other layout, other types, other split names)
    is named in one warning and replaced by a fresh decode: never a raw TypeError or KeyError."""
    root, cache = class_folders(tmp_path / "data"), tmp_path / "cache"
    first = loaded(root, cache)
    (cache_file,) = cache.iterdir()
    raw = torch.load(cache_file, weights_only=True)
    torch.save(rewrite(raw), cache_file)
    with pytest.warns(FedbenchWarning) as caught:
        again = loaded(root, cache)
    assert [str(cache_file) in str(w.message) for w in caught if w.category is FedbenchWarning] == [True]
    assert torch.equal(again.train.images, first.train.images) and torch.equal(again.test.labels, first.test.labels)
    rebuilt = torch.load(cache_file, weights_only=True)
    assert rebuilt["key"] == raw["key"] and rebuilt["fingerprint"] == raw["fingerprint"]
    assert sorted(rebuilt["splits"]) == sorted(raw["splits"])
    with warnings.catch_warnings():  # and the rebuilt file is used as is
        warnings.simplefilter("error", FedbenchWarning)
        assert torch.equal(loaded(root, cache).train.images, first.train.images)


def test_femnist_cache_without_its_writers_split_is_decoded_again(tmp_path):
    """FEMNIST keeps one pooled 'writers' split with writer ids: a file under its key holding
    train/test splits (or writers without ids) is rebuilt, not a KeyError or an assert."""
    from datamodules.tensors import TensorSplit, cached_decode

    pooled = TensorSplit(torch.zeros(4, 1, 8, 8, dtype=torch.uint8), torch.arange(4), torch.tensor([0, 0, 1, 1]))
    decodes = []

    def decode():
        decodes.append(1)
        return {"writers": pooled}

    cache = tmp_path / "cache"
    cached_decode(cache, "femnist|x|8|v1", decode, "fp", grouped=("writers",))
    (cache_file,) = cache.iterdir()
    plain = {"images": pooled.images, "labels": pooled.labels, "groups": None}
    for splits, why in (({"train": plain, "test": plain}, "no 'writers' split"),
                        ({"writers": plain}, "'writers' split has no group ids")):
        torch.save({"key": "femnist|x|8|v1", "fingerprint": "fp", "splits": splits}, cache_file)
        with pytest.warns(FedbenchWarning, match=why):
            out = cached_decode(cache, "femnist|x|8|v1", decode, "fp", grouped=("writers",))
        assert torch.equal(out["writers"].groups, pooled.groups)
    assert len(decodes) == 3
    assert torch.equal(cached_decode(cache, "femnist|x|8|v1", decode, "fp", grouped=("writers",))["writers"].groups,
                       pooled.groups) and len(decodes) == 3  # the rebuilt file is used
