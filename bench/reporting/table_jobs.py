"""How `fedbench table` lays its runs over the machine: ranks for the table's one Fabric launch
(``devices``, "auto" by default), or ``--jobs N`` independent runs at once.

``--jobs N`` starts N worker processes; each takes the next run that is due, runs it alone on one
rank with ``cores // N`` torch threads (or the run's own ``threads``), and writes its record. On a
GPU machine each worker has a GPU of its own (N GPUs at most). Runs are
independent (each record is a pure function of its config), so the records are the same whatever N;
only wall time changes. The first failing run stops the table: runs not yet started are cancelled,
records already written stay valid, and the error names the run.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from tqdm.auto import tqdm

from bench.config import RunConfig, from_dict
from bench.core.errors import FedbenchError
from bench.core.lifetime import Interrupted, die_with_parent
from bench.workers import auto_layout, clients_per_round, cpu_cores, visible_gpus


def table_devices(runs: list, flag: int | None, configured: int | str | None, jobs: int) -> tuple[int, int | None]:
    """(ranks, threads for runs that set none) of the table's runs: ``flag`` (--devices), else the
    config's ``devices``, else "auto"; with ``jobs`` > 1 every run has one rank (the config's devices
    give way; an explicit --devices above 1 is refused)."""
    if jobs > 1:
        if flag not in (None, 1):
            raise FedbenchError(f"--jobs {jobs} runs every run on one rank; drop --devices {flag} (or use --jobs 1).")
        return 1, max(1, cpu_cores() // jobs)
    requested = flag or configured
    if requested not in (None, "auto"):
        return int(requested), None
    widest = max(clients_per_round(r.cfg) for r in runs)
    ranks, threads, _ = auto_layout(runs[0].cfg, one_client=False, clients=widest)
    return ranks, threads


def job_gpus(jobs: int, gpus: list[str]) -> list[str]:
    """The GPU of each of ``jobs`` workers, one each, from the visible ``gpus`` ([]: CPU, none).
    Two jobs never share a GPU (at 224 px one job fills a GPU's memory): more jobs than GPUs is
    refused."""
    if not gpus or jobs <= 1:
        return []
    if jobs > len(gpus):
        raise FedbenchError(f"--jobs {jobs} needs {jobs} GPUs (one per job); {len(gpus)} are visible "
                            f"(CUDA_VISIBLE_DEVICES={','.join(gpus)}). Use --jobs {len(gpus)} or fewer.")
    return gpus[:jobs]


def _start_worker(threads: int, gpus: list[str], slot, parent: int | None = None) -> None:
    """A --jobs worker's setup: its allocator, its threads and, on a GPU machine, its own GPU (the
    next free of ``gpus``, counted by the shared ``slot``), made its only visible device before CUDA
    starts, so that its runs' ``cuda:0`` is that GPU."""
    die_with_parent(parent=parent)  # the table's process gone (any signal, even SIGKILL): this worker stops too
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the table's to handle: it stops the workers
    if gpus:
        with slot.get_lock():
            index, slot.value = slot.value, slot.value + 1
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[index % len(gpus)]
    import torch

    from bench.core.allocator import apply_allocator_policy

    apply_allocator_policy()
    torch.set_num_threads(threads)


def _run_one(config: dict[str, Any], wandb_dir: str | None, annotations: dict | None,
             identity: dict | None = None) -> str:
    from bench.experiment import make_fabric, run_experiment
    from bench.reporting.wandb_logger import wandb_observer

    cfg = from_dict(config)
    fabric = make_fabric(cfg)
    fabric.launch()
    run_experiment(cfg, fabric, observer=wandb_observer(cfg, wandb_dir, annotations, identity), annotations=annotations)
    return cfg.record_name()


def run_jobs(todo: list, jobs: int, wandb_dir: str | None, desc: str, label, annotations: dict | None = None,
             identity=None) -> None:
    """Run ``todo`` (PlannedRuns with devices 1) in ``jobs`` worker processes; ``label(run)`` names
    a run in errors; ``annotations`` (a table's command-line overrides) go into every record;
    ``identity(run)`` names its table row in W&B."""
    configs: list[RunConfig] = [r.cfg for r in todo]
    threads = max(1, cpu_cores() // jobs)
    gpus = job_gpus(jobs, visible_gpus(configs[0].accelerator)) if configs else []
    context = multiprocessing.get_context("spawn")
    bar = tqdm(total=len(todo), desc=desc, unit="run")
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_start_worker,
                               initargs=(threads, gpus, context.Value("i", 0), os.getpid()))
    try:  # from the first submit on: a Ctrl-C while the workers start stops them too (not after their runs)
        futures = {pool.submit(_run_one, cfg.to_dict(), wandb_dir, annotations, identity(r) if identity else None): r
                   for cfg, r in zip(configs, todo)}
        for future in as_completed(futures):
            err = future.exception()
            if err is not None:  # runs already going finish (their records are valid); the rest never start
                pool.shutdown(wait=False, cancel_futures=True)
                bar.close()
                raise FedbenchError(f"{label(futures[future])}: {err}") from err
            bar.update(1)
            bar.set_postfix_str(future.result())
    except (KeyboardInterrupt, Interrupted):  # Ctrl-C or SIGTERM: stop the workers now, not after their runs
        bar.close()
        stop_workers(pool)
        raise
    finally:
        pool.shutdown(wait=True)
    bar.close()


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started and terminate the running workers (their half-done runs leave no
    record: records are written atomically at a run's end). ``_processes`` is the executor's own table
    of its worker processes (CPython's, stable since 3.2); it has no public way to stop a running task."""
    workers = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in workers:
        proc.terminate()
    for proc in workers:
        proc.join(timeout=10)
