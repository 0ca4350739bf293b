"""data.test_dataset: train on one dataset, test on every image of another (FACMIC Table 5: BT -> BT2)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import run_in_process
from PIL import Image

from bench.assembly.run_data import setup_datamodule
from bench.assembly.validation import validate_config
from bench.core.errors import FedbenchError

BT_DIRS = ["glioma_tumor", "meningioma_tumor", "no_tumor", "pituitary_tumor"]  # Bhuvaji et al. (BT)
BT2_DIRS = ["glioma", "meningioma", "notumor", "pituitary"]  # Nickparvar (BT2)


def write_split(base: Path, dirs: list[str], per_class: int, green: int) -> None:
    for label, name in enumerate(dirs):
        (base / name).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (18, 18), (40 + 50 * label, green, 60)).save(base / name / f"{i}.png")


@pytest.fixture
def brain(tmp_path):
    bt, bt2 = tmp_path / "bt", tmp_path / "bt2"
    write_split(bt / "Training", BT_DIRS, 12, green=0)
    write_split(bt / "Testing", BT_DIRS, 3, green=0)
    write_split(bt2 / "Training", BT2_DIRS, 5, green=200)
    write_split(bt2 / "Testing", BT2_DIRS, 2, green=200)
    return bt, bt2


def test_every_bt2_image_is_the_test_set_of_a_run_trained_on_bt(tiny_cfg, brain):
    bt, bt2 = brain
    cfg = tiny_cfg(**{"data.name": "brain-tumor", "data.root": str(bt), "data.image_size": 16,
                      "data.test_dataset": "brain-tumor", "data.test_root": str(bt2), "partition.num_clients": 2,
                      "partition.args.min_size": 2, "fed.rounds": 1, "fed.sample_ratio": 1.0, "fed.batch_size": 8})
    dm = setup_datamodule(cfg)
    assert len(dm.test) == 4 * (5 + 2)  # BT2's training and test folders, all of them
    assert torch.bincount(dm.test.labels).tolist() == [7, 7, 7, 7]
    assert torch.all(dm.test.images[:, 1].float().mean((1, 2)) > 150)  # BT2's pixels
    assert torch.all((dm.test.images[:, 0, 8, 8].long() - 40 - 50 * dm.test.labels).abs() <= 2)
    assert torch.all(dm.train.images[:, 1].float().mean((1, 2)) < 50)  # training stays on BT
    assert len(dm.val) == 12 and torch.all(dm.val.images[:, 1] < 50)  # BT's test folder selects the model
    assert cfg.run_name() == "fedavg_brain-tumor-on-brain-tumor_dir0.5_c2_s0"
    record, _ = run_in_process(cfg)
    assert record["splits"]["test"] == 28 and record["splits"]["val"] == 12
    assert {"val/accuracy", "test/accuracy"} <= set(record["history"][-1]["metrics"])


def test_test_dataset_must_have_the_training_classes(tiny_cfg, brain, tmp_path):
    bt, _ = brain
    sc = tmp_path / "sc"
    cfg = tiny_cfg(**{"data.name": "brain-tumor", "data.root": str(bt), "data.image_size": 16,
                      "data.test_dataset": "digits"})
    with pytest.raises(FedbenchError, match="only be tested on the classes it was trained on"):
        setup_datamodule(cfg)
    cfg = tiny_cfg(**{"data.test_root": str(sc)})
    with pytest.raises(FedbenchError, match="data.test_root is set but data.test_dataset is not"):
        validate_config(cfg)
