"""The test folders mirror the packages (docs/testing.md) and stay out of the way of real imports.

pytest's default "prepend" import mode puts tests/ on sys.path (tests/conftest.py's folder), so every test folder
is also an importable namespace package of its own name, found before the editable install's finder. A folder
named like a project package (``tests/datamodules``) hid the real one: every dataset but four went unregistered.
A folder named like a module some library probes for would make that library think it is installed."""
from __future__ import annotations

import subprocess
import sys
from collections import Counter

from conftest import REPO, TESTS

FOLDERS = sorted(d.name for d in TESTS.iterdir() if d.is_dir() and d.name != "__pycache__")


def test_no_test_folder_is_named_like_an_importable_module():
    probe = ("import importlib.util, sys; names = sys.argv[1:]; "
             "print(' '.join(n for n in names if importlib.util.find_spec(n) is not None))")
    # run from an empty folder with tests/ off sys.path: what an import of each name finds without the tests
    found = subprocess.run([sys.executable, "-c", probe, *FOLDERS, "bench", "datamodules"], cwd="/",
                           capture_output=True, text=True, check=True).stdout.split()
    assert found == ["bench", "datamodules"], f"test folders named like importable modules: {found[:-2]}"


def test_test_file_names_are_unique_across_the_folders():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, k in names.items() if k > 1] == []
    assert not list(TESTS.glob("test_*.py")), "a test file belongs in the folder of the package it tests"
    assert {"core", "data_modules", "methods", "engine", "assembly", "tables", "reporting", "tracking", "scheduling",
            "commands", "perf", "docs"} <= set(FOLDERS)
    assert (REPO / "tests" / "conftest.py").is_file()
