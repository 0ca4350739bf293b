"""A wheel built from the tree (non-editable, offline) installs into a fresh virtual environment that sees
this environment's dependencies, and its `fedbench` works from another directory: `list`, and a one-round
digits run from the shipped configs/experiments/quick.yaml, stamped with the checkout's code version."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import REPO

from bench.core.code_version import code_version

pytestmark = pytest.mark.slow


def sh(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    """Run ``cmd`` without this checkout on the path (PYTHONPATH), by default."""
    kwargs.setdefault("env", {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")})
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False, timeout=900, **kwargs)
    assert done.returncode == 0, f"{cmd}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the wheel, the fresh venv's bin folder): the tree's files (git's tracked and not-ignored ones)
    copied, built into a wheel, installed into a venv whose only extra path is this environment's
    site-packages (a .pth line: the dependencies, not this checkout)."""
    root = tmp_path_factory.mktemp("install")
    listed = sh(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO).stdout.split("\0")
    for rel in filter(None, listed):
        if (REPO / rel).is_file():
            (root / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, root / "src" / rel)
    sh([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
        "-w", root / "wheel", root / "src"])
    wheel = next((root / "wheel").glob("fedbench-*.whl"))
    venv = root / "venv"
    sh([sys.executable, "-m", "venv", "--without-pip", venv])
    sh([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q", "--no-deps", "--no-index",
        wheel])  # before the .pth: through it pip would see this environment's fedbench as installed already
    purelib = Path(sh([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
                   .stdout.strip())
    assert (purelib / "bench" / "core" / "compat.py").is_file()
    (purelib / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return wheel, venv / "bin"


def elsewhere(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {"cwd": tmp_path, "env": {**env, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}}  # nothing of REPO


def test_the_wheel_holds_every_subpackage_the_configs_and_the_paper_numbers(installed):
    names = set(zipfile.ZipFile(installed[0]).namelist())
    tree = {p.relative_to(REPO).as_posix() for pkg in ("bench", "datamodules", "lightning_modules")
            for p in (REPO / pkg).rglob("*.py") if "__pycache__" not in p.parts}
    data = {p.relative_to(REPO).as_posix() for pattern in ("configs/**/*.yaml", "results/paper/*.json")
            for p in REPO.glob(pattern)}
    assert {"bench/core/compat.py", "bench/reporting/tables.py", "lightning_modules/components/npr.py",
            "datamodules/partitions/dirichlet.py"} <= tree
    assert "configs/experiments/quick.yaml" in data and "results/paper/fedbm.json" in data
    assert tree | data | {"bench/core/legacy_code_versions.json"} <= names
    assert not any("__pycache__" in n or n.startswith(("tests/", "results/reference", "docs/")) for n in names)


def test_the_installed_fedbench_lists_and_runs_from_another_directory(installed, tmp_path):
    bin_dir = installed[1]
    where = sh([bin_dir / "python", "-c", "import bench, datamodules.partitions; print(bench.__file__)"],
               **elsewhere(tmp_path)).stdout
    assert where.startswith(str(bin_dir.parent)) and str(REPO) not in where  # the wheel's code, not the checkout
    listing = sh([bin_dir / "fedbench", "list"], **elsewhere(tmp_path)).stdout
    assert "fedrs" in listing and "digits" in listing and "Partition schemes (7" in listing
    sh([bin_dir / "fedbench", "run", "--config", "configs/experiments/quick.yaml", "--fed.rounds", "1",
        "--devices", "1", "--progress", "false", "--data.cache-dir", tmp_path / "cache"], **elsewhere(tmp_path))
    [record_path] = (tmp_path / "results" / "runs" / "quick").glob("*.json")
    record = json.loads(record_path.read_text())
    assert record["config"]["fed"]["rounds"] == 1 and len(record["history"]) == 1
    assert record["method"] == "fedavg" and record["dataset"] == "digits"
    assert 0.0 <= record["final"]["test/accuracy"] <= 100.0
    assert record["code_version"] == code_version(record["config"])  # the same code: the same identity
