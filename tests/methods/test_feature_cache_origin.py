"""The CLIP feature cache names a split by its dataset fingerprint, not by hashing its images (issue 31, item 12).

Before, every run and every rank read every image of every split through SHA-256 (and copied it off
the GPU) to find its cached features: ~690 MB/s here, 5 s per rank for ISIC at 224 px. A split now
carries an ``origin``: a digest of the decoded dataset's cache key, its source files' fingerprint, the
split and every subset taken. A changed file, another decoding or another subset is another origin.
"""
from __future__ import annotations

import os

import pytest
import torch
from official_layouts import write_class_tree

from bench.assembly.config import RunConfig
from bench.assembly.run_data import setup_datamodule, to_device
from lightning_modules.components import feature_cache as FC
from lightning_modules.components.clip_models import load_clip


def folder_dm(root, tmp_path, **data):
    cfg = RunConfig()
    cfg.data.name, cfg.data.root, cfg.data.image_size = "class-folder", str(root), 8
    cfg.data.cache_dir = str(tmp_path / "decoded")
    for key, value in data.items():
        setattr(cfg.data, key, value)
    return setup_datamodule(cfg)


@pytest.fixture
def root(tmp_path):
    path = tmp_path / "images"
    write_class_tree(path, ["a", "b", "c"], 20, ext="png")
    return path


def test_splits_are_named_by_their_files_split_and_subset(root, tmp_path):
    dm = folder_dm(root, tmp_path)
    origins = [dm.train.origin, dm.val.origin, dm.test.origin]
    assert all(o and len(o) == 64 for o in origins) and len(set(origins)) == 3
    again = folder_dm(root, tmp_path / "other-cache")  # decoded afresh: the same files give the same names
    assert [again.train.origin, again.val.origin, again.test.origin] == origins
    capped = folder_dm(root, tmp_path, max_train_samples=30)
    assert capped.train.origin not in origins and capped.test.origin == dm.test.origin
    first, other = dm.train.subset(torch.arange(5)), dm.train.subset(torch.arange(1, 6))
    assert first.origin == dm.train.subset(torch.arange(5)).origin != other.origin
    assert to_device(dm.test, dm, "cpu").origin == dm.test.origin  # what the CLIP methods receive

    image = min(root.rglob("*.png"))
    os.utime(image, (image.stat().st_atime, image.stat().st_mtime + 10))  # a file changed
    changed = folder_dm(root, tmp_path)
    assert not {changed.train.origin, changed.val.origin, changed.test.origin} & set(origins)


def test_cached_features_are_found_without_reading_the_images(root, tmp_path, monkeypatch):
    dm = folder_dm(root, tmp_path)
    clip = load_clip("tiny-random")
    first = FC.cached_image_features(clip, "tiny-random", dm.test.images, str(tmp_path / "f"), progress=False,
                                     origin=dm.test.origin)

    def no_hashing(images):
        raise AssertionError("the images were hashed although their origin names them")

    monkeypatch.setattr(FC, "images_digest", no_hashing)
    fresh = load_clip("tiny-random")
    second = FC.cached_image_features(fresh, "tiny-random", dm.test.images, str(tmp_path / "f"), progress=False,
                                      origin=dm.test.origin)
    assert fresh.image_encoder_calls == 0 and torch.equal(first, second)
    # another split is another entry, encoded anew
    FC.cached_image_features(fresh, "tiny-random", dm.val.images, str(tmp_path / "f"), progress=False,
                             origin=dm.val.origin)
    assert fresh.image_encoder_calls == 1
    assert len(list((tmp_path / "f").glob("*-img-*.pt"))) == 2


def test_images_without_an_origin_are_still_hashed(tmp_path):
    images = torch.randint(0, 256, (6, 1, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    clip = load_clip("tiny-random")
    first = FC.cached_image_features(clip, "tiny-random", images, str(tmp_path), progress=False)
    changed = images.clone()
    changed[0, 0, 0, 0] ^= 1
    FC.cached_image_features(clip, "tiny-random", changed, str(tmp_path), progress=False)
    assert clip.image_encoder_calls == 2 and first.shape == (6, 64)
