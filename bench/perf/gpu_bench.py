"""`make gpu-bench` (issue 42, item 6): how long would table2_kvasir take on this machine?

It writes synthetic Kvasir-v2-layout images (8 class folders of 160x128 JPEGs, tinted noise; no download),
runs a few rounds of table2_kvasir's own rows (their configs from the table file, seed 0, first column) at
128 px under each ``gpu_math`` mode, alone and as K runs at once (K processes started together), and prints
the projected wall time of the whole table for each setting:

    table seconds = sum over the table's distinct runs of (its row's measured cost, or FedAvg's where the
                    row was not measured: marked inferred) / speedup(K)
    a row's cost  = its config's rounds x (train seconds of a round x full / measured training images
                    + eval seconds), from the rounds after the first (the first pays for warm-up)
    speedup(K)    = aggregate steps/s of K runs at once / steps/s of one run alone (same row, same mode)

    python -m bench.perf.gpu_bench                          # on the GPU: rows FedAvg, modes strict,tf32, K 1,4
    python -m bench.perf.gpu_bench --device cpu --tiny      # the CPU mode the tests run (seconds)

``--mix K`` measures what ``table --jobs K`` does instead: K runs at once, the i-th of row i (the rows cycled),
each row's cost taken under that load (only rounds run while all K runs were in their rounds), and the table
projected as its runs started on K slots in ``table --jobs``' own order: no speedup factor, and no row inferred
that ran (bench/perf/gpu_mix.py). ``--set KEY=VALUE`` gives every measured run a run option (compile=true).

Rows with a text tower (FedCB, FedBM) get a stand-in of the same width built here (random unit embeddings):
the bench times steps, and a run encodes its prompts once, before its rounds; their weights need a download.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.core.compat import skip_unused_imports
from bench.core.import_gc import stack_import

KVASIR_IMAGES = 8000  # Kvasir-v2: 8 classes of 1,000 images
TABLE = "configs/tables/table2_kvasir.yaml"


def write_kvasir(root: Path, per_class: int) -> Path:
    """<root>/kvasir-dataset-v2/<class>/img_<i>.jpg: 160x128 noise tinted by class (datamodules/kvasir.py
    decodes and resizes them as it does the real files)."""
    import numpy as np
    from PIL import Image

    from datamodules.kvasir import Kvasir

    base = root / "kvasir-dataset-v2"
    for label, name in enumerate(Kvasir.class_dirs):
        folder = base / name
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(label)
        tint = np.array([30 + 25 * label, 220 - 25 * label, 128], dtype=np.int16)
        for i in range(per_class):
            pixels = np.clip(rng.integers(-60, 60, (128, 160, 3)) + tint, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"img_{i:04d}.jpg", quality=85)
    return base


def distinct_table_runs() -> list:
    """table2_kvasir's distinct planned runs, in plan order."""
    from bench.scheduling.table_runner import distinct_runs, load_table_config, plan_runs

    return distinct_runs(plan_runs(load_table_config(TABLE), output_dir="/tmp/none", check_records=False))


def table_runs(runs: list | None = None) -> tuple[Counter, dict]:
    """The table's distinct runs (``runs``, default: planned here) counted per row label, and each row's first
    config (seed 0)."""
    runs = distinct_table_runs() if runs is None else runs
    configs: dict = {}
    for r in runs:
        if r.cfg.seed == 0:
            configs.setdefault(r.label, r.cfg)
    return Counter(r.label for r in runs), configs


def jobs_order(runs: list | None = None) -> list[str]:
    """The row label of each distinct run (``runs``, default: planned here), in the order `table --jobs K` starts
    them (its own estimate of a run's work, longest first: bench/scheduling/table_jobs.py)."""
    from bench.scheduling.table_jobs import longest_first

    return [r.label for r in longest_first(distinct_table_runs() if runs is None else runs)]


def schedule_rounds(cfg) -> int:
    """The rounds a run of ``cfg`` goes through: a central method trains rounds x local epochs rounds of one
    epoch each (bench/assembly/central.py)."""
    from lightning_modules.base import METHODS

    central = METHODS.get(cfg.method.name).runs_centrally
    return cfg.fed.rounds * (cfg.fed.local_epochs if central else 1)


def run_cost(record: dict, rounds: int, full: tuple[int, int], steady: list[dict] | None = None) -> dict:
    """ms per local step and the projected seconds of ``rounds`` rounds at ``full`` = (training, test) images,
    from ``steady`` (default: the record's rounds after the first). Training scales with the training images
    and evaluation with the test images; the rest of a round (the all-reduce, aggregation, the server step such
    as FedBM's generator) is taken as measured, except under the per-client protocols (``per_client``,
    ``local_mean``): there each client's evaluation (and FedBABU's fine-tuning) runs inside the round outside
    both timings, so the rest scales with the training images (an upper bound: aggregation is in it too)."""
    hist = record["history"]
    steady = (hist[1:] or hist) if steady is None else steady
    batch = record["config"]["fed"]["batch_size"]
    steps = sum(h["samples_trained"] for h in steady) / batch
    train_scale = full[0] / max(1, record["splits"]["train"])
    test_scale = full[1] / max(1, record["splits"]["test"])
    rest_scale = train_scale if record.get("protocol") in ("per_client", "local_mean") else 1.0
    per_round = sum(h["train_seconds"] * train_scale + h["eval_seconds"] * test_scale
                    + (h["round_seconds"] - h["train_seconds"] - h["eval_seconds"]) * rest_scale
                    for h in steady) / len(steady)
    return {"ms_per_step": 1e3 * sum(h["train_seconds"] for h in steady) / max(1.0, steps),
            "run_seconds": rounds * per_round, "rounds_used": len(steady)}


def project(counts: Counter, costs: dict[str, float], fallback: str, speedup: float) -> tuple[float, list[str]]:
    """Projected table seconds: each run at its row's cost (``fallback``'s where its row has none), all
    divided by ``speedup``; and the rows whose cost was inferred."""
    inferred = sorted(label for label in counts if label not in costs)
    total = sum(n * costs.get(label, costs[fallback]) for label, n in counts.items())
    return total / speedup, inferred


def stand_in_text_towers() -> None:
    """Every named text encoder becomes a stand-in of its width: random unit embeddings, seeded by the
    prompts' count (the bench times the steps; a run encodes its prompts once, before its rounds)."""
    import torch

    from lightning_modules.components import text_encoders as te

    class StandIn(te.TextEncoder):
        def __init__(self, name: str, dim: int) -> None:
            self.name, self.dim = name, dim

        def encode(self, texts: list[str]) -> torch.Tensor:
            # on the CPU, as every TextEncoder returns its embeddings (the module moves them to its device)
            return torch.randn(len(texts), self.dim, generator=torch.Generator().manual_seed(len(texts)), device="cpu")

    for name, spec in list(te.ENCODERS.items()):
        te.ENCODERS[name] = te.EncoderSpec(spec.dim, lambda _device, n=name, d=spec.dim: StandIn(n, d))


def one_run(args) -> None:
    """Child mode: run one row for ``--rounds`` rounds and print its cost as one JSON line; with ``--stream``,
    run the row's whole schedule and print its rounds as they end (the parent stops it)."""
    with stack_import():  # as a `fedbench run` process imports it (bench/core/import_gc.py)
        from bench.assembly.experiment import make_fabric, run_experiment
        from bench.assembly.run_outputs import RunObserver
        from datamodules.kvasir import KVASIR_SPLIT

    _, configs = table_runs()
    cfg = configs[args.row]
    table_rounds = schedule_rounds(cfg)
    full = round(KVASIR_IMAGES * KVASIR_SPLIT[0]), round(KVASIR_IMAGES * KVASIR_SPLIT[2])  # 5,600 / 1,600 at 7:1:2
    tmp = tempfile.mkdtemp(prefix="gpu-bench-run-", dir=Path(args.root).parent)  # the parent's folder removes it
    cfg.data.root, cfg.data.cache_dir, cfg.data.image_size = args.root, f"{tmp}/cache", args.size
    cfg.data.max_test_samples = args.max_test
    if args.tiny:  # 168 training images cannot give 10 clients >= 10 images each at beta 0.05
        cfg.partition.args = {**cfg.partition.args, "min_size": 2}
    if not args.stream:
        cfg.fed.rounds = args.rounds
    cfg.gpu_math = args.mode
    apply_option_sets(cfg, checked_option_sets(args.set))  # e.g. compile=true, channels_last=true
    cfg.accelerator, cfg.devices, cfg.progress, cfg.threads = args.device, 1, False, args.threads
    cfg.output_dir, cfg.checkpoint_dir = f"{tmp}/runs", f"{tmp}/ckpt"
    stand_in_text_towers()
    fabric = make_fabric(cfg)
    fabric.launch()
    if args.stream:
        print(json.dumps({"row": args.row, "table_rounds": table_rounds, "full": full}), flush=True)
        from bench.perf.gpu_mix import RoundStream

        observer = type("StreamObserver", (RoundStream, RunObserver), {})()
        run_experiment(cfg, fabric, observer)
        return
    record = run_experiment(cfg, fabric)
    print(json.dumps({"row": args.row, "mode": args.mode, **run_cost(record, table_rounds, full)}))


def checked_option_sets(items: list[str]) -> dict:
    """``--set KEY=VALUE`` items as `fedbench table --set` reads them (typed and checked); a method's or a
    partition's own options (``method.args.*``) are refused: the rows are the table's."""
    from bench.core.errors import FedbenchError
    from bench.tables.table_overrides import checked_sets

    sets = checked_sets(items)
    own = sorted(k for k in sets if ".args." in k)
    if own:
        raise FedbenchError(f"--set {own[0]}: the rows' own options are the table's; set run options only "
                            "(compile=true, channels_last=true, precision=bf16-mixed ...).")
    return sets


def apply_option_sets(cfg, sets: dict) -> None:
    """Each checked ``--set`` (dotted RunConfig option -> value) into ``cfg``."""
    for key, value in sets.items():
        *path, last = key.split(".")
        target = cfg
        for part in path:
            target = getattr(target, part)
        setattr(target, last, value)


def child_run(args, row: str, mode: str, k: int, stream: bool = False) -> tuple[list[str], dict[str, str]]:
    """The command and environment of one of K child runs of ``row`` under ``mode`` (``cores // K`` threads);
    ``stream``: its whole schedule, its rounds printed as they end (bench/perf/gpu_mix.py), else ``--rounds``."""
    threads = max(1, (os.cpu_count() or 1) // k)
    cmd = [sys.executable, "-m", "bench.perf.gpu_bench", "--one-run", "--row", row, "--mode", mode,
           "--root", args.root, "--size", str(args.size), "--device", args.device, "--threads", str(threads),
           *(["--stream"] if stream else ["--rounds", str(args.rounds)]),
           *[a for item in args.set for a in ("--set", item)],
           *(["--max-test", str(args.max_test)] if args.max_test else []), *(["--tiny"] if args.tiny else [])]
    return cmd, {**os.environ, "OMP_NUM_THREADS": str(threads)}


def measure(args, row: str, mode: str, k: int) -> list[dict]:
    """K child runs of ``row`` at once (each ``cores // K`` threads); their JSON results."""
    cmd, env = child_run(args, row, mode, k)
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(k)]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate()
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        if proc.returncode or not lines:
            raise SystemExit(f"gpu-bench: {row} under {mode} failed:\n{stderr[-1500:]}")
        out.append(json.loads(lines[-1]))
    return out


def bench(args, counts: Counter) -> list[dict]:
    """Every (mode, K) setting: ms per step, aggregate steps/s, speedup and the projected table hours of the
    table's distinct runs (``counts``: per row label)."""
    rows, settings, start = args.rows.split(","), [], time.perf_counter()

    def progress(what: str) -> None:  # a line per measurement on stderr: the whole bench takes minutes
        print(f"gpu-bench [{time.perf_counter() - start:5.0f} s] {what}", file=sys.stderr, flush=True)

    for mode in args.modes.split(","):
        if args.mix:
            from bench.perf.gpu_mix import mix_setting

            try:
                settings.append(mix_setting(args, counts, rows, mode))
                progress(f"{args.mix} rows at once under {mode}: {settings[-1]['aggregate_steps_per_s']:.1f} steps/s, "
                         f"table {settings[-1]['table_hours']:.2f} h")
            except SystemExit as err:
                progress(f"{mode}: {err}")
                settings.append({"mode": mode, "error": str(err)})
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(settings[-1]) + "\n")
            continue
        try:
            costs = {}
            for row in rows:
                costs[row] = measure(args, row, mode, 1)[0]
                progress(f"{row} under {mode}, alone: {costs[row]['ms_per_step']:.2f} ms per step")
            alone = 1e3 / costs[rows[0]]["ms_per_step"]
            for k in sorted({1, *map(int, args.jobs.split(","))}):
                runs = [costs[rows[0]]] if k == 1 else measure(args, rows[0], mode, k)
                aggregate = sum(1e3 / r["ms_per_step"] for r in runs)
                seconds, inferred = project(counts, {row: c["run_seconds"] for row, c in costs.items()}, rows[0],
                                            aggregate / alone)
                settings.append({"mode": mode, "jobs": k, "sets": args.set,
                                 "ms_per_step": [round(r["ms_per_step"], 2) for r in runs],
                                 "aggregate_steps_per_s": aggregate, "speedup": aggregate / alone,
                                 "table_hours": seconds / 3600, "inferred_rows": len(inferred),
                                 "row_seconds": {row: round(c["run_seconds"], 1) for row, c in costs.items()}})
                progress(f"{rows[0]} under {mode}, {k} at once: {aggregate:.1f} steps/s, table {seconds / 3600:.2f} h")
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(json.dumps(settings[-1]) + "\n")
        except SystemExit as err:  # one mode's failure is reported; the other modes still run
            progress(f"{mode}: {err}")
            settings.append({"mode": mode, "error": str(err)})
    return settings


def print_settings(settings: list[dict], counts_total: int, device: str) -> None:
    sets = sorted({item for s in settings for item in s.get("sets", [])})
    print(f"table2_kvasir: {counts_total} distinct runs, projected on {device}"
          + (f", every run with --set {' '.join(sets)}" if sets else ""))
    print(f"{'gpu_math':<8} {'jobs':>4} {'ms/step (each run)':<28} {'steps/s':>8} {'speedup':>8} {'table hours':>12}")
    for s in (s for s in settings if "error" not in s):
        each = ", ".join(f"{v:g}" for v in s["ms_per_step"][:4]) + (" ..." if len(s["ms_per_step"]) > 4 else "")
        speedup = "mix" if s.get("mix") else f"{s['speedup']:.2f}x"
        print(f"{s['mode']:<8} {s['jobs']:>4} {each:<28} {s['aggregate_steps_per_s']:>8.1f} {speedup:>8} "
              f"{s['table_hours']:>11.2f}")
    for s in (s for s in settings if s.get("mix")):
        print(f"{s['mode']} mix of {s['jobs']}: per-run cost under that load (s) {s['row_seconds']}; rounds used "
              f"{s['rounds_used']}; {s['inferred_rows']} rows inferred at their mean; one at a time "
              f"{s['serial_hours']:.2f} h; on {s['jobs']} slots in table --jobs' order {s['table_hours']:.2f} h "
              f"(longest first by these costs: {s['ideal_hours']:.2f} h)")
    for s in settings:
        if "error" in s:
            print(f"{s['mode']:<8} FAILED: {s['error'].splitlines()[0]}")
    measured = [s for s in settings if "error" not in s]
    if not measured:
        return
    first = next((s for s in measured if not s.get("mix")), None)
    if first is None:
        return
    print(f"per-run cost of the measured rows (s): {first['row_seconds']}; {first['inferred_rows']} rows inferred "
          "at the first row's cost")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--rows", default="FedAvg", help="table rows to measure, comma-separated (the first sets K's "
                   "speedup), or 'all' (the table's rows)")
    p.add_argument("--mix", type=int, default=0, metavar="K",
                   help="instead of alone and --jobs: K runs at once of the rows cycled (what table --jobs K does)")
    p.add_argument("--modes", default="strict,tf32", help="gpu_math modes, comma-separated")
    p.add_argument("--jobs", default="1,4", help="runs at once, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--per-class", type=int, default=500)
    p.add_argument("--max-test", type=int, default=None)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a run option for every measured run, as `fedbench table --set` (e.g. compile=true)")
    p.add_argument("--json", help="also append each measured setting to this file as a JSON line")
    p.add_argument("--reproject", metavar="FILE", help="project the --mix settings of a --json file again from their "
                   "saved rounds (no device, no runs)")
    p.add_argument("--tiny", action="store_true", help="16 px, 30 images per class, 2 rounds (the test suite's mode)")
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--row", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.one_run:
        skip_unused_imports()  # a run's process, as `fedbench run`'s (bench/cli.py main)
        one_run(args)
        return 0
    if args.reproject:
        from bench.perf.gpu_mix import reproject

        counts, _ = table_runs()
        try:
            settings = reproject(args.reproject, counts)
        except (OSError, ValueError, KeyError) as err:
            print(f"gpu-bench: cannot project {args.reproject} again ({type(err).__name__}: {err}); it must be a "
                  "--json file of a --mix run", file=sys.stderr)
            return 2
        if not settings:
            print(f"gpu-bench: {args.reproject} holds no --mix setting (only those keep their rounds)", file=sys.stderr)
            return 2
        print_settings(settings, sum(counts.values()), f"the device of {args.reproject}")
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu-bench: no CUDA device visible; `python -m bench.perf.gpu_bench --device cpu --tiny` is the dry run.")
        return 0
    if args.tiny:
        args.size, args.per_class, args.rounds, args.max_test = 16, 30, 2, 40
    start = time.perf_counter()
    counts, _ = table_runs()
    if args.rows == "all":
        args.rows = ",".join(counts)
    unknown = sorted(set(args.rows.split(",")) - set(counts))
    if unknown:
        print(f"gpu-bench: no row {unknown} in {TABLE}; its rows: {', '.join(counts)}", file=sys.stderr)
        return 2
    from bench.core.errors import FedbenchError
    from bench.core.numerics import GPU_MATH_MODES

    modes = sorted(set(args.modes.split(",")) - set(GPU_MATH_MODES))
    if modes:
        print(f"gpu-bench: no gpu_math mode {modes}; the modes: {', '.join(GPU_MATH_MODES)}", file=sys.stderr)
        return 2
    try:
        checked_option_sets(args.set)
    except FedbenchError as err:
        print(f"gpu-bench: {err}", file=sys.stderr)
        return 2
    if args.mix < 0 or args.rounds < 2:
        print("gpu-bench: --mix takes K >= 1 runs at once (0: off) and --rounds at least 2 (the first is warm-up)",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="fedbench-gpu-bench-") as tmp:
        args.root = str(write_kvasir(Path(tmp), args.per_class))
        settings = bench(args, counts)
    print_settings(settings, sum(counts.values()), args.device)
    print(f"gpu-bench: {time.perf_counter() - start:.0f} s")
    return 1 if any("error" in s for s in settings) else 0


if __name__ == "__main__":
    sys.exit(main())
