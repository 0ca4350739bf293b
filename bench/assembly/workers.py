"""How a run spreads over the machine when ``devices`` is "auto" (the default of `fedbench run` and
`fedbench table`).

On a multi-core CPU the cores are used as client workers: one rank per core with one torch thread
each, every rank training its own clients, instead of one rank with all cores' threads. Measured on
the 2-core machine of issue 19 (ResNet-18, 28 px, batch 32): two 1-thread processes trained
240 + 249 = 489 samples/s, one 2-thread process 347-450 (small convolutions do not split well over
threads). ``fedbench bench --cases workers`` measures both on the machine at hand and says whether
the measurement agrees with ``CPU_LAYOUT``.

"auto" resolves to
- under torchrun or SLURM, the processes per node the launcher started;
- on CUDA, one rank per visible GPU, no more than the clients trained per round (one rank for a run
  that trains one client, on MPS, or on a single GPU);
- one rank with all threads (``threads``: Lightning's choice) for a run that trains one client (the
  central methods), on a 1-core CPU, and
  in a process Fabric cannot relaunch as a rank (fedbench called from Python, e.g. a test: Fabric
  starts the other ranks by re-running the main script, which must be the fedbench command);
- otherwise ``min(cores // threads, clients per round)`` ranks of ``threads`` threads (1 unless set).

Results do not depend on the layout: rank invariance is exact for equal thread counts per rank, and a
different thread count changes the last bits of float sums (README, "Rank invariance"). So on a CPU a
run that trains several clients has one torch thread per rank unless ``threads`` is set, whatever
its ``devices`` (``rank_threads``): ``--devices 1`` and ``--devices 2`` give the same numbers. A
thread count other than 1 is part of the run's result identity (bench/assembly/config.py, result_config).
"""
from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

from bench.assembly.config import RunConfig

CPU_LAYOUT = "workers"  # "workers": one 1-thread rank per core; "threads": one rank with every core
GPU_ACCELERATORS = ("gpu", "cuda", "mps")


def cpu_cores() -> int:
    """Cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def launchable() -> bool:
    """Whether Fabric can start more ranks of this process: it re-runs the main script, which must
    be the fedbench command (``fedbench ...`` or ``python -m bench.cli ...``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return (spec is not None and spec.name == "bench.cli") or Path(sys.argv[0]).name == "fedbench"


def on_gpu(accelerator: str) -> bool:
    if accelerator in GPU_ACCELERATORS:
        return True
    if accelerator != "auto":
        return False
    from lightning.fabric.accelerators import CUDAAccelerator, MPSAccelerator

    return CUDAAccelerator.is_available() or MPSAccelerator.is_available()


def visible_gpus(accelerator: str) -> list[str]:
    """The CUDA devices this process may use (their CUDA_VISIBLE_DEVICES ids) when ``accelerator``
    resolves to CUDA; [] on CPU and MPS."""
    if not on_gpu(accelerator):
        return []
    import torch

    if not torch.cuda.is_available():  # MPS: one device, never split
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None and listed.strip():
        return [d.strip() for d in listed.split(",") if d.strip()][: torch.cuda.device_count()]
    return [str(i) for i in range(torch.cuda.device_count())]


def clients_per_round(cfg: RunConfig) -> int:
    """How many clients a round trains (bench/core/seeding.sample_clients)."""
    from bench.core.seeding import sample_size  # here: `fedbench bench --help` imports no torch

    return sample_size(cfg.partition.num_clients, cfg.fed.sample_ratio)


def launcher_ranks_per_node() -> int | None:
    """The processes per node that torchrun or SLURM started for this run (None without a launcher):
    under a launcher, ``devices: auto`` is its count, since the ranks already exist."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_torchelastic_launched():
        return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    from lightning.fabric.plugins.environments import SLURMEnvironment

    if SLURMEnvironment.detect() and os.environ.get("SLURM_NTASKS_PER_NODE", "").isdigit():
        return int(os.environ["SLURM_NTASKS_PER_NODE"])
    return None


def auto_layout(cfg: RunConfig, one_client: bool, clients: int, cores: int | None = None,
                can_launch: bool | None = None, gpus: int | None = None) -> tuple[int, int | None, str]:
    """(ranks, threads per rank, why) for ``devices: auto``; ``clients`` trained per round; ``gpus``
    (default: the visible CUDA devices) and ``cores``, ``can_launch`` may be given (tests)."""
    launched = launcher_ranks_per_node()
    if launched is not None:
        return launched, cfg.threads, f"{launched} rank(s) per node: the processes torchrun/SLURM started"
    cores = cpu_cores() if cores is None else cores
    can_launch = launchable() if can_launch is None else can_launch
    if gpus is None:
        gpus = len(visible_gpus(cfg.accelerator))
    if gpus or on_gpu(cfg.accelerator):
        if gpus < 2 or one_client:
            return 1, cfg.threads, "one device: " + ("the run trains one client" if one_client else "one GPU/MPS device")
        if not can_launch:
            return 1, cfg.threads, "one GPU: fedbench runs inside another program, which Fabric cannot relaunch"
        ranks = min(gpus, clients)
        return ranks, cfg.threads, f"{ranks} rank(s), one per GPU ({gpus} visible, {clients} clients per round)"
    if one_client:
        return 1, cfg.threads, "one rank: the run trains one client"
    if CPU_LAYOUT != "workers" or cores < 2:
        return 1, cfg.threads, f"one rank with all threads ({cores} core(s))"
    if not can_launch:
        return 1, cfg.threads, "one rank: fedbench runs inside another program, which Fabric cannot relaunch"
    threads = cfg.threads or 1
    ranks = max(1, min(cores // threads, clients))
    why = f"{ranks} rank(s) x {threads} thread(s): cores as client workers ({cores} cores, {clients} clients per round)"
    return ranks, threads, why


def rank_threads(cfg: RunConfig, one_client: bool) -> int | None:
    """Torch threads per rank: the config's ``threads``; else 1 on a CPU for a run that trains several
    clients (so that its numbers do not depend on how many ranks share the cores); else None (all
    cores, Lightning's choice: a GPU run, or a one-client run, which always has one rank)."""
    if cfg.threads:
        return cfg.threads
    if one_client or on_gpu(cfg.accelerator):
        return None
    return 1


def resolve_workers(cfg: RunConfig, one_client: bool) -> tuple[RunConfig, str]:
    """``cfg`` with ``devices`` (and ``threads``) resolved when devices is "auto", and how they were
    chosen; other configs are returned as they are."""
    if cfg.devices != "auto":
        return cfg, "as configured"
    ranks, threads, why = auto_layout(cfg, one_client, clients_per_round(cfg))
    out = copy.deepcopy(cfg)
    out.devices, out.threads = ranks, threads
    return out, f"devices auto: {why}"
