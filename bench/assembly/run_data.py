"""The run's data: its datamodule (decoded, with a transfer test set), its partition into clients (with
the fix when a sample cap leaves too few), each client's training and test indices, the splits on the device,
and where the partition's plot goes. Split out of bench/assembly/experiment.py, which assembles the run from it."""
from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from bench.assembly.config import RunConfig, flat_partition
from bench.core.batches import DeviceData
from bench.core.errors import FedbenchError, PartitionError
from bench.core.seeding import INIT, derive_seed
from bench.engine.federation import ClientSplit
from datamodules.base import DATASETS, FederatedDataModule
from datamodules.data_home import data_home
from datamodules.partition import partition
from datamodules.splits import stratified_split, stratified_subset
from datamodules.tensors import TensorSplit


def partition_of(cfg: RunConfig, labels: np.ndarray, groups: np.ndarray | None):
    p = cfg.partition
    return partition(labels, p.scheme, p.num_clients, cfg.seed, groups=groups, **p.args)



def run_partition(cfg: RunConfig, dm: FederatedDataModule):
    """The run's partition of dm's training split. When data.max_train_samples kept too few samples for
    it, the error says so and names the smallest cap (of a geometric ladder from clients x min_size
    up) whose partition succeeds."""
    groups = None if dm.train.groups is None else dm.train.groups.numpy()
    try:
        return partition_of(cfg, dm.train.labels.numpy(), groups)
    except PartitionError as err:
        cap = cfg.data.max_train_samples
        if not cap or groups is not None:
            raise
        works = smallest_working_cap(cfg)
        fix = (f"--data.max_train_samples {works} works (the smallest of clients x min_size x 1.25^k that does)" if works else
               "no cap up to the whole training split works: use fewer clients or a smaller partition.args.min_size")
        raise PartitionError(f"data.max_train_samples {cap} keeps {len(dm.train)} training samples, too few for "
                             f"this partition ({err}) {fix}.") from err



def smallest_working_cap(cfg: RunConfig) -> int | None:
    """The smallest data.max_train_samples in needed x 1.25^k (needed = clients x min_size) whose
    training split partitions without error, or None."""
    uncapped = copy.deepcopy(cfg)
    uncapped.data.max_train_samples = None
    dm = setup_datamodule(uncapped)  # the decode cache: no second decode
    full = dm.train.labels.numpy()
    min_size = flat_partition({"args": cfg.partition.args})["min_size"]  # 10 for a scheme without one
    cap = max(cfg.data.max_train_samples + 1, cfg.partition.num_clients * max(1, min_size))
    while cap < len(full):
        try:
            partition_of(cfg, full[stratified_subset(full, cap, dm.split_seed)], None)
            return cap
        except PartitionError:
            cap = int(cap * 1.25) + 1
    return None



def build_datamodule(cfg: RunConfig) -> FederatedDataModule:
    d = cfg.data
    return DATASETS.get(d.name)(root=d.root, image_size=d.image_size, cache_dir=d.cache_dir,
                               max_train_samples=d.max_train_samples, max_test_samples=d.max_test_samples,
                               val_fraction=d.val_fraction, run_seed=cfg.seed, client_split_file=d.client_split_file,
                               fold=d.fold, folds=d.folds)



def setup_datamodule(cfg: RunConfig) -> FederatedDataModule:
    """The run's datamodule, decoded. With ``data.test_dataset`` (transfer evaluation, FACMIC Table 5)
    the test split is every image of that dataset (read from ``data.test_root`` at the run's image
    size; it must have the same classes), and the run's own test split becomes its validation split:
    the model is selected on its own dataset's test images (best-val-acc: the round FACMIC's main.py
    saves, its best accuracy on the training dataset's test folder) and scored on the other dataset."""
    dm = build_datamodule(cfg)
    dm.setup()
    d = cfg.data
    if d.test_dataset:
        test_root = d.test_root
        if test_root and not Path(test_root).expanduser().is_absolute() and not Path(test_root).exists():
            test_root = str(data_home() / test_root)  # a relative test_root names a folder of the data home
        other = DATASETS.get(d.test_dataset)(root=test_root, image_size=dm.image_size, cache_dir=d.cache_dir)
        other.setup()
        if list(other.class_names) != list(dm.class_names) or other.in_channels != dm.in_channels:
            raise FedbenchError(f"data.test_dataset {d.test_dataset!r} has classes {list(other.class_names)} "
                                f"({other.in_channels} channels); the run trains on {list(dm.class_names)} "
                                f"({dm.in_channels}): a model can only be tested on the classes it was trained on.")
        splits = [other.train, other.val, other.test]
        dm.val = dm.test
        dm.test = TensorSplit(torch.cat([s.images for s in splits]), torch.cat([s.labels for s in splits]))
        dm.fingerprint = f"{dm.fingerprint}+{other.fingerprint}"
    return dm



def to_device(split: TensorSplit, dm: FederatedDataModule, device, dtype: torch.dtype = torch.float32) -> DeviceData:
    """The split on the device; its batches come out in ``dtype`` (the normalisation tensors' dtype)."""
    mean, std = dm.normalisation(device)
    return DeviceData(split.images.to(device), split.labels.to(device), mean.to(dtype), std.to(dtype),
                      origin=split.origin)



def site_test_splits(train: TensorSplit, test: TensorSplit, num_clients: int) -> list[np.ndarray]:
    """Each client's test samples under ``fed.client_test: site``: the test split's samples of its site
    (client c of the natural partition is the c-th site in sorted order, datamodules/partition.py)."""
    if train.groups is None or test.groups is None:
        raise PartitionError("fed.client_test site needs a site id for every train and test sample, which this "
                             "dataset does not give; use fed.client_test carved.")
    sites = np.unique(train.groups.numpy())
    if len(sites) != num_clients:
        raise PartitionError(f"fed.client_test site: {len(sites)} sites in the training data for {num_clients} "
                             "clients (the natural partition has one client per site).")
    test_groups = test.groups.numpy()
    out = []
    for c, site in enumerate(sites):
        idx = np.flatnonzero(test_groups == site)
        if len(idx) == 0:
            raise PartitionError(f"fed.client_test site: client {c} (site {site}) has no sample in the test split; "
                                 "use fed.client_test carved.")
        out.append(idx)
    return out



def client_splits(cfg: RunConfig, parts: list, train: TensorSplit, per_client: bool, device,
                  test: TensorSplit | None = None, test_data: DeviceData | None = None) -> list[ClientSplit]:
    """Each client's training indices and, for the per-client protocol, its own test split: carved from its
    training share (``fed.client_test: carved``) or the test split's samples of its site (``site``: ``test``
    gives the sites, ``test_data`` is the device split the indices refer to)."""
    out = []
    labels = train.labels.numpy()
    site_tests = None
    if per_client and cfg.fed.client_test == "site":
        if test is None or test_data is None:
            raise FedbenchError("fed.client_test site: the test split is needed to find each site's samples.")
        site_tests = site_test_splits(train, test, len(parts))
    for c, idx in enumerate(parts):
        if len(idx) == 0:
            raise PartitionError(f"Client {c} received no samples; use fewer clients or a larger partition.args.min_size.")
        if site_tests is not None:
            out.append(ClientSplit(torch.as_tensor(idx, device=device),
                                   torch.as_tensor(site_tests[c], device=device), test_data))
        elif per_client:
            f = cfg.fed.client_test_fraction
            tr, te = stratified_split(labels[idx], [1 - f, f], seed=derive_seed(cfg.seed, -1, c, INIT) % 2**32)
            if len(tr) == 0 or len(te) == 0:
                raise PartitionError(f"Client {c} has {len(idx)} samples: too few for a {1 - f:.0%}/{f:.0%} "
                                     "train/test split; raise partition.args.min_size.")
            out.append(ClientSplit(torch.as_tensor(idx[tr], device=device), torch.as_tensor(idx[te], device=device)))
        else:
            out.append(ClientSplit(torch.as_tensor(idx, device=device)))
    return out



def partition_plot_path(cfg: RunConfig) -> Path:
    """The client-by-class heatmap of a run's partition (it does not depend on the method)."""
    d = cfg.data
    parts = [d.name, d.root, d.max_train_samples, d.val_fraction, flat_partition(cfg.to_dict()["partition"]), cfg.seed]
    key = json.dumps(parts + ([d.client_split_file] if d.client_split_file else [])
                     + ([d.fold, d.folds] if d.fold is not None else []))
    name = cfg.run_name().split("_", 1)[1]  # the run name without the method
    return (Path(cfg.output_dir) / cfg.experiment / "partitions"
            / f"{name}_{hashlib.sha1(key.encode()).hexdigest()[:8]}.png")
