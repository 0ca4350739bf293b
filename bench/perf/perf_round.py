"""The per-round case of issue 19 (`make bench-round`, or `fedbench bench --cases round`): FedAvg on the
full Fashion-MNIST (54,000 training images, 6,000 validation, 10,000 test), 10 clients, Dirichlet 0.1,
50% sampled per round, 1 local epoch, batch 32, SGD lr 0.01, ResNet-18 at 28 px with a 1-channel stem,
3 rounds, with the defaults `fedbench run` gives on this machine (devices auto).

It runs `fedbench run` in a fresh process and reads the record: per round, training seconds (until
the slowest rank reaches the all-reduce), evaluation seconds, the rest, samples/s and each rank's idle
time at the all-reduce; for the whole run, user and system CPU time and page faults summed over the
ranks (the record's ``execution.cpu``: each rank's own getrusage, gathered at the end of the run).
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.core.errors import FedbenchError
from bench.core.paths import REPO_ROOT
from bench.perf.perf_env import clean_env

# per-round seconds of the peer suites on the 2-core machine, and the goal as a fraction of them
PEER_ROUND_SECONDS = {"FL-bench": 65.24, "PFLlib": 86.31}
GOAL_FRACTION = {"FL-bench": 0.75, "PFLlib": 0.55}
CASE = ["--data.name", "fashion-mnist", "--partition.scheme", "dirichlet", "--partition.num_clients", "10",
        "--partition.args", "{beta: 0.1}", "--fed.sample_ratio", "0.5", "--fed.local_epochs", "1", "--fed.batch_size", "32",
        "--method.name", "fedavg", "--method.backbone", "resnet18", "--method.optimizer", "sgd", "--method.lr", "0.01",
        "--seed", "0", "--experiment", "bench-round", "--progress", "false"]


def run_usage(record: dict) -> dict[str, float]:
    """CPU seconds and page faults of the run, summed over its ranks."""
    cpu = record["execution"]["cpu"]
    return {"user_s": sum(cpu["user_seconds"]), "system_s": sum(cpu["system_seconds"]),
            "minor_faults": int(sum(cpu["minor_faults"])), "major_faults": int(sum(cpu["major_faults"]))}


def round_rows(record: dict) -> list[dict[str, Any]]:
    splits = record["splits"]
    rows = []
    for h in record["history"]:
        train = max(h.get("rank_busy_seconds") or [h["train_seconds"]])
        evaluated = splits["val"] * any(k.startswith("val/") for k in h["metrics"]) \
            + splits["test"] * any(k.startswith("test/") for k in h["metrics"])
        rows.append({"round": h["round"], "clients": h["clients"], "samples": h["samples_trained"],
                     "training_s": train, "evaluation_s": h.get("eval_seconds", 0.0),
                     "other_s": h["round_seconds"] - train - h.get("eval_seconds", 0.0),
                     "total_s": h["round_seconds"], "samples_per_s": h["samples_trained"] / train if train else 0.0,
                     "evaluated_samples": evaluated, "rank_idle_s": h.get("rank_idle_seconds", [])})
    return rows


def round_case(rounds: int = 3, max_train_samples: int | None = None, cache_dir: str | None = None,
               extra_args: list[str] | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fedbench-round-") as out:
        args = [*CASE, "--fed.rounds", str(rounds), "--output_dir", out]
        if max_train_samples:
            args += ["--data.max_train_samples", str(max_train_samples)]
        if cache_dir:
            args += ["--data.cache_dir", cache_dir]
        args += extra_args or []
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "bench.cli", "run", *args], env=clean_env({}), cwd=REPO_ROOT,
                              capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            raise FedbenchError(f"the per-round case failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        record = json.loads(next(Path(out, "bench-round").glob("*.json")).read_text())
    used = run_usage(record)
    rows = round_rows(record)
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in ("training_s", "evaluation_s", "other_s", "total_s")}
    mean["samples_per_s"] = sum(r["samples"] for r in rows) / sum(r["training_s"] for r in rows)
    return {"args": args, "rounds": rows, "mean": mean, "wall_s": wall,
            "startup_s": wall - sum(r["total_s"] for r in rows), **used,
            "system_over_user": used["system_s"] / max(used["user_s"], 1e-9),
            "execution": record.get("execution", {}), "best_round": record.get("best_round"),
            "best_test_accuracy": record.get("best", {}).get("test/accuracy"),
            "goal_s": min(PEER_ROUND_SECONDS[p] * GOAL_FRACTION[p] for p in PEER_ROUND_SECONDS)}


def print_round(r: dict) -> None:
    ex = r["execution"]
    print(f"Per-round case (issue 19): FedAvg, Fashion-MNIST, 10 clients, Dirichlet 0.1, 50% sampled, ResNet-18 28 px, "
          f"batch 32; {ex.get('layout', '?')}")
    print(f"  {'round':>5s} {'samples':>8s} {'train s':>8s} {'eval s':>7s} {'(samples)':>10s} {'other s':>8s} "
          f"{'total s':>8s} {'samples/s':>10s}  idle s per rank")
    for row in r["rounds"]:
        print(f"  {row['round']:5d} {row['samples']:8d} {row['training_s']:8.2f} {row['evaluation_s']:7.2f} "
              f"{row['evaluated_samples']:10d} {row['other_s']:8.2f} {row['total_s']:8.2f} {row['samples_per_s']:10.0f}  "
              f"{', '.join(f'{x:.2f}' for x in row['rank_idle_s'])}")
    m = r["mean"]
    print(f"  mean: training {m['training_s']:.2f} s, evaluation {m['evaluation_s']:.2f} s, other {m['other_s']:.2f} s, "
          f"total {m['total_s']:.2f} s per round; {m['samples_per_s']:.0f} training samples/s")
    print(f"  all ranks: user {r['user_s']:.1f} s, system {r['system_s']:.1f} s ({r['system_over_user']:.1%} of user), "
          f"{r['minor_faults']:,} minor / {r['major_faults']:,} major page faults; start-up {r['startup_s']:.1f} s; "
          f"best test accuracy {r['best_test_accuracy']:.2f}% (round {r['best_round']})")
    peers = ", ".join(f"{p} {s:.2f} s (goal <= {GOAL_FRACTION[p]:.2f}x = {s * GOAL_FRACTION[p]:.1f} s)"
                      for p, s in PEER_ROUND_SECONDS.items())
    met = "met" if m["total_s"] <= r["goal_s"] else "NOT met"
    print(f"  peers per round on the issue's machine: {peers} -> goal {met}")
