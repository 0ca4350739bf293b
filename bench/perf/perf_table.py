"""`make bench-table2` (`fedbench bench --cases table2`): the offline table2's wall time with its
configured ranks (2 ranks x 1 thread, one run after another) against ``--jobs N`` (N runs at once, one
rank each), every run forced, each variant in a fresh process writing to a temporary folder. The two
rendered tables are compared with each other and with the committed one (results/tables/): a change of
how runs are laid out changes no number."""
from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.core.errors import FedbenchError
from bench.core.paths import REPO_ROOT
from bench.perf.perf_env import clean_env

TABLE2 = "configs/tables/table2_fashion-mnist.yaml"
COMMITTED = "results/tables/table2_fashion-mnist.md"


def table_lines(md: str) -> list[str]:
    """The rows of a rendered table (its number lines), without the title and notes."""
    return [line for line in md.splitlines() if line.startswith("|")]


def timed_table(config: str, extra: list[str], env: dict[str, str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fedbench-table2-") as out:
        cmd = [sys.executable, "-m", "bench.cli", "table", "--config", config, "--force", "--output-dir",
               f"{out}/runs", "--tables-dir", f"{out}/tables", *extra]
        before, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
        wall, after = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise FedbenchError(f"{' '.join(cmd[2:])} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        table = next(Path(out, "tables").glob("*.md")).read_text()
    return {"args": extra, "wall_s": wall, "user_s": after.ru_utime - before.ru_utime,
            "system_s": after.ru_stime - before.ru_stime, "table": table}


def table2_case(jobs: int = 2, config: str = TABLE2) -> dict[str, Any]:
    ranks = timed_table(config, [], clean_env({}))
    parallel = timed_table(config, ["--jobs", str(jobs)], clean_env({}))
    committed = REPO_ROOT / COMMITTED
    same_committed = (table_lines(ranks["table"]) == table_lines(committed.read_text())
                      if config == TABLE2 and committed.exists() else None)
    return {"config": config, "jobs": jobs, "configured_ranks": {k: v for k, v in ranks.items() if k != "table"},
            "jobs_run": {k: v for k, v in parallel.items() if k != "table"},
            "speedup": ranks["wall_s"] / parallel["wall_s"],
            "same_table": table_lines(ranks["table"]) == table_lines(parallel["table"]),
            "same_as_committed": same_committed}


def print_table2(r: dict) -> None:
    a, b = r["configured_ranks"], r["jobs_run"]
    print(f"Offline table2 ({r['config']}), every run forced: configured ranks {a['wall_s'] / 60:.1f} min "
          f"(user {a['user_s']:.0f} s, system {a['system_s']:.0f} s); --jobs {r['jobs']} {b['wall_s'] / 60:.1f} min "
          f"(user {b['user_s']:.0f} s, system {b['system_s']:.0f} s): x{r['speedup']:.2f}; "
          f"rendered tables {'identical' if r['same_table'] else 'DIFFER'}"
          + ("" if r.get("same_as_committed") is None else
             f"; {'identical to' if r['same_as_committed'] else 'DIFFERENT FROM'} the committed {COMMITTED}"))
