"""`make bench` (`fedbench bench`): where a round's time goes, measured so that a user can trust it.

Every loop runs in its own process (bench/perf/loop_probe.py), because the C allocator's policy
is per process (bench/core/allocator.py) and a reference that shares fedbench's process shares its
allocator behaviour too. Cases (``--cases``, default all):

- ``loops``: a client's local training as fedbench runs it (its allocator policy), the same with
  glibc's default allocator ("churn"), and a bare PyTorch loop with and without churn (glibc's own
  ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_``); samples/s, system/user CPU time and minor
  page faults per step. The ratio is fedbench over the churn-free bare loop, paired per repeat. The case
  also runs both loops in one process, epochs about (``loop_probe --loop paired``): the step code's own
  cost, without what differs between processes (memory placement, allocator state). The machine's own
  noise remains: on a shared 2-core VM single pairs spread 0.87-1.38 and medians of 8 pairs 0.96-1.00.
- ``options``: the speed-up of channels_last, bf16-mixed and torch.compile on fedbench's loop.
- ``workers``: one process with all cores' threads against one 1-thread process per core training at
  once (the default layout of ``fedbench run`` on a multi-core CPU, bench/assembly/workers.py).
- ``round``: the per-round case of issue 19 (bench/perf/perf_round.py), also ``make bench-round``.
- ``clip``: FACMIC's feature-cache speed-up (bench/perf/perf_clip.py).
- ``table2`` (not in the default set): the offline table2 with its 2 ranks vs ``--jobs 2``
  (bench/perf/perf_table.py), also ``make bench-table2``.

Results go to results/bench/perf.json (sections not run keep their previous values).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

from bench.assembly.workers import CPU_LAYOUT, cpu_cores
from bench.core.allocator import OPT_OUT_ENV
from bench.core.atomic_io import write_json
from bench.core.errors import FedbenchError
from bench.core.paths import REPO_ROOT
from bench.perf.perf_env import clean_env
from bench.tables.flags import CommandParser

CASES = ("loops", "options", "workers", "round", "clip", "table2")
DEFAULT_CASES = CASES[:-1]  # table2 (two full offline tables, ~25 min) runs on request: make bench-table2
# glibc's own environment equivalent of fedbench's policy, for the churn-free reference loop
CHURN_FREE_ENV = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "4294967296"}
LOOP_VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "fedbench": ("fedbench", {}),  # what a user gets: fedbench's allocator policy
    "fedbench_churn": ("fedbench", {OPT_OUT_ENV: "system"}),
    "bare_churn": ("bare", {OPT_OUT_ENV: "system"}),
    "bare": ("bare", {OPT_OUT_ENV: "system", **CHURN_FREE_ENV}),
}
OPTIONS = {"channels_last": ["--channels-last"], "bf16-mixed": ["--precision", "bf16-mixed"],
           "compile": ["--compile"]}
PAIRED_EPOCHS = 8  # epochs of each loop in the one-process paired probe (loop_probe --loop paired)
GOAL_RATIO, GOAL_SYSTEM_SHARE = 1.0, 0.05  # issue 19: >= 1.0x the churn-free bare loop, system < 5% of user


def probe_cmd(loop: str, common: list[str], extra: list[str] | None = None) -> list[str]:
    return [sys.executable, "-m", "bench.perf.loop_probe", "--loop", loop, *common, *(extra or [])]


def finish(proc: subprocess.Popen, what: str) -> dict[str, Any]:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise FedbenchError(f"the {what} probe failed (exit {proc.returncode}):\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def run_probe(loop: str, common: list[str], env: dict[str, str], extra: list[str] | None = None,
              what: str = "") -> dict[str, Any]:
    proc = subprocess.Popen(probe_cmd(loop, common, extra), env=clean_env(env), cwd=REPO_ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return finish(proc, what or loop)


def common_args(args: argparse.Namespace, backbone: str, threads: int, epochs: int = 1) -> list[str]:
    """A probe's arguments; ``epochs``: its timed epochs (loop_probe's --repeats)."""
    out = ["--backbone", backbone, "--samples", str(args.samples), "--batch-size", str(args.batch_size),
           "--threads", str(threads), "--repeats", str(epochs), "--data", args.data]
    return out + (["--cache-dir", args.cache_dir] if args.cache_dir else [])


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def loops_case(args: argparse.Namespace) -> list[dict]:
    """Per backbone: every variant ``repeats`` times, interleaved (machine noise hits all alike)."""
    out = []
    for backbone in args.backbones:
        runs: dict[str, list[dict]] = {v: [] for v in LOOP_VARIANTS}
        for _ in range(args.repeats):
            for name, (loop, env) in LOOP_VARIANTS.items():
                runs[name].append(run_probe(loop, common_args(args, backbone, args.threads), env, what=name))
        ratios = [f["median_samples_per_s"] / b["median_samples_per_s"] for f, b in zip(runs["fedbench"], runs["bare"])]
        in_process = run_probe("paired", common_args(args, backbone, args.threads, PAIRED_EPOCHS), {}, what="paired")
        summary = {name: {"samples_per_s": median_of(rs, "median_samples_per_s"),
                          "system_over_user": median_of(rs, "system_over_user"),
                          "minor_faults_per_step": median_of(rs, "minor_faults_per_step"),
                          "major_faults": median_of(rs, "major_faults"),
                          "system_s": median_of(rs, "system_s"), "user_s": median_of(rs, "user_s"),
                          "allocator": rs[0]["allocator"]["policy"]} for name, rs in runs.items()}
        out.append({"backbone": backbone, "device": runs["fedbench"][0].get("device", "cpu"), "threads": args.threads,
                    "samples": args.samples,
                    "batch_size": args.batch_size, "variants": summary, "ratios_vs_churn_free_bare": ratios,
                    "median_ratio": statistics.median(ratios), "runs": runs,
                    "in_process": {k: in_process[k] for k in ("ratios", "median_ratio", "samples_per_s",
                                                              "bare_samples_per_s")}})
    return out


def print_loops(results: list[dict]) -> None:
    devices = sorted({r.get("device", "cpu") for r in results})
    print(f"Local training on {', '.join(devices)} (the machine at hand: a CUDA GPU when there is one): fedbench "
          "vs a bare PyTorch loop, each in its own process (churn = glibc's default allocator)")
    print(f"  {'backbone':12s} {'variant':15s} {'allocator':12s} {'samples/s':>10s} {'sys/user':>9s} "
          f"{'faults/step':>12s} {'system s':>9s}")
    for r in results:
        for name, v in r["variants"].items():
            print(f"  {r['backbone']:12s} {name:15s} {v['allocator']:12s} {v['samples_per_s']:10.0f} "
                  f"{v['system_over_user']:9.3f} {v['minor_faults_per_step']:12.0f} {v['system_s']:9.2f}")
        share = r["variants"]["fedbench"]["system_over_user"]
        met = r["median_ratio"] >= GOAL_RATIO and share < GOAL_SYSTEM_SHARE
        print(f"  {r['backbone']:12s} fedbench / churn-free bare = {r['median_ratio']:.3f} (per repeat: "
              f"{', '.join(f'{x:.3f}' for x in r['ratios_vs_churn_free_bare'])}); system time {share:.1%} of user"
              f" -> goal (>= {GOAL_RATIO:.1f}x, < {GOAL_SYSTEM_SHARE:.0%}) {'met' if met else 'NOT met'}")
        paired = r["in_process"]
        print(f"  {r['backbone']:12s} in one process, epochs about: fedbench / bare = {paired['median_ratio']:.3f} "
              f"(per pair {min(paired['ratios']):.3f}-{max(paired['ratios']):.3f}): the step code's own cost")


def options_case(args: argparse.Namespace) -> dict:
    """fedbench's loop with each speed option against the same loop without, paired per repeat."""
    backbone = args.backbones[0]
    runs: dict[str, list[dict]] = {"none": [], **{k: [] for k in OPTIONS}}
    for _ in range(args.repeats):
        runs["none"].append(run_probe("fedbench", common_args(args, backbone, args.threads), {}, what="fedbench"))
        for name, flags in OPTIONS.items():
            runs[name].append(run_probe("fedbench", common_args(args, backbone, args.threads), {}, flags, what=name))
    speedups = {name: statistics.median(o["median_samples_per_s"] / b["median_samples_per_s"]
                                        for o, b in zip(runs[name], runs["none"])) for name in OPTIONS}
    return {"backbone": backbone, "threads": args.threads,
            "samples_per_s": {k: median_of(v, "median_samples_per_s") for k, v in runs.items()},
            "speedup": speedups}


def print_options(r: dict) -> None:
    print(f"Speed options on fedbench's loop ({r['backbone']}, {r['threads']} thread(s)), vs eager fp32 "
          f"({r['samples_per_s']['none']:.0f} samples/s):")
    for name, s in r["speedup"].items():
        print(f"  {name:14s} {r['samples_per_s'][name]:8.0f} samples/s   x{s:.2f}")


def workers_case(args: argparse.Namespace) -> dict:
    """One process with ``cores`` threads, then ``cores`` 1-thread processes at once (summed samples/s)."""
    cores, backbone = cpu_cores(), args.backbones[0]
    one, many = [], []
    for _ in range(args.repeats):
        one.append(run_probe("fedbench", common_args(args, backbone, cores), {}, what="one rank")["median_samples_per_s"])
        procs = [subprocess.Popen(probe_cmd("fedbench", common_args(args, backbone, 1)), env=clean_env({}),
                                  cwd=REPO_ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(cores)]
        many.append(sum(finish(p, "worker")["median_samples_per_s"] for p in procs))
    speedup = statistics.median(m / o for m, o in zip(many, one))
    return {"backbone": backbone, "cores": cores, "one_rank_all_threads_samples_per_s": one,
            "one_thread_workers_samples_per_s": many, "speedup_workers": speedup, "default_layout": CPU_LAYOUT,
            "default_agrees": (speedup >= 1.0) == (CPU_LAYOUT == "workers")}


def print_workers(r: dict) -> None:
    print(f"Cores as client workers ({r['backbone']}, {r['cores']} cores): one rank x {r['cores']} threads "
          f"{statistics.median(r['one_rank_all_threads_samples_per_s']):.0f} samples/s; {r['cores']} ranks x 1 thread "
          f"{statistics.median(r['one_thread_workers_samples_per_s']):.0f} samples/s (x{r['speedup_workers']:.2f})")
    verdict = "agrees with" if r["default_agrees"] else "CONTRADICTS"
    print(f"  this measurement {verdict} fedbench's default CPU layout ({r['default_layout']!r}, bench/assembly/workers.py)")


def load_report(path: Path) -> dict:
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except json.JSONDecodeError:
        return {}


def build_parser() -> CommandParser:
    parser = CommandParser(prog="fedbench bench", description=__doc__)
    parser.add_argument("--cases", type=list[Literal[CASES]], default=list(DEFAULT_CASES))
    parser.add_argument("--backbones", type=list[str], default=["resnet18", "simple-cnn"])
    parser.add_argument("--samples", type=int, default=2048, help="training samples per timed epoch")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=cpu_cores(), help="torch threads of a loop (default: cores)")
    parser.add_argument("--repeats", type=int, default=3, help="processes per variant, interleaved")
    parser.add_argument("--data", type=Literal["fashion-mnist", "synthetic"], default="fashion-mnist")
    parser.add_argument("--cache-dir", default=None, help="decoded-data cache (default: fedbench's)")
    parser.add_argument("--round-rounds", type=int, default=3, help="round case: rounds")
    parser.add_argument("--round-samples", type=int, default=None,
                        help="round case: cap on training images (default: all of Fashion-MNIST)")
    parser.add_argument("--jobs", type=int, default=2, help="table2 case: --jobs of the concurrent variant")
    parser.add_argument("--skip-clip", type=bool, default=False, help="same as leaving 'clip' out of --cases")
    parser.add_argument("--out", default="results/bench/perf.json")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    cases = [c for c in args.cases if not (c == "clip" and args.skip_clip)]
    out = Path(args.out)
    report = load_report(out)
    if "loops" in cases:
        report["throughput"] = loops_case(args)
        print_loops(report["throughput"])
    if "options" in cases:
        report["options"] = options_case(args)
        print_options(report["options"])
    if "workers" in cases:
        report["workers"] = workers_case(args)
        print_workers(report["workers"])
    if "round" in cases:
        from bench.perf.perf_round import print_round, round_case

        report["round"] = round_case(args.round_rounds, args.round_samples, args.cache_dir)
        print_round(report["round"])
    if "clip" in cases:
        from bench.perf.perf_clip import facmic_cache_speedup

        report["facmic_cache"] = facmic_cache_speedup()
        print(f"FACMIC per-round time with the feature cache vs re-encoding: {report['facmic_cache']}")
    if "table2" in cases:
        from bench.perf.perf_table import print_table2, table2_case

        report["table2"] = table2_case(args.jobs)
        print_table2(report["table2"])
    write_json(out, report)
    print(f"written: {out}")
    return 0
