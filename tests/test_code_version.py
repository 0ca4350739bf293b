"""The code version hashes exactly the result-determining sources: bench/core, datamodules,
lightning_modules and the round core reached from bench.experiment; not reporting or the CLI."""
from __future__ import annotations

import shutil

import pytest
from conftest import REPO

from bench.code_version import compute_code_version, source_files

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

PACKAGES = ("bench", "datamodules", "lightning_modules")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A copy of the three packages, to edit."""
    root = tmp_path_factory.mktemp("tree")
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_hashed_files_are_the_packages_and_the_round_core(tree):
    hashed = {p.relative_to(tree).as_posix() for p in source_files(tree)}
    everything = {p.relative_to(tree).as_posix() for pkg in PACKAGES for p in (tree / pkg).rglob("*.py")}
    reporting = {f for f in everything if f.startswith("bench/reporting/")} | {"bench/cli.py"}
    assert "bench/reporting/tables.py" in reporting and "bench/reporting/wandb_logger.py" in reporting
    assert hashed == everything - reporting  # every bench/*.py but cli.py is reached from bench.experiment


@pytest.mark.parametrize(
    ("rel", "changes"),
    [
        ("bench/reporting/tables.py", False),
        ("bench/reporting/wandb_logger.py", False),
        ("bench/reporting/regression.py", False),
        ("bench/cli.py", False),
        ("lightning_modules/fedavg.py", True),  # a method
        ("lightning_modules/components/npr.py", True),
        ("datamodules/fashion_mnist.py", True),  # a loader
        ("datamodules/partition.py", True),
        ("bench/federation.py", True),  # the round core
        ("bench/aggregation.py", True),  # reached only through bench.federation
        ("bench/records.py", True),  # best/final metrics
        ("bench/core/seeding.py", True),
    ],
)
def test_editing_a_file_changes_the_version_unless_it_only_reports(tree, rel, changes):
    path = tree / rel
    original = path.read_text()
    before = compute_code_version(tree)
    try:
        path.write_text(original + "\n# an edit\n")
        assert (compute_code_version(tree) != before) == changes
    finally:
        path.write_text(original)
    assert compute_code_version(tree) == before
