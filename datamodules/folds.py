"""Stratified K-fold cross-validation over a dataset's pool (``data.fold`` of ``data.folds``).

The pool is every decoded sample (train, val and test splits together). Each sample gets a fold
0..K-1: the samples are shuffled with ``seed``, ordered by (class, site), and dealt out round-robin
with one counter over the whole pool. Any contiguous run of a round-robin deal holds each fold within
one of the others, so every fold has the same number of samples of every class to within one, of every
(site, class) cell to within one (for data with sites, e.g. FedNPR's "80% for training and 20% for
testing" of each source, preserving its class ratio), and of samples overall to within one. Fold k's
test split is fold k, its training split the other K-1 folds; across the K folds every sample is
tested exactly once. The assignment depends only on the labels, the sites, K and the seed.
"""
from __future__ import annotations

import numpy as np
import torch

from bench.core.errors import FedbenchError
from datamodules.tensors import TensorSplit


def stratified_folds(labels: np.ndarray, folds: int, seed: int, groups: np.ndarray | None = None) -> np.ndarray:
    """The fold (0..folds-1) of every sample: stratified by class, and by site within a class when
    ``groups`` is given (module docstring)."""
    labels = np.asarray(labels)
    if folds < 2:
        raise FedbenchError(f"K-fold cross-validation needs at least 2 folds, got {folds}.")
    shuffled = np.random.default_rng(seed).permutation(len(labels))
    sites = np.zeros(len(labels), dtype=np.int64) if groups is None else np.asarray(groups)
    # primary key: class, then site, then the shuffled position (np.lexsort sorts by its last key first)
    order = shuffled[np.lexsort((np.arange(len(labels)), sites[shuffled], labels[shuffled]))]
    fold_of = np.empty(len(labels), dtype=np.int64)
    fold_of[order] = np.arange(len(labels)) % folds
    return fold_of


def pooled(splits: dict[str, TensorSplit]) -> TensorSplit:
    """Every sample of the decoded splits as one split (site ids kept when every split has them)."""
    parts = [splits[name] for name in ("train", "val", "test") if name in splits]
    groups = None
    if all(p.groups is not None for p in parts):
        groups = torch.cat([p.groups for p in parts])
    return TensorSplit(torch.cat([p.images for p in parts]), torch.cat([p.labels for p in parts]), groups)


def fold_split(pool: TensorSplit, fold: int, folds: int, seed: int) -> tuple[TensorSplit, TensorSplit]:
    """(train, test) of fold ``fold`` of ``folds``: test is that fold, train the other folds."""
    if not 0 <= fold < folds:
        raise FedbenchError(f"data.fold must be in 0..{folds - 1} (data.folds {folds}), got {fold}.")
    groups = None if pool.groups is None else pool.groups.numpy()
    fold_of = torch.from_numpy(stratified_folds(pool.labels.numpy(), folds, seed, groups))
    test = torch.nonzero(fold_of == fold).flatten()
    train = torch.nonzero(fold_of != fold).flatten()
    return pool.subset(train), pool.subset(test)
