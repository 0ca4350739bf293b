"""Partition schemes are registered by name (one file each, datamodules/partitions/) and partition()
dispatches through the registry; datamodules computes partitions and draws none (no matplotlib)."""
from __future__ import annotations

import ast
import importlib.util
import re

import numpy as np
import pytest
from conftest import REPO

from bench.core.code_version import imported_modules, module_name
from datamodules.partition import SCHEMES, partition

BUILT_IN = {"iid", "dirichlet", "dirichlet_missing", "shards", "lda", "proportions", "natural"}
LABELS = np.repeat(np.arange(5), 40)


@pytest.fixture
def registry(monkeypatch):
    """The scheme registry, restored after the test (a scheme registered here does not leak)."""
    from datamodules.partitions import PARTITION_SCHEMES

    PARTITION_SCHEMES.names()  # load the built-in schemes first
    monkeypatch.setattr(PARTITION_SCHEMES, "_items", dict(PARTITION_SCHEMES._items))
    return PARTITION_SCHEMES


def test_every_built_in_scheme_is_registered_from_its_own_file(registry):
    assert set(registry.names()) == BUILT_IN
    assert set(SCHEMES) == BUILT_IN
    for name in BUILT_IN:
        scheme = registry.get(name)
        assert scheme.registry_name == name
        assert scheme.__module__.startswith("datamodules.partitions.")
    files = {p.stem for p in (REPO / "datamodules" / "partitions").glob("*.py") if not p.stem.startswith("_")}
    assert files == {"iid", "dirichlet", "shards", "lda", "proportions", "natural"}


def test_a_scheme_registered_in_one_place_is_what_partition_runs(registry):
    from dataclasses import dataclass

    from bench.core.errors import PartitionError
    from datamodules.partitions import SchemeInput, SchemeOutput, takes

    seen = {}

    @dataclass(frozen=True)
    class Halves:
        min_size: int = 0

    @registry.register("halves")
    @takes(Halves)
    def halves(s: SchemeInput) -> SchemeOutput:
        seen["input"] = s
        order = s.rng.permutation(len(s.labels))
        return SchemeOutput([np.sort(part) for part in np.array_split(order, s.num_clients)], None, {"min_size": 3})

    p = partition(LABELS, "halves", 2, seed=5, min_size=3, num_classes=6)
    expected = np.array_split(np.random.default_rng(5).permutation(len(LABELS)), 2)
    assert all(np.array_equal(a, np.sort(b)) for a, b in zip(p.client_indices, expected, strict=True))
    assert p.scheme == "halves" and p.options == {"seed": 5, "min_size": 3}
    assert p.class_counts.shape == (2, 6) and p.class_counts.sum() == len(LABELS)
    s = seen["input"]
    assert s.num_clients == 2 and s.num_classes == 6 and s.options == Halves(3) and s.labels.dtype == np.int64
    assert "halves" in registry.names()
    partition(LABELS, "halves", 2, seed=5)
    assert seen["input"].options == Halves(0)  # an option not given: its default
    with pytest.raises(PartitionError, match=r"'halves' scheme has unknown option\(s\) \['beta'\]; 'halves' takes: "
                                             r"min_size \(int\)"):
        partition(LABELS, "halves", 2, seed=5, beta=0.5)


def test_the_documented_example_scheme_is_one_file_that_runs_as_written(registry, tmp_path):
    import datamodules.partitions as package

    example = re.search(r"::\n\n(.*?)\n\nThe built-in", package.__doc__, re.DOTALL).group(1)
    path = tmp_path / "round_robin.py"
    path.write_text(re.sub(r"(?m)^    ", "", example) + "\n")
    spec = importlib.util.spec_from_file_location("round_robin", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    p = partition(LABELS, "round-robin", 4, seed=0)
    assert sorted(np.concatenate(p.client_indices).tolist()) == list(range(len(LABELS)))
    assert p.sizes() == [50, 50, 50, 50]
    shifted = partition(LABELS, "round-robin", 4, seed=0, offset=1)  # its option moves every client's samples
    assert shifted.sizes() == [50, 50, 50, 50] and not np.array_equal(shifted.client_indices[0], p.client_indices[0])


def test_an_unknown_scheme_names_the_registered_ones(registry):
    from bench.core.errors import PartitionError

    with pytest.raises(PartitionError, match="Choose one of: dirichlet, dirichlet_missing, iid, lda"):
        partition(LABELS, "dirichle", 2, seed=0)


def test_partition_has_no_if_elif_on_scheme_names():
    tree = ast.parse((REPO / "datamodules" / "partition.py").read_text())
    compared = [node for node in ast.walk(tree) if isinstance(node, ast.Compare)
                and any(isinstance(c, ast.Constant) and c.value in BUILT_IN for c in [node.left, *node.comparators])]
    assert not compared, [ast.unparse(n) for n in compared]


@pytest.mark.parametrize("package", ["datamodules", "lightning_modules"])
def test_no_matplotlib_below_bench(package):
    """Drawing is the reporting side's (bench/assembly/partition_plot.py); datamodules and lightning_modules draw nothing."""
    drawing = [module_name(path, REPO) for path in sorted((REPO / package).rglob("*.py"))
               if any(m == "matplotlib" or m.startswith("matplotlib.")
                      for m in imported_modules(path, module_name(path, REPO)))]
    assert drawing == []
