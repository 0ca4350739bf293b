"""FEMNIST (LEAF JSON): writers with < 150 samples kept, 35/5/10 writers drawn per trial (= run seed),
one client per training writer through the natural partition, readable class names, clear errors."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import run_in_process
from official_layouts import femnist_level, femnist_writers, write_leaf_femnist

from bench.core.errors import CorruptDataError, DatasetNotFoundError
from datamodules.base import DATASETS
from datamodules.femnist import CLASS_NAMES, draw_writers
from datamodules.partition import partition

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out


def make(root, tmp_path, seed=0, **kw):
    return DATASETS.get("femnist")(root=str(root), cache_dir=str(tmp_path / "cache"), run_seed=seed, **kw)


@pytest.fixture
def leaf(tmp_path):
    writers = femnist_writers()
    write_leaf_femnist(tmp_path / "femnist" / "data", writers)
    return tmp_path / "femnist", writers


def test_class_names_are_the_62_leaf_classes_in_label_order():
    assert len(CLASS_NAMES) == 62 and len(set(CLASS_NAMES)) == 62
    assert CLASS_NAMES[0] == "digit 0" and CLASS_NAMES[9] == "digit 9"
    assert CLASS_NAMES[10] == "uppercase letter A" and CLASS_NAMES[35] == "uppercase letter Z"
    assert CLASS_NAMES[36] == "lowercase letter a" and CLASS_NAMES[61] == "lowercase letter z"


def test_keeps_writers_below_150_samples_and_draws_35_5_10(leaf, tmp_path):
    root, writers = leaf
    kept = sorted(w for w, y in writers.items() if len(y) < 150)
    assert len(kept) == 56 and "f3100_01" in kept and "f3101_02" not in kept  # 149 kept, 150 and 212 not
    dm = make(root, tmp_path, seed=0)
    assert (dm.in_channels, dm.default_image_size, dm.num_classes) == (1, 28, 62)
    pool = dm.decode()["writers"]
    assert pool.images.shape == (sum(len(writers[w]) for w in kept), 1, 28, 28)
    assert torch.bincount(pool.groups).tolist() == [len(writers[w]) for w in kept]  # writer index = sorted id
    assert pool.labels.tolist() == [c for w in kept for c in writers[w]]
    assert torch.equal(pool.images[:, 0, 14, 14].long(), torch.tensor([femnist_level(int(y)) for y in pool.labels]))

    dm.setup()
    train_w, val_w, test_w = draw_writers(len(kept), 0)
    assert (len(train_w), len(val_w), len(test_w)) == (35, 5, 10)
    assert len(set(train_w) | set(val_w) | set(test_w)) == 50  # 50 distinct writers
    sizes = [len(writers[kept[w]]) for w in train_w]
    assert torch.bincount(dm.train.groups).tolist() == sizes  # client c = the c-th drawn writer, all its samples
    assert len(dm.val) == sum(len(writers[kept[w]]) for w in val_w)
    assert len(dm.test) == sum(len(writers[kept[w]]) for w in test_w)
    assert dm.val.groups is None and dm.test.groups is None  # pooled
    part = partition(dm.train.labels.numpy(), "natural", 35, 0, groups=dm.train.groups.numpy())
    assert part.sizes() == sizes


def test_trial_is_the_run_seed_and_the_cache_is_shared(leaf, tmp_path, monkeypatch):
    root, writers = leaf
    kept = sorted(w for w, y in writers.items() if len(y) < 150)
    first = make(root, tmp_path, seed=0)
    first.setup()
    monkeypatch.setattr(type(first), "decode", lambda self: (_ for _ in ()).throw(AssertionError("decoded twice")))
    again, other = make(root, tmp_path, seed=0), make(root, tmp_path, seed=1)
    again.setup()
    other.setup()
    assert torch.equal(again.train.images, first.train.images) and torch.equal(again.test.labels, first.test.labels)
    draws = [draw_writers(len(kept), s) for s in (0, 1)]
    assert set(np.concatenate(draws[0])) != set(np.concatenate(draws[1]))  # another trial, other writers
    for dm, (train_w, _, test_w) in ((first, draws[0]), (other, draws[1])):
        assert torch.bincount(dm.train.groups).tolist() == [len(writers[kept[w]]) for w in train_w]
        assert dm.test.labels.tolist() == [c for w in sorted(test_w) for c in writers[kept[w]]]


def test_train_test_layout_merges_each_writers_samples(tmp_path):
    writers = femnist_writers()
    write_leaf_femnist(tmp_path / "a" / "data", writers)
    write_leaf_femnist(tmp_path / "b" / "data", writers, layout="sample")
    assert (tmp_path / "b" / "data" / "train").is_dir() and not (tmp_path / "b" / "data" / "all_data").exists()
    whole = make(tmp_path / "a", tmp_path / "ca").decode()["writers"]
    merged = make(tmp_path / "b", tmp_path / "cb").decode()["writers"]
    assert torch.equal(torch.bincount(merged.groups), torch.bincount(whole.groups))
    assert sorted(merged.labels.tolist()) == sorted(whole.labels.tolist())


def test_femnist_errors(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="'femnist' not found at .*LEAF"):
        make(tmp_path / "absent", tmp_path).setup()
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match="no LEAF JSON files"):
        make(tmp_path / "empty", tmp_path).setup()
    write_leaf_femnist(tmp_path / "few" / "data", femnist_writers(num_small=20))
    with pytest.raises(DatasetNotFoundError, match="only 21 writers .*fewer than 150 samples; .* draws 50"):
        make(tmp_path / "few", tmp_path).setup()
    bad = tmp_path / "bad" / "data" / "all_data"
    bad.mkdir(parents=True)
    (bad / "all_data_0.json").write_text(json.dumps({"users": ["w"], "num_samples": [1],
                                                     "user_data": {"w": {"x": [[0.5] * 10], "y": [3]}}}))
    with pytest.raises(CorruptDataError, match="writer 'w' must have x of shape"):
        make(tmp_path / "bad", tmp_path).setup()
    (bad / "all_data_0.json").write_text('{"users": ["w"], "user_da')
    with pytest.raises(CorruptDataError, match="Cannot read LEAF file"):
        make(tmp_path / "bad", tmp_path).setup()


def test_one_client_per_writer_end_to_end(leaf, tiny_cfg):
    """A federated run on the natural partition: 35 clients, each one training writer."""
    root, writers = leaf
    cfg = tiny_cfg(**{"data.name": "femnist", "data.root": str(root), "data.image_size": 12,
                      "partition.scheme": "natural", "partition.num_clients": 35, "fed.rounds": 1,
                      "fed.sample_ratio": 0.1, "fed.batch_size": 8})
    record, _ = run_in_process(cfg)
    kept = sorted(w for w, y in writers.items() if len(y) < 150)
    train_w, _, test_w = draw_writers(len(kept), cfg.seed)
    assert record["partition"]["num_clients"] == 35
    assert record["partition"]["sizes"] == [len(writers[kept[w]]) for w in train_w]
    assert record["splits"]["test"] == sum(len(writers[kept[w]]) for w in test_w)
    assert record["num_classes"] == 62 and record["class_names"][36] == "lowercase letter a"
    assert 0.0 <= record["final"]["test/accuracy"] <= 100.0
