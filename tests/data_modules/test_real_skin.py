"""FACMIC's Real dataset (RealSkin): three source folders as natural clients, a global test folder."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from official_layouts import write_real_skin

from bench.core.errors import DatasetNotFoundError
from datamodules.partition import partition
from datamodules.real_skin import RealSkin, client_cut

PER_CLASS = {"client_0": 3, "client_1": 6, "client_2": 4, "client_3": 2}


def build_real(tmp: Path) -> Path:
    write_real_skin(tmp / "data" / "RealSkin", PER_CLASS)  # the official layout (HAM10000's folders by code)
    return tmp / "data"


def test_real_skin_reads_facmics_folders_as_three_natural_clients_and_a_global_test(tmp_path):
    dm = RealSkin(root=str(build_real(tmp_path)), image_size=16, cache_dir=str(tmp_path / "cache"))
    dm.setup()
    sizes = {name: 7 * n for name, n in PER_CLASS.items()}
    n_train = [int(0.8 * sizes[f"client_{c}"]) for c in range(3)]
    assert len(dm.train) == sum(n_train) == 16 + 33 + 22
    assert len(dm.val) == sum(int(0.1 * sizes[f"client_{c}"]) for c in range(3)) == 2 + 4 + 2
    assert len(dm.test) == 14  # the whole client_3 folder
    assert torch.bincount(dm.train.groups).tolist() == n_train
    # every decoded pixel carries its class and client: labels follow the paper's class order
    for split, clients in ((dm.train, dm.train.groups), (dm.test, torch.full((14,), 3))):
        red, green = split.images[:, 0, 8, 8].long(), split.images[:, 1, 8, 8].long()
        assert torch.all((red - 20 - 30 * split.labels).abs() <= 3)
        assert torch.all((green - 40 * clients).abs() <= 3)
    assert torch.bincount(dm.test.labels).tolist() == [2] * 7
    # the natural partition gives one client per source, with that source's 80% part
    part = partition(dm.train.labels.numpy(), "natural", 3, 0, groups=dm.train.groups.numpy())
    assert [len(i) for i in part.client_indices] == n_train
    assert all(set(dm.train.groups[torch.from_numpy(i)].tolist()) == {c} for c, i in enumerate(part.client_indices))


def test_client_cut_is_facmics_8_1_1_without_overlap():
    tr, va = client_cut(1971)
    assert (len(tr), len(va)) == (1576, 197)
    assert len(np.intersect1d(tr, va)) == 0 and np.array_equal(client_cut(1971)[0], tr)


def test_real_skin_missing_test_folder_says_what_to_build(tmp_path):
    root = build_real(tmp_path)
    for f in (root / "RealSkin" / "client_3").rglob("*.jpg"):
        f.unlink()
    for d in sorted((root / "RealSkin" / "client_3").iterdir()):
        d.rmdir()
    (root / "RealSkin" / "client_3").rmdir()
    with pytest.raises(DatasetNotFoundError, match="client_3.*RealSkin folders"):
        RealSkin(root=str(root), image_size=16, cache_dir=str(tmp_path / "cache")).setup()
