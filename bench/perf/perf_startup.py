"""`make bench-startup`: how soon each command of issue 41's table answers, and whether it is within its limit.

Each command runs as its own process (the installed ``fedbench`` beside this Python, else ``python -m
bench.cli``), ``--repeats`` times; the median of each measure is reported:

- wall: from start to exit; first: from start to its first line of output (``run`` and ``table``, which say
  what they are about to do before importing the training stack);
- cpu: user + sys seconds of the process (``getrusage`` of the children), and ``cpu_ratio``: that against one
  ``python -c "import torch"`` measured in the same conditions (load-independent).

Limits: help, argument errors, ``list`` and ``coverage`` exit within 1.5 s wall; ``run`` and ``table`` print
their first line within 2 s. A quiet machine is assumed for these: on a busy one, read the CPU ratios.
``--cheap`` (tests/commands/test_startup.py) runs the import-free commands once and checks only their CPU ratios (help,
errors, list: at most 0.5 of importing torch; coverage, which plans every table: at most 1.0); the commands that
start a run or a table are left out.

    python -m bench.perf.perf_startup [--repeats 3] [--cheap] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.core.paths import REPO_ROOT

QUICK = "configs/experiments/quick.yaml"
TABLE = "configs/tables/table2_fashion-mnist.yaml"
WALL_LIMIT, FIRST_LINE_LIMIT = 1.5, 2.0
# (what, argv after `fedbench`, the limit's measure, max CPU ratio against importing torch (None: not in --cheap))
COMMANDS = [
    ("fedbench --help", ["--help"], "wall", 0.5),
    ("fedbench run --help", ["run", "--help"], "wall", 0.5),
    ("fedbench table --help", ["table", "--help"], "wall", 0.5),
    ("fedbench list", ["list"], "wall", 0.5),
    ("fedbench coverage", ["coverage"], "wall", 1.0),
    ("a typo in a run option", ["run", "--fed.roundz", "3"], "wall", 0.5),
    ("fedbench run, 1 round, simple CNN, 1 rank", ["run", "--config", QUICK, "--fed.rounds", "1", "--devices", "1",
                                                   "--output-dir", "{tmp}"], "first", None),
    ("fedbench table (first line)", ["table", "--config", TABLE, "--output-dir", "{tmp}"], "first", None),
]


def command_prefix() -> list[str]:
    script = Path(sys.executable).with_name("fedbench")
    return [str(script)] if script.exists() else [sys.executable, "-m", "bench.cli"]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(argv: list[str], stop_after_first_line: bool = False) -> dict[str, float]:
    """One run of ``argv``: wall, first (seconds to its first line), cpu (user + sys)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    cpu0, t0 = children_cpu(), time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    proc.stdout.readline()
    first = time.perf_counter() - t0
    if stop_after_first_line:
        proc.terminate()
    proc.stdout.read()
    proc.wait()
    return {"wall": time.perf_counter() - t0, "first": first, "cpu": children_cpu() - cpu0}


def median_of(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def torch_import() -> dict[str, float]:
    return measure([sys.executable, "-c", "import torch"])


def run_all(repeats: int, cheap: bool) -> dict:
    prefix, out = command_prefix(), []
    baseline = median_of([torch_import() for _ in range(repeats)])
    with tempfile.TemporaryDirectory(prefix="fedbench-startup-") as tmp:
        for what, argv, measure_by, max_ratio in COMMANDS:
            if cheap and max_ratio is None:
                continue
            argv = [a.format(tmp=tmp) for a in argv]
            m = median_of([measure(prefix + argv, stop_after_first_line=what.startswith("fedbench table ("))
                           for _ in range(repeats)])
            limit = WALL_LIMIT if measure_by == "wall" else FIRST_LINE_LIMIT
            row = {"command": what, **{k: round(v, 3) for k, v in m.items()}, "limit_s": limit,
                   "measured_by": measure_by, "cpu_ratio": round(m["cpu"] / baseline["cpu"], 3),
                   "max_cpu_ratio": max_ratio}
            row["within"] = row["cpu_ratio"] <= max_ratio if cheap else m[measure_by] <= limit
            out.append(row)
    return {"torch_import": {k: round(v, 3) for k, v in baseline.items()}, "repeats": repeats, "cheap": cheap,
            "load_1min": os.getloadavg()[0], "commands": out}


def show(result: dict) -> None:
    base = result["torch_import"]
    print(f"`import torch`: {base['wall']:.2f} s wall, {base['cpu']:.2f} s CPU; load average {result['load_1min']:.2f}; "
          f"median of {result['repeats']}")
    print(f"{'command':45s} {'wall':>7s} {'first':>7s} {'cpu':>7s} {'cpu/torch':>9s}  limit")
    for r in result["commands"]:
        limit = (f"cpu/torch <= {r['max_cpu_ratio']}" if result["cheap"] else f"{r['measured_by']} <= {r['limit_s']} s")
        print(f"{r['command']:45s} {r['wall']:7.2f} {r['first']:7.2f} {r['cpu']:7.2f} {r['cpu_ratio']:9.2f}  "
              f"{limit}{'' if r['within'] else '  OVER'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.perf.perf_startup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cheap", action="store_true", help="import-free commands once, CPU ratios only")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run_all(1 if args.cheap else args.repeats, args.cheap)
    print(json.dumps(result, indent=1)) if args.json else show(result)
    return 0 if all(r["within"] for r in result["commands"]) else 1


if __name__ == "__main__":
    sys.exit(main())
