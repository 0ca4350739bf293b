"""The environment of a measured child process, shared by the perf cases (perf.py, perf_round.py,
perf_table.py): this process's environment without allocator settings, so that each child sets its
own allocator policy."""
from __future__ import annotations

import os

from bench.core.allocator import GLIBC_ENV, OPT_OUT_ENV
from bench.core.paths import REPO_ROOT


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment without allocator settings, plus ``extra``; PYTHONPATH points here."""
    env = {k: v for k, v in os.environ.items() if k not in GLIBC_ENV and k != OPT_OUT_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return {**env, **extra}
