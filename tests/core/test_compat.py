"""bench/core/compat.py holds every use of a private torch or Lightning name: no other module of bench,
datamodules or lightning_modules uses one (read with ast: imports of private modules or names, and
attribute chains on an imported torch/Lightning module); each use checks the installed major version
against the tested ones, which pyproject.toml bounds and requirements.lock pins."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import REPO

from bench.core import compat
from bench.core.errors import FedbenchError

LIBRARIES = ("torch", "lightning", "lightning_fabric", "pytorch_lightning")
PACKAGES = ("bench", "datamodules", "lightning_modules")


def private(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


def library(dotted: str | None) -> bool:
    return bool(dotted) and dotted.split(".")[0] in LIBRARIES


def private_uses(path: Path) -> list[str]:
    """``line: name`` for each private torch/Lightning name the module uses."""
    tree = ast.parse(path.read_text())
    aliases: dict[str, str] = {}  # local name -> the library module or object it is bound to
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if library(a.name):
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                    out += [f"{node.lineno}: import {a.name}"] if private(a.name) else []
        elif isinstance(node, ast.ImportFrom) and library(node.module) and not node.level:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                full = f"{node.module}.{a.name}"
                out += [f"{node.lineno}: from {node.module} import {a.name}"] if private(full) else []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            chain = node.value
            while isinstance(chain, ast.Attribute):
                chain = chain.value
            if isinstance(chain, ast.Name) and chain.id in aliases:
                out.append(f"{node.lineno}: {ast.unparse(node)} ({aliases[chain.id]})")
    return out


def tree_uses(root: Path) -> dict[str, list[str]]:
    found = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel != "bench/core/compat.py" and (uses := private_uses(path)):
                found[rel] = uses
    return found


def test_no_module_but_compat_uses_a_private_torch_or_lightning_name():
    assert tree_uses(REPO) == {}
    text = "\n".join(p.read_text() for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")
                     if p.relative_to(REPO).as_posix() != "bench/core/compat.py")
    assert not re.search(r"from lightning\S*\._|from lightning\S* import _[a-zA-Z]|torch\._|c10d\._", text)


def test_the_check_finds_every_kind_of_use(tmp_path):
    """The uses the project had before compat.py (commit 3fda314), in each spelling."""
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "old.py").write_text(
        "import torch.distributed as dist\n"
        "from lightning.fabric.strategies.launchers import subprocess_script\n"
        "from torch.nn.modules.batchnorm import _BatchNorm\n"
        "class W(subprocess_script._ChildProcessObserver):\n    pass\n"
        "def f():\n"
        "    from lightning.fabric.loggers.tensorboard import _TENSORBOARD_AVAILABLE\n"
        "    subprocess_script._launch_process_observer = f\n"
        "    return dist.distributed_c10d._get_default_store(), _TENSORBOARD_AVAILABLE\n"
        "def g(self):\n    return self._private, dist.get_rank()\n")
    uses = tree_uses(tmp_path)["bench/old.py"]
    assert sorted(int(u.split(":")[0]) for u in uses) == [3, 4, 7, 8, 9]
    assert any("_get_default_store" in u for u in uses) and not any("self._private" in u for u in uses)


def test_every_private_name_resolves_in_the_installed_versions():
    compat.check()
    assert compat.batch_norm_base() is __import__("torch").nn.modules.batchnorm._BatchNorm
    assert compat.tensorboard_available() in (True, False)


def test_an_untested_major_version_is_one_clear_error(monkeypatch):
    compat.check_version.cache_clear()
    monkeypatch.setitem(compat.TESTED, "torch", (3, 3))  # as if torch 2.x were outside what was tested
    try:
        with pytest.raises(FedbenchError, match=r"tested with in torch 3\.x only; torch 2\.\S+ is installed: "
                                                r"install the tested versions \(pip install -r requirements\.lock\)"):
            compat.default_store()
        with pytest.raises(FedbenchError, match="torch 3.x"):
            compat.check()
    finally:
        compat.check_version.cache_clear()


def test_a_renamed_private_name_is_one_clear_error():
    with pytest.raises(FedbenchError, match=r"torch \S+ has no torch\.nn\.modules\.batchnorm\._Renamed, which "
                                            r"fedbench uses \(tested with torch 2\.x\)"):
        compat.private("torch", "torch.nn.modules.batchnorm", "_Renamed")


def test_a_run_checks_the_private_names_before_it_starts(monkeypatch, tiny_cfg):
    from bench.assembly.experiment import make_fabric

    compat.check_version.cache_clear()
    monkeypatch.setitem(compat.TESTED, "lightning", (3, 4))
    try:
        with pytest.raises(FedbenchError, match=r"lightning 3\.x to 4\.x only; lightning 2\."):
            make_fabric(tiny_cfg())
    finally:
        compat.check_version.cache_clear()


def test_pyproject_bounds_the_tested_majors_and_the_lock_is_within_them():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    locked = dict(line.split("==") for line in (REPO / "requirements.lock").read_text().splitlines()
                  if "==" in line and not line.startswith("#"))
    for dist, (low, high) in compat.TESTED.items():
        spec = next(d for d in deps if re.match(rf"{dist}[<>=]", d))
        assert f"<{high + 1}" in spec and int(re.search(r">=(\d+)", spec).group(1)) == low
        assert low <= int(locked[dist].split(".")[0]) <= high


def test_every_torchmetrics_extra_flag_skipped_is_one_torchmetrics_defines():
    """skip_torchmetrics_extras degrades to slower imports when a flag is renamed: this names the one gone."""
    import importlib.util

    source = Path(importlib.util.find_spec("torchmetrics").submodule_search_locations[0]) / "utilities" / "imports.py"
    defined = {t.id for node in ast.parse(source.read_text()).body if isinstance(node, ast.Assign | ast.AnnAssign)
               for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
    assert set(compat.TORCHMETRICS_EXTRAS) <= defined, sorted(set(compat.TORCHMETRICS_EXTRAS) - defined)


def test_torchmetrics_package_still_imports_the_skipped_top_names_only_if_package_available_says_so():
    """skip_unused_imports keeps scipy out of torchmetrics' own package by answering lightning_utilities'
    package_available("scipy") with False while it runs: this says when the package stops asking that way (the
    skip would then do nothing and the import be ~0.9 s slower again)."""
    import importlib.util

    source = Path(importlib.util.find_spec("torchmetrics").origin).read_text()
    asked = {node.args[0].value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
             and getattr(node.func, "id", None) == "package_available" and node.args
             and isinstance(node.args[0], ast.Constant)}
    assert set(compat.TORCHMETRICS_TOP_SKIPS) <= asked, sorted(set(compat.TORCHMETRICS_TOP_SKIPS) - asked)
    assert "from lightning_utilities.core.imports import package_available" in source


def test_timm_still_imports_the_skipped_names_only_in_a_try():
    """skip_timm_wandb makes timm's ``import wandb`` fail as if wandb were absent: safe only while timm catches
    that ImportError. This says when timm's summary module stops doing so (the skip would break its import)."""
    import importlib.util

    source = (Path(importlib.util.find_spec(compat.TIMM_PACKAGE).submodule_search_locations[0]) / "utils"
              / "summary.py").read_text()
    guarded = {alias.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Try)
               and any(getattr(h.type, "id", None) in ("ImportError", "ModuleNotFoundError") for h in node.handlers)
               for stmt in node.body if isinstance(stmt, ast.Import) for alias in stmt.names}
    assert set(compat.TIMM_SKIPS) <= guarded, sorted(set(compat.TIMM_SKIPS) - guarded)


@pytest.mark.slow  # a process of its own (about 5 s of imports): make test-fast leaves it out
def test_the_skips_last_only_while_torchmetrics_and_timm_import(tmp_path):
    """In a process of its own, after skip_unused_imports: importing Lightning leaves scipy, regex and matplotlib's
    pyplot unimported, and afterwards package_available answers as before (True for an installed scipy) and
    torchmetrics' own binding is the real function again; timm and open_clip import and build a model without
    importing wandb, which imports after (no skipping finder is left)."""
    script = (
        "import sys\n"
        "from bench.core.compat import skip_unused_imports\n"
        "skip_unused_imports()\n"
        "import lightning, torchmetrics\n"
        "import lightning_utilities.core.imports as imports\n"
        "print(sorted(m for m in ('scipy', 'regex', 'matplotlib.pyplot') if m in sys.modules),"
        " imports.package_available('scipy'), torchmetrics.package_available is imports.package_available, end=' ')\n"
        "import timm, open_clip\n"
        "net = timm.create_model('resnet18', pretrained=False, num_classes=0)\n"
        "print('wandb' in sys.modules, net.num_features, end=' ')\n"
        "import wandb\n"
        "print(wandb.__name__, not any(type(f).__name__ in ('_Absent', '_TimmWithoutSkips') for f in sys.meta_path))\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["[]", "True", "True", "False", "512", "wandb", "True"], proc.stdout


def test_with_the_extras_skipped_torchmetrics_still_scores_what_fedbench_asks():
    """In this pytest process conftest skipped the extras before Lightning came in: the flags read False, and
    the one torchmetrics function fedbench calls (multiclass_auroc, bench/engine/metrics.py) gives its hand-computed
    value. (That a run then imports no torchvision: tests/commands/test_startup.py, in a process of its own.)"""
    import torch
    import torchmetrics.utilities.imports as flags
    from torchmetrics.functional.classification import multiclass_auroc

    import bench.assembly.experiment  # noqa: F401 (Lightning, as a run imports it)

    assert not any(getattr(flags, name) for name in compat.TORCHMETRICS_EXTRAS)
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.2, 0.3], [0.2, 0.5, 0.3], [0.1, 0.3, 0.6]])
    # one-vs-rest AUROC by hand, the share of (positive, negative) pairs ranked right: class 0: 0.6 above
    # 0.5, 0.2, 0.1 (1.0); class 1: positives 0.2, 0.5 against negatives 0.3, 0.3: 2 of 4 pairs (0.5); class 2: 1.0
    auroc = multiclass_auroc(probs, torch.tensor([0, 1, 1, 2]), num_classes=3, average=None)
    assert torch.allclose(auroc, torch.tensor([1.0, 0.5, 1.0]), atol=1e-6), auroc
