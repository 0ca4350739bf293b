"""The code version a run record was computed with: a hash of the sources that determine results.

A table rerun skips a run only when its record has the same result-config and the same code
version. The version hashes the contents of every ``*.py`` file under ``lightning_modules/`` and
``datamodules/`` and of ``bench/`` minus the modules that only report or orchestrate tables
(``REPORTING``): editing the table renderer, the plots, W&B logging or the CLI does not invalidate
records, while any change to a method, a loader, the partitioner or the round loop does. Content
hashing (not the git commit) means an unrelated commit keeps records valid and uncommitted edits
count.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bench", "lightning_modules", "datamodules")
REPORTING = frozenset({"bench/tables.py", "bench/plots.py", "bench/table_runner.py", "bench/cli.py",
                       "bench/wandb_logger.py", "bench/regression.py", "bench/paper_numbers.py",
                       "bench/perf.py", "bench/perf_clip.py", "bench/code_version.py", "bench/coverage.py",
                       "bench/columns.py", "bench/protocols.py", "bench/paper_compare.py"})


def source_files(root: Path = REPO_ROOT) -> list[Path]:
    files = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel not in REPORTING and "__pycache__" not in rel:
                files.append(path)
    return files


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
