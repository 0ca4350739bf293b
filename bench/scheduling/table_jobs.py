"""How `fedbench table` lays its runs over the machine: ranks for the table's one Fabric launch
(``devices``, "auto" by default), or ``--jobs K`` independent runs at once.

``--jobs K`` starts K worker processes; each takes the next run that is due, runs it alone on one
rank with ``cores // K`` torch threads (or the run's own ``threads``), and writes its record. Runs are
independent (each record is a pure function of its config), so the records are the same whatever K
and whatever order the runs start in; only wall time changes. The first failing run stops the table:
runs not yet started are cancelled, records already written stay valid, and the error names the run.

On a GPU machine K may exceed the number of GPUs G: worker i uses GPU ``i mod G`` (its only visible
device), so the workers are spread evenly (K=5, G=2: 3 and 2). Several small runs share a GPU well:
one table2_kvasir run (ResNet-18, 128 px, batch 8) is host-bound (Python and kernel launches), so the
GPU idles most of a step. Measured on an NVIDIA H200 (16-core Xeon host, the FedAvg row, synthetic
Kvasir-layout data, 3 rounds): one run alone 10.39 ms/step (96 steps/s), 4 concurrent runs 245 steps/s
in all (2.5x), 8 concurrent 303 (3.2x), 4 concurrent under ``gpu_math: tf32`` 383 (4.0x).

- ``--jobs auto`` (``auto_jobs``): one run per host core on GPUs, at most what their memory holds at
  ``--job-memory`` a run and at most the runs to do; one on a CPU. With the table's own rows 16 at once on
  the H200 above (16 cores, MPS), every core was busy and a FedAvg run's steps went at 7.1x its rate alone.
- Longest runs first (``longest_first``): with K > 1 the runs start in decreasing ``run_cost`` (a pure
  function of the config; ties keep the plan order), so a long run does not start last and keep one
  worker busy alone at the end. One process (K = 1) keeps the plan order.
- GPU memory (``--job-memory GIB``, default 4): before the pool starts, K workers per GPU x the need
  above a GPU's total memory is refused; before each run a worker waits until its GPU has that much
  free (``torch.cuda.mem_get_info``, polled for at most ``MEMORY_WAIT_S``), else the run fails naming
  the free and needed memory. Peaks measured on the H200 above (ResNet-18, 128 px, batch 8): FedAvg
  1.8 GiB, FedRep 1.2, FedBM 3.6 (its 32 synthetic samples per batch); the default covers the largest.
  On a CPU none of this runs.
- CUDA MPS (``mps_on``): never needed, used when the user has started its daemon (the kernels of the
  workers sharing a GPU then run concurrently instead of time-sliced); the table says "CUDA MPS: on".
  docs/scaling.md says how to start and stop it.
"""
from __future__ import annotations

import gc
import inspect
import math
import multiprocessing
import os
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from tqdm.auto import tqdm

from bench.assembly.config import RunConfig, from_dict
from bench.assembly.workers import auto_layout, clients_per_round, cpu_cores, launchable, visible_gpus
from bench.core.compat import skip_unused_imports
from bench.core.errors import FedbenchError
from bench.core.import_gc import stack_import
from bench.core.lifetime import Interrupted, die_with_ancestor, die_with_parent

GIB = 1024 ** 3
JOB_MEMORY_GIB = 4.0  # --job-memory default: the largest measured peak (FedBM 3.6 GiB) and some room
MEMORY_POLL_S = 5.0  # a worker waiting for GPU memory looks again this often ...
MEMORY_WAIT_S = 600.0  # ... for at most this long before its run fails
MPS_PIPE_DEFAULT = "/tmp/nvidia-mps"  # nvidia-cuda-mps-control's pipe directory unless CUDA_MPS_PIPE_DIRECTORY says


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


def auto_jobs(cores: int, gpus: list[str], job_memory: float, runs: int, totals=None) -> tuple[int, str]:
    """``--jobs auto``: how many runs at once, and why. On a CPU one (the run's ranks take the cores). On GPUs
    one per core (the runs are host-bound: on an H200 with 16 cores, 16 of table2_kvasir's rows at once ran 7.1x
    FedAvg's steps alone, every core busy; docs/gpu.md), at most what the GPUs' memory holds at ``job_memory``
    GiB a run (``totals``: bytes per visible GPU; default: asked of torch) and at most ``runs``."""
    if not gpus:
        return 1, "on the CPU one run at a time, its ranks on the cores"
    if totals is None:
        import torch

        totals = [torch.cuda.get_device_properties(i).total_memory for i in range(len(gpus))]
    # job_gpus gives GPU i mod G to worker i: the smallest GPU bounds how many each may get
    fits = len(gpus) * min(int(total // (job_memory * GIB)) for total in totals)
    jobs = max(1, min(cores, fits, runs))
    bound = min((cores, f"{cores} cores"), (fits, f"{fits} x {job_memory:g} GiB (--job-memory) in the GPUs' memory"),
                (runs, f"{runs} runs"), key=lambda pair: pair[0])[1]
    return jobs, f"one run per core on {len(gpus)} GPU(s), at most {bound}"


def job_gpus(jobs: int, gpus: list[str]) -> list[str]:
    """The GPU of each of ``jobs`` workers from the visible ``gpus`` ([]: CPU, none): worker i gets
    ``gpus[i mod G]``, so more jobs than GPUs share them evenly (5 jobs on 2 GPUs: 3 and 2)."""
    if jobs < 1:
        raise FedbenchError(f"--jobs must be >= 1, got {jobs}.")
    if not gpus or jobs == 1:
        return []
    return [gpus[i % len(gpus)] for i in range(jobs)]


def claim_gpu(gpus: list[str], slot) -> str | None:
    """The GPU of the worker starting now: the next of ``gpus`` (one per worker, ``job_gpus``), counted
    by the shared ``slot``; None on a CPU."""
    if not gpus:
        return None
    with slot.get_lock():
        index, slot.value = slot.value, slot.value + 1
    return gpus[index % len(gpus)]


def _start_worker(threads: int, gpus: list[str], slot, parent: int | None = None,
                  environ: dict[str, str] | None = None) -> None:
    """A --jobs worker's setup: its allocator, its threads and, on a GPU machine, its GPU (``claim_gpu``),
    made its only visible device before CUDA starts, so that its runs' ``cuda:0`` is that GPU. ``environ``:
    the table's environment as the pool started (a forked worker has its forkserver's otherwise)."""
    # the table's process gone (any signal, even SIGKILL): this worker stops too
    die_with_parent() if parent is None else die_with_ancestor(parent)
    sys.excepthook = sys.__excepthook__  # the forkserver's hook (bench/scheduling/job_preload.py) ends here
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the table's to handle: it stops the workers
    gpu = claim_gpu(gpus, slot)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    skip_unused_imports()  # as the command's own process does (bench/cli.py main)
    with stack_import():  # a spawned worker's first import of torch (a forked one has it: unchanged)
        import torch

    from bench.core.allocator import apply_allocator_policy

    apply_allocator_policy()
    torch.set_num_threads(threads)


def job_context(on_gpu: bool) -> Any:
    """How the --jobs workers start. The fedbench command on Linux, its runs on the CPU: forked by one
    forkserver that imported the training stack once (bench/scheduling/job_preload.py), so a worker is ready at
    once instead of importing torch and Lightning again (seconds of CPU each). Otherwise spawned, each worker
    a fresh interpreter: on a GPU (a process that touched the CUDA driver cannot fork a CUDA user, and the GPU
    path is the one gpu-check measured), and when run_jobs is called from Python (tests, notebooks: a
    forkserver would outlive the call with the environment and output streams it started with)."""
    if not on_gpu and launchable() and "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["bench.scheduling.job_preload"])
        return context
    return multiprocessing.get_context("spawn")


def _ready() -> None:
    """``warm_up``'s process: nothing to do."""


def warm_up(context: Any) -> None:
    """Start the forkserver of ``job_context`` with a no-op process, so that the workers are forked only once
    it has imported everything: a Ctrl-C during those seconds then finds no worker half-started."""
    if context.get_start_method() == "forkserver":
        process = context.Process(target=_ready)
        process.start()
        process.join()


def method_weight(cfg: RunConfig) -> float:
    """A run's work per local step relative to FedAvg's, where a method's extra work is plain from its
    definition (in forward passes, a backward counting as two): MOON runs two more forwards (the global
    and the previous model) besides its forward and backward, 5/3; FedBM trains on its batch plus
    ``g_batch`` synthetic samples. Every other method: 1 (their extra terms are small next to a
    ResNet-18 forward and backward)."""
    name, args = cfg.method.name, cfg.method.args
    if name == "moon":
        return 5 / 3
    if name == "fedbm":
        from lightning_modules.base import METHODS

        g_batch = args.get("g_batch", inspect.signature(METHODS.get("fedbm")).parameters["g_batch"].default)
        return (cfg.fed.batch_size + g_batch) / cfg.fed.batch_size
    return 1.0


def run_cost(cfg: RunConfig) -> float:
    """A run's estimated training work, in epochs over the training set: rounds x local epochs x the
    share of the training samples a round trains (the sampled clients' share, all of them for a
    method that trains centrally) x ``method_weight``. A pure function of the config; only the order
    of runs depends on it, never a record."""
    from lightning_modules.base import METHODS

    if METHODS.get(cfg.method.name).runs_centrally:
        share = 1.0
    else:
        share = clients_per_round(cfg) / cfg.partition.num_clients
    return cfg.fed.rounds * cfg.fed.local_epochs * share * method_weight(cfg)


def longest_first(todo: list) -> list:
    """The planned runs ``todo`` by decreasing ``run_cost``, ties in plan order (the sort is stable)."""
    return sorted(todo, key=lambda r: -run_cost(r.cfg))


def mps_on(environ=None) -> bool:
    """Whether a CUDA MPS daemon is running for this user: its control pipe is in the pipe directory
    ($CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps). Looks at a path only: starts and asks nothing."""
    environ = os.environ if environ is None else environ
    folder = environ.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_PIPE_DEFAULT
    return os.path.exists(os.path.join(folder, "control"))


def check_jobs(jobs: int, job_memory: float, gpus: list[str], totals=None) -> None:
    """--jobs and --job-memory before any run starts: jobs >= 1, a positive need, and on a GPU machine
    (``gpus``) the workers each GPU gets x the need within its total memory (``totals``: bytes per
    visible GPU by position; default: asked of torch, which starts no CUDA context for it)."""
    placed = job_gpus(jobs, gpus)  # refuses jobs < 1
    if not (isinstance(job_memory, int | float) and math.isfinite(job_memory) and job_memory > 0):
        raise FedbenchError(f"--job-memory must be a positive number of GiB (a run's GPU memory need), "
                            f"got {job_memory!r}.")
    if not placed:
        return
    if totals is None:
        import torch

        totals = [torch.cuda.get_device_properties(i).total_memory for i in range(len(gpus))]
    for index, gpu in enumerate(gpus):
        workers = placed.count(gpu)
        if workers * job_memory * GIB > totals[index]:
            fits = max(1, int(totals[index] // (job_memory * GIB)))
            raise FedbenchError(
                f"--jobs {jobs} puts {workers} workers on GPU {gpu} ({totals[index] / GIB:.1f} GiB): {workers} x "
                f"{job_memory:g} GiB (--job-memory) does not fit. Lower --jobs to {fits * len(gpus)} or fewer, or "
                f"--job-memory to {math.floor(totals[index] / GIB / workers * 10) / 10:g} or less if the runs need less (peaks measured "
                "at 128 px, batch 8: FedAvg 1.8 GiB, FedBM 3.6).")


def wait_for_memory(need_gib: float, run: str, sleep=time.sleep) -> int:
    """Before a run on this worker's CUDA device: wait until ``need_gib`` GiB are free (polled every
    ``MEMORY_POLL_S`` for at most ``MEMORY_WAIT_S``), after releasing what this worker's allocator
    keeps cached from its previous run; returns the free bytes, or fails naming ``run``."""
    import torch

    gc.collect()
    torch.cuda.empty_cache()
    waited = 0.0
    while True:
        free, total = torch.cuda.mem_get_info()
        if free >= need_gib * GIB:
            return free
        if waited >= MEMORY_WAIT_S:
            raise FedbenchError(
                f"run {run} did not start: its GPU (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}) "
                f"had {free / GIB:.2f} GiB free of {total / GIB:.1f} after waiting {waited:.0f} s; it needs "
                f"{need_gib:g} GiB (--job-memory). Lower --jobs, lower --job-memory if the runs need less, or free "
                "the GPU of other processes.")
        sleep(MEMORY_POLL_S)
        waited += MEMORY_POLL_S


def _run_one(config: dict[str, Any], wandb_dir: str | None, annotations: dict | None,
             identity: dict | None = None, need_gib: float | None = None) -> str:
    from bench.assembly.experiment import make_fabric, run_experiment
    from bench.tracking.wandb_logger import wandb_observer

    cfg = from_dict(config)
    if need_gib is not None:  # a worker on a GPU (run_jobs)
        wait_for_memory(need_gib, cfg.record_name())
    fabric = make_fabric(cfg)
    fabric.launch()
    run_experiment(cfg, fabric, observer=wandb_observer(cfg, wandb_dir, annotations, identity), annotations=annotations)
    return cfg.record_name()


def placement_line(jobs: int, threads: int, gpus: list[str]) -> str:
    """What the workers run on, printed as the pool starts."""
    if not gpus:
        return f"{jobs} jobs on the CPU, {threads} thread(s) each, longest runs first"
    per_gpu = ", ".join(f"GPU {g}: {gpus.count(g)}" for g in dict.fromkeys(gpus))
    return (f"{jobs} jobs on {len(set(gpus))} GPU(s) ({per_gpu}), {threads} thread(s) each, longest runs first; "
            f"CUDA MPS: {'on' if mps_on() else 'off'}")


def run_jobs(todo: list, jobs: int, wandb_dir: str | None, desc: str, label, annotations: dict | None = None,
             identity=None, job_memory: float = JOB_MEMORY_GIB) -> None:
    """Run ``todo`` (PlannedRuns with devices 1) in ``jobs`` worker processes, longest first; ``label(run)``
    names a run in errors; ``annotations`` (a table's command-line overrides) go into every record;
    ``identity(run)`` names its table row in W&B; ``job_memory``: GiB a run on a GPU waits for."""
    todo = longest_first(todo)
    configs: list[RunConfig] = [r.cfg for r in todo]
    threads = max(1, cpu_cores() // jobs)
    gpus = job_gpus(jobs, visible_gpus(configs[0].accelerator)) if configs else []
    need = job_memory if gpus else None
    context = job_context(on_gpu=bool(gpus))
    print(placement_line(jobs, threads, gpus), flush=True)
    bar = tqdm(total=len(todo), desc=desc, unit="run")
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_start_worker,
                               initargs=(threads, gpus, context.Value("i", 0), os.getpid(), dict(os.environ)))
    try:  # from the first submit on: a Ctrl-C while the workers start stops them too (not after their runs)
        warm_up(context)
        futures = {pool.submit(_run_one, cfg.to_dict(), wandb_dir, annotations, identity(r) if identity else None,
                               need): r
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
