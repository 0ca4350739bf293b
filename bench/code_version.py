"""The code version a run record was computed with: a hash of the sources that determine results.

A table rerun skips a run only when its record has the same result-config and the same code
version. The version hashes (relative path, contents) of

- every module of ``bench/core``, ``datamodules`` and ``lightning_modules`` (the dataset and method
  registries import those packages wholesale), and
- every module in the static import closure of ``bench.experiment``: the imports of each file,
  module- and function-level, read with ``ast`` and followed within this repository. That is the
  round core (``bench/*.py``) and nothing above it.

``bench/reporting`` (tables, plots, W&B, the table and regression runners, benchmarks) and
``bench/cli.py`` sit above the round core (tests/test_layering.py), so they are outside the closure
by construction: editing them does not invalidate records, while any change to a method, a loader,
the partitioner or the round loop does. Content hashing (not the git commit) means an unrelated
commit keeps records valid and uncommitted edits count.
"""
from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

from bench.core.paths import REPO_ROOT

WHOLE_PACKAGES = ("bench/core", "datamodules", "lightning_modules")
ENTRY = "bench.experiment"


def module_name(path: Path, root: Path) -> str:
    """``bench/core/errors.py`` -> ``bench.core.errors``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_path(name: str, root: Path) -> Path | None:
    """The file of module ``name`` under ``root``, or None (a third-party module, or not a module)."""
    base = root.joinpath(*name.split("."))
    for path in (base.with_name(base.name + ".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imported_modules(path: Path, module: str) -> set[str]:
    """Every module the source file of ``module`` imports, at module or function level (relative
    imports resolved); ``from a import b`` yields ``a`` and ``a.b`` (b may be a submodule)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def source_files(root: Path = REPO_ROOT) -> list[Path]:
    """The result-determining sources: the whole packages plus the import closure of ENTRY (and the
    ``__init__.py`` of every package on the way), sorted by relative path."""
    todo = [path for pkg in WHOLE_PACKAGES for path in (root / pkg).rglob("*.py")]
    todo.append(module_path(ENTRY, root))
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path is None or path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path, module_name(path, root)):
            parts = name.split(".")
            todo.extend(module_path(".".join(parts[:i]), root) for i in range(1, len(parts) + 1))
    return sorted(seen, key=lambda p: p.relative_to(root).as_posix())


def compute_code_version(root: Path = REPO_ROOT) -> str:
    """12 hex digits of the SHA-1 over (relative path, contents) of the result-determining sources."""
    digest = hashlib.sha1()
    for path in source_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


@functools.cache
def code_version() -> str:
    """The current checkout's code version (computed once per process)."""
    return compute_code_version()
