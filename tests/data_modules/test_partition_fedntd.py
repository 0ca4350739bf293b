"""FedNTD's partitions (FST-CBDG's protocol) and FACMIC's quantity-skew split, on numbers."""
from __future__ import annotations

import numpy as np
import pytest

from bench.core.errors import PartitionError
from datamodules.partition import partition

BALANCED = np.repeat(np.arange(10), 600)  # 6,000 labels, 10 classes


def test_per_class_shards_are_whole_class_shards_dealt_from_a_multiset():
    p = partition(BALANCED, "shards", 20, seed=1, shards_per_client=3, shard_mode="per_class")
    # s * N / K = 6 shards of 100 per class: every client holds 3 shards = 300 samples, whole shards only
    assert p.sizes() == [300] * 20
    assert (p.class_counts % 100 == 0).all()
    assert ((p.class_counts > 0).sum(axis=1) <= 3).all()
    assert (p.class_counts.sum(axis=0) == 600).all()
    assert p.options["shard_mode"] == "per_class"
    # the labels are dealt from a multiset: over seeds some client is dealt one class twice (FedNTD does
    # not prevent it), which McMahan's sorted shards of exactly one class each would also allow, but a
    # shard never straddles two classes here, unlike sorted shards of 110 samples
    twice = [(partition(BALANCED, "shards", 20, seed=s, shards_per_client=3, shard_mode="per_class")
              .class_counts >= 200).any() for s in range(10)]
    assert any(twice)
    sorted_shards = partition(BALANCED, "shards", 20, seed=1, shards_per_client=3)
    assert sorted_shards.class_counts.sum() == 6000


def test_per_class_shards_with_leftover_spread_one_per_shard():
    labels = np.repeat(np.arange(4), [41, 40, 40, 43])  # 4 shards per class (s=2, N=8, K=4)
    p = partition(labels, "shards", 8, seed=0, shards_per_client=2, shard_mode="per_class")
    sizes = {int(v) for v in p.class_counts.ravel() if v}
    # shards of 10 (and 11 for the classes with a leftover): a client's count of a class is a sum of them
    assert sizes <= {10, 11, 20, 21, 22}
    assert p.class_counts.sum() == len(labels)


def test_per_class_shards_need_s_times_n_divisible_by_k():
    with pytest.raises(PartitionError, match="multiple of K"):
        partition(BALANCED, "shards", 7, seed=0, shards_per_client=3, shard_mode="per_class")
    with pytest.raises(PartitionError, match="partition.args.shard_mode of the 'shards' scheme must be one of"):
        partition(BALANCED, "shards", 10, seed=0, shard_mode="by-label")


def test_lda_gives_full_clients_a_zero_share_and_cuts_by_floor():
    labels = np.repeat(np.arange(10), np.arange(1, 11) * 100)  # imbalanced classes, 5,500 samples
    n, clients = len(labels), 20
    p = partition(labels, "lda", clients, seed=4, beta=0.1, min_size=10)
    assert min(p.sizes()) >= 10 and p.options["beta"] == 0.1
    held = np.zeros(clients, dtype=np.int64)
    for c in range(10):
        shares = p.proportions[c]
        # a client holding >= n / N samples before class c takes none of it; the shares still sum to 1
        assert (shares[held >= n / clients] == 0).all()
        assert shares.sum() == pytest.approx(1.0)
        n_c = int((labels == c).sum())
        cuts = np.concatenate([[0], (np.cumsum(shares) * n_c).astype(np.int64)[:-1], [n_c]])
        assert np.array_equal(p.class_counts[:, c], np.diff(cuts))
        held += p.class_counts[:, c]
    # the cap bites at this alpha: at least one class found some client already full
    assert any((p.proportions[c] == 0).any() for c in range(1, 10))


def test_lda_redraws_until_min_size_and_is_deterministic():
    labels = np.repeat(np.arange(10), 2000)  # 200 per client on average
    a = partition(labels, "lda", 100, seed=2, beta=0.1, min_size=10)
    b = partition(labels, "lda", 100, seed=2, beta=0.1, min_size=10)
    assert min(a.sizes()) >= 10
    assert all(np.array_equal(x, y) for x, y in zip(a.client_indices, b.client_indices, strict=True))
    # at alpha 0.05 the 10-sample floor is out of reach (the zero share for full clients concentrates each
    # class on the few clients still open): one clear error after max_tries draws, not an endless loop
    with pytest.raises(PartitionError, match="No LDA partition"):
        partition(labels, "lda", 100, seed=2, beta=0.05, min_size=10, max_tries=20)


def test_proportions_cut_every_class_by_the_same_vector():
    labels = np.repeat(np.arange(9), [114, 376, 95, 438, 357, 462, 77, 181, 139])  # SC's 2,239 training images
    sc_alpha_03 = [0.09358517, 0.61603834, 0.29037648]  # FACMIC's datasplit.py, SC at alpha 0.3
    p = partition(labels, "proportions", 3, seed=0, proportions=sc_alpha_03)
    for c in range(9):
        n_c = int((labels == c).sum())
        cuts = np.concatenate([[0], np.round(np.cumsum(sc_alpha_03)[:-1] * n_c), [n_c]]).astype(np.int64)
        assert np.array_equal(p.class_counts[:, c], np.diff(cuts))
    # quantity skew with identical class ratios: Table 1's SC sizes (218, 1374, 647) to within 1% of the total
    assert np.abs(np.array(p.sizes()) - [218, 1374, 647]).max() <= 0.01 * len(labels)
    with pytest.raises(PartitionError, match="one per\nclient|one per client"):
        partition(labels, "proportions", 3, seed=0, proportions=[0.5, 0.5])
