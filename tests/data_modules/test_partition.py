"""Partitioners: determinism, coverage, the Dirichlet draw, min-size guarantee, shards, sites, errors."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from bench.assembly.partition_plot import plot_partition
from bench.core.errors import PartitionError
from datamodules.partition import SCHEMES, partition

FMNIST_LIKE = np.repeat(np.arange(10), 600)  # 6,000 labels, 10 balanced classes
IMBALANCED = np.concatenate([np.full(n, c) for c, n in enumerate([500, 300, 120, 60, 20])])
GROUPS = np.arange(len(FMNIST_LIKE)) % 4


def _run(scheme: str, labels: np.ndarray = FMNIST_LIKE, seed: int = 3, **kw):
    kw.setdefault("groups", GROUPS if scheme == "natural" else None)
    if scheme == "proportions":
        kw.setdefault("proportions", [0.3, 0.2, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05])
    clients = 4 if scheme == "natural" else kw.pop("num_clients", 10)
    return partition(labels, scheme, clients, seed, **kw)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_sample_exactly_once_and_deterministic(scheme):
    p = _run(scheme)
    joined = np.concatenate(p.client_indices)
    assert np.array_equal(np.sort(joined), np.arange(len(FMNIST_LIKE)))
    assert all(np.all(np.diff(idx) > 0) for idx in p.client_indices)  # sorted, no duplicates
    again = _run(scheme)
    assert all(np.array_equal(a, b) for a, b in zip(p.client_indices, again.client_indices, strict=True))
    assert p.class_counts.sum() == len(FMNIST_LIKE)
    assert np.array_equal(p.class_counts, p.counts(FMNIST_LIKE, 10))
    record = json.loads(json.dumps(p.to_json()))
    assert record["scheme"] == scheme and sum(record["sizes"]) == len(FMNIST_LIKE)
    assert record["counts"] == p.class_counts.tolist()


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards", "dirichlet_missing"])
def test_seed_changes_partition(scheme):
    a, b = _run(scheme, seed=0), _run(scheme, seed=1)
    assert any(not np.array_equal(x, y) for x, y in zip(a.client_indices, b.client_indices, strict=True))


def test_iid_sizes_equal_and_classes_mixed():
    p = _run("iid", num_clients=7)
    assert max(p.sizes()) - min(p.sizes()) <= 1
    assert (p.class_counts > 0).all()
    assert p.proportions is None


def test_dirichlet_counts_are_the_rounded_draw():
    p = _run("dirichlet", IMBALANCED, beta=0.5, num_clients=6, min_size=1)
    assert p.proportions.shape == (5, 6)
    assert np.allclose(p.proportions.sum(axis=1), 1.0)
    for c, n_c in enumerate([500, 300, 120, 60, 20]):
        cuts = np.round(np.cumsum(p.proportions[c])[:-1] * n_c).astype(int)
        expected = np.diff(np.concatenate([[0], cuts, [n_c]]))
        assert np.array_equal(p.class_counts[:, c], expected)


def test_dirichlet_min_size_holds_at_small_beta():
    for seed in range(5):
        p = _run("dirichlet", seed=seed, beta=0.05, num_clients=10, min_size=10)
        assert min(p.sizes()) >= 10
        # beta = 0.05 is very skewed: a client's top class holds a large share (iid: ~0.1)
        share = p.class_counts.max(axis=1) / np.array(p.sizes())
        assert np.median(share) > 0.4


def test_dirichlet_min_size_redraws_deterministically():
    # with min_size=0 the first draw is kept; with a min_size the first one fails it, so a redraw happens
    first = _run("dirichlet", seed=11, beta=0.05, min_size=0)
    assert min(first.sizes()) < 10
    guaranteed = _run("dirichlet", seed=11, beta=0.05, min_size=10)
    assert min(guaranteed.sizes()) >= 10
    assert not np.allclose(first.proportions, guaranteed.proportions)
    again = _run("dirichlet", seed=11, beta=0.05, min_size=10)
    assert np.array_equal(guaranteed.proportions, again.proportions)


def test_num_classes_covers_absent_classes():
    p = partition(IMBALANCED, "dirichlet", 3, seed=0, min_size=1, num_classes=7)
    assert p.proportions.shape == (7, 3) and p.class_counts.shape == (3, 7)
    assert p.class_counts[:, 5:].sum() == 0
    with pytest.raises(PartitionError, match="num_classes is 4"):
        partition(IMBALANCED, "iid", 3, seed=0, num_classes=4)


def test_per_class_beta():
    p = _run("dirichlet", IMBALANCED, beta=[100.0, 100.0, 100.0, 100.0, 100.0], num_clients=4, min_size=1)
    # a huge beta spreads every class almost evenly
    assert np.abs(p.proportions - 0.25).max() < 0.1
    assert p.to_json()["beta"] == [100.0] * 5


def test_shards_aligned_give_at_most_two_classes():
    p = _run("shards", num_clients=10, shards_per_client=2)  # 20 shards of 300: one class each
    assert ((p.class_counts > 0).sum(axis=1) <= 2).all()
    assert p.sizes() == [600] * 10
    p3 = _run("shards", num_clients=20, shards_per_client=3)  # 60 shards of 100
    assert ((p3.class_counts > 0).sum(axis=1) <= 3).all()


def test_natural_is_groups():
    groups = np.array(["b", "a", "c", "a", "b", "c", "c", "a"])
    labels = np.array([0, 1, 0, 1, 0, 1, 0, 1])
    p = partition(labels, "natural", 3, seed=0, groups=groups)
    assert [idx.tolist() for idx in p.client_indices] == [[1, 3, 7], [0, 4], [2, 5, 6]]


def test_dirichlet_missing_drops_classes():
    p = _run("dirichlet_missing", beta=1.0, missing_prob=0.5, num_clients=10, min_size=10)
    present = p.class_counts > 0
    assert (~present).sum() >= 20  # ~half the (client, class) cells are empty
    assert present.any(axis=0).all()  # every class kept by some client
    assert (p.class_counts.T[p.proportions == 0] == 0).all()  # a dropped class gets no samples
    assert min(p.sizes()) >= 10
    none_missing = _run("dirichlet_missing", beta=1.0, missing_prob=0.0, num_clients=10)
    assert (none_missing.proportions > 0).all()


def test_dirichlet_missing_rate_tracks_missing_prob():
    rates = []
    for prob in (0.2, 0.7):
        p = _run("dirichlet_missing", beta=5.0, missing_prob=prob, num_clients=10, min_size=1)
        rates.append((p.proportions == 0).mean())
    assert 0.05 < rates[0] < 0.4 and 0.5 < rates[1] < 0.85


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scheme": "dirichlet", "beta": 0.0}, "beta must be > 0"),
        ({"scheme": "dirichlet", "beta": -1.0}, "beta must be > 0"),
        ({"scheme": "iid", "num_clients": 0}, "num_clients must be a positive integer"),
        ({"scheme": "iid", "num_clients": 7000}, "7000 clients but only 6000 samples"),
        ({"scheme": "dirichle"}, "Choose one of: dirichlet, dirichlet_missing, iid, lda, natural, proportions, shards."),
        ({"scheme": "natural", "num_clients": 4}, "needs a site id per sample"),
        ({"scheme": "natural", "num_clients": 5, "groups": GROUPS}, "Set --partition.num_clients 4"),
        ({"scheme": "shards", "num_clients": 4000, "shards_per_client": 2}, "8000 shards but only 6000"),
        ({"scheme": "dirichlet_missing", "missing_prob": 1.0}, "missing_prob must be in [0, 1)"),
        ({"scheme": "dirichlet", "min_size": 700}, "Use a smaller min_size or fewer clients"),
        ({"scheme": "dirichlet", "beta": [0.5, 0.5]}, "one per class (10)"),
        # a scheme takes only its own options (partition.args), each of its type
        ({"scheme": "iid", "beta": 0.5}, ("partition.args for the 'iid' scheme has unknown option(s) ['beta']; "
                                         "'iid' takes: no options.")),
        ({"scheme": "lda", "shard_mode": "per_class"}, "'lda' takes: beta (float), min_size (int)."),
        ({"scheme": "shards", "shard_mode": "diagonal"},
         "partition.args.shard_mode of the 'shards' scheme must be one of ['sorted', 'per_class'], got 'diagonal'."),
        ({"scheme": "lda", "beta": [0.1, 0.2]}, "partition.args.beta of the 'lda' scheme must be float, got [0.1, 0.2]."),
    ],
)
def test_errors(kwargs, message):
    kwargs = {"num_clients": 10, **kwargs}
    with pytest.raises(PartitionError) as err:
        partition(FMNIST_LIKE, kwargs.pop("scheme"), kwargs.pop("num_clients"), 0, **kwargs)
    assert message in str(err.value)


def test_min_size_unreachable_suggests_fixes():
    with pytest.raises(PartitionError) as err:
        partition(FMNIST_LIKE, "dirichlet", 50, 0, beta=0.01, min_size=100, max_tries=20)
    msg = str(err.value)
    for part in ("in 20 draws", "larger beta", "fewer clients", "smaller min_size"):
        assert part in msg


def test_plot_partition_writes_png(tmp_path):
    p = _run("dirichlet", beta=0.3)
    out = tmp_path / "plots" / "partition.png"
    plot_partition(p.class_counts, out, [f"class {i}" for i in range(10)], title="dir 0.3")
    with Image.open(out) as img:
        assert img.format == "PNG" and img.size[0] > 200 and img.size[1] > 200
    assert [f.name for f in out.parent.iterdir()] == ["partition.png"]  # no temporary left behind


def test_a_partition_drawn_again_is_written_from_the_first_drawing(tmp_path, monkeypatch):
    """plot_partition keeps the last MEMO_SIZE PNGs by what they show: the same counts, names and title are drawn
    once and written byte for byte again; another title or other counts are drawn anew; the oldest goes first."""
    from bench.assembly import partition_plot

    monkeypatch.setattr(partition_plot, "_drawn", type(partition_plot._drawn)())
    monkeypatch.setattr(partition_plot, "MEMO_SIZE", 2)
    drawn = []
    real = partition_plot.heatmap_png
    monkeypatch.setattr(partition_plot, "heatmap_png", lambda *a: drawn.append(a[2]) or real(*a))
    counts = _run("dirichlet", beta=0.3).class_counts
    names = [f"class {i}" for i in range(10)]
    plot_partition(counts, tmp_path / "a.png", names, title="one")
    plot_partition(counts.copy(), tmp_path / "b.png", list(names), title="one")
    assert drawn == ["one"] and (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    plot_partition(counts, tmp_path / "c.png", names, title="two")
    plot_partition(counts + 1, tmp_path / "d.png", names, title="two")
    assert drawn == ["one", "two", "two"] and (tmp_path / "c.png").read_bytes() != (tmp_path / "a.png").read_bytes()
    plot_partition(counts, tmp_path / "e.png", names, title="one")  # pushed out by the two after it
    assert drawn == ["one", "two", "two", "one"] and (tmp_path / "e.png").read_bytes() == (tmp_path / "a.png").read_bytes()
    with pytest.raises(ValueError, match="3 class names for 10 columns"):
        plot_partition(counts, tmp_path / "f.png", names[:3], title="one")
    assert not (tmp_path / "f.png").exists()
