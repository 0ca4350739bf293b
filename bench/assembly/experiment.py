"""One experiment end to end: data -> partition -> method -> rounds (or central) -> record."""
from __future__ import annotations

import copy
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
from lightning.fabric import Fabric

from bench.assembly import rank_observer
from bench.assembly.central import as_one_client
from bench.assembly.cluster import fabric_layout
from bench.assembly.config import PRECISION_DTYPES, RunConfig
from bench.assembly.partition_plot import plot_partition
from bench.assembly.ports import port_error, prepare_master_port
from bench.assembly.records import (
    best_test_scores,
    git_commit,
    package_versions,
    rank_idle,
    summarise,
    write_run_record,
)
from bench.assembly.run_data import (
    client_splits,
    partition_plot_path,
    run_partition,
    setup_datamodule,
    to_device,
)
from bench.assembly.run_outputs import (
    RunObserver,
    attached_loggers,
    bytes_per_client_round,
    execution_record,
    log_round,
    optional_output_failed,
    process_usage,
    ranks_cpu_usage,
    run_loggers,
)
from bench.assembly.run_plan import eval_protocol, plan_rounds
from bench.assembly.speed_options import apply_speed_options, with_channels_last
from bench.assembly.validation import check_method_args, check_outputs, method_signature, validate_config
from bench.assembly.workers import rank_threads, resolve_workers, visible_gpus
from bench.core import compat
from bench.core.allocator import apply_allocator_policy
from bench.core.code_version import code_version
from bench.core.cpu_bf16 import check_cpu_bf16
from bench.core.errors import FedbenchError
from bench.core.lifetime import wait_for_children
from bench.core.numerics import apply_gpu_math
from bench.core.ranks import run_scope, set_ranks
from bench.core.seeding import INIT, derive_seed
from bench.engine.federation import Federation
from bench.engine.health import collapse_warnings, idle_option_warnings
from bench.engine.liveness import (
    WAIT_FOREVER_MINUTES,
    barrier,
    collective_timeout,
    launch_timeout,
    nccl_error_handling,
    run_ranks,
    waiting_on,
)
from datamodules.base import FederatedDataModule
from lightning_modules.base import METHODS, FederatedModule


def quiet_lightning() -> None:
    """Lightning's start-up lines at INFO ("Initializing distributed: GLOBAL_RANK ...", the "All distributed
    processes registered" banner, "GPU available: ...") are not shown; its warnings and errors are."""
    for name in ("lightning.fabric", "lightning.pytorch", "lightning_fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)


def make_fabric(cfg: RunConfig, loggers: list | None = None) -> Fabric:
    """Fabric on cfg.devices ranks per node (resolved to an int, bench/assembly/workers.py) x cfg.num_nodes nodes.
    Under torchrun or SLURM, Fabric takes the ranks from the launcher's environment
    (TorchElasticEnvironment / SLURMEnvironment; one device per task when each SLURM task sees only
    its own GPU, bench/assembly/cluster.py) and starts no process."""
    from lightning.fabric.strategies import DDPStrategy

    compat.check()  # a torch or Lightning whose internals fedbench uses have changed: one error, before any rank
    quiet_lightning()
    ranks = cfg.devices * cfg.num_nodes
    if ranks > 1:
        prepare_master_port(cfg.num_nodes)  # a busy MASTER_PORT: one line, before any rank starts
        nccl_error_handling()
        rank_observer.install()  # a rank interrupted with the others does not get rank 0 SIGKILLed
    strategy = DDPStrategy(timeout=launch_timeout(cfg.timeout)) if ranks > 1 else "auto"
    layout = fabric_layout(cfg.devices, cfg.num_nodes, len(visible_gpus(cfg.accelerator)))
    try:
        return Fabric(accelerator=cfg.accelerator, devices=layout.devices, num_nodes=layout.num_nodes,
                      strategy=strategy, precision=cfg.precision, loggers=loggers, plugins=layout.plugins or None)
    except (ValueError, RuntimeError) as err:  # what validate_config cannot foresee (e.g. a busy device)
        raise FedbenchError(f"Fabric refused accelerator={cfg.accelerator!r}, devices={cfg.devices}, "
                            f"num_nodes={cfg.num_nodes}, precision={cfg.precision!r}: {err}") from err


def wait_for_launched_ranks(fabric: Fabric) -> None:
    """In the process that launched the other ranks (Fabric's subprocess launcher): return only after
    they have exited (bench/core/lifetime.py). Elsewhere (torchrun, SLURM, one rank) nothing to wait for."""
    launcher = getattr(fabric.strategy, "launcher", None)
    procs = getattr(launcher, "procs", None) or []
    if procs:
        wait_for_children(procs)


def method_arg_names(cls: type) -> set[str]:
    return set(method_signature(cls))


def build_module(cfg: RunConfig, dm: FederatedDataModule) -> FederatedModule:
    cls = METHODS.get(cfg.method.name)
    m = cfg.method
    common = {"backbone": m.backbone, "pretrained": m.pretrained, "optimizer": m.optimizer, "lr": m.lr,
              "momentum": m.momentum, "weight_decay": m.weight_decay, "gray_stem": m.gray_stem}
    check_method_args(cfg)
    torch.manual_seed(derive_seed(cfg.seed, -1, -1, INIT))  # the initial global model
    return cls(num_classes=dm.num_classes, in_channels=dm.in_channels, class_names=list(dm.class_names),
               dataset_name=cfg.data.name, **common, **m.args)


@dataclass
class Prepared:
    """A run up to its first round: the resolved config, its Fabric, data, partition and module on the
    device with the splits the rounds use."""

    cfg: RunConfig
    layout: str
    fabric: Fabric
    own_fabric: bool
    dm: FederatedDataModule
    part: Any
    module: FederatedModule
    splits: tuple
    idle: list[str]


def quiet_library_progress() -> None:
    """No progress bar of the libraries either (transformers' "Loading weights" of a text encoder, the
    hub's downloads): their shared switch, read by huggingface_hub when first imported (and by the ranks
    Fabric starts, which inherit it), and transformers' own when it is already loaded."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.disable_progress_bar()
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].utils.disable_progress_bars()


def resolve_run(cfg: RunConfig, fabric: Fabric | None) -> tuple[RunConfig, str]:
    """Validate ``cfg`` and resolve where it runs: (config with devices/threads set, how they were chosen);
    the process's threads and CUDA float32 flags are set here."""
    validate_config(cfg)
    if fabric is None:
        one_client = METHODS.get(cfg.method.name).runs_centrally
        cfg, layout = resolve_workers(cfg, one_client)
        if cfg.devices * cfg.num_nodes > 1:
            prepare_master_port(cfg.num_nodes)  # a busy MASTER_PORT the user set: refused before any work
        threads = rank_threads(cfg, one_client)
        if cfg.threads is None and threads is not None:
            cfg = copy.deepcopy(cfg)
            cfg.threads = threads
            layout += f"; {threads} torch thread per rank (results do not depend on the rank count; --threads N)"
    else:  # the caller's Fabric decides
        cfg, layout = copy.deepcopy(cfg), "the caller's Fabric"
        cfg.devices = fabric.world_size
    check_outputs(cfg)
    if not cfg.progress:
        quiet_library_progress()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device_type = fabric.device.type if fabric is not None else ("cuda" if visible_gpus(cfg.accelerator) else "cpu")
    apply_gpu_math(cfg.gpu_math, device_type)
    return cfg, layout


def launch(fabric: Fabric) -> Fabric:
    """``fabric.launch()``; rank 0 failing to listen on MASTER_PORT (taken since make_fabric checked it)
    is one line naming the port (bench/assembly/ports.py), not torch's DistNetworkError traceback."""
    try:
        fabric.launch()
    except Exception as err:
        busy = port_error(err)
        if busy is None:
            raise
        raise busy from None
    return fabric


def launch_with_data(cfg: RunConfig, fabric: Fabric | None):
    """(fabric, datamodule, partition). Without a caller's Fabric the data and partition come first, in
    the launching process, so that their errors are printed once, before any other rank starts."""
    if fabric is None:
        dm = setup_datamodule(cfg)
        part = run_partition(cfg, dm)
        fabric = launch(make_fabric(cfg))
        if cfg.threads:  # Fabric's launcher sets cores // ranks threads unless OMP_NUM_THREADS is set
            torch.set_num_threads(cfg.threads)
        return fabric, dm, part
    with waiting_on(fabric, "rank 0 to load the dataset"), fabric.rank_zero_first():
        dm = setup_datamodule(cfg)
    return fabric, dm, run_partition(cfg, dm)


def module_on_device(cfg: RunConfig, dm: FederatedDataModule, fabric: Fabric) -> tuple[FederatedModule, tuple, list[str]]:
    """(module, (train, val, test) as the rounds see them, idle-option warnings): the module built, warned
    about options that never act (printed now, by rank 0), moved to the device in the run's precision with
    its speed options, and the splits on the device through the module's ``prepare_splits``."""
    set_ranks(run_ranks(fabric))  # what the method sees of the ranks (bench/core/ranks.py), for this run
    module = build_module(cfg, dm)
    check_cpu_bf16(cfg.precision, fabric.device.type, module, module.features, tuple(dm.train.images.shape[1:]))
    idle = idle_option_warnings(cfg.fed.rounds, cfg.fed.lr_milestones, module)
    if fabric.global_rank == 0:
        for warning in idle:  # at the start, so that a user can stop a run that cannot show what it should
            print(f"fedbench: warning: {cfg.run_name()}: {warning}", flush=True)
    fabric.to_device(module)
    dtype = getattr(torch, PRECISION_DTYPES.get(cfg.precision, "float32"))  # bf16-mixed: float32 weights under autocast
    if dtype != torch.float32:  # built in float32 (the same initial weights), then converted
        module.to(dtype)
    apply_speed_options(module, cfg.channels_last, cfg.compile)
    splits = (None if s is None else with_channels_last(to_device(s, dm, fabric.device, dtype), cfg.channels_last)
              for s in (dm.train, dm.val, dm.test))
    return module, module.prepare_splits(*splits), idle


def prepare_run(cfg: RunConfig, fabric: Fabric | None) -> Prepared:
    cfg, layout = resolve_run(cfg, fabric)
    own_fabric = fabric is None
    fabric, dm, part = launch_with_data(cfg, fabric)
    module, splits, idle = module_on_device(cfg, dm, fabric)
    return Prepared(cfg, layout, fabric, own_fabric, dm, part, module, splits, idle)


def federate(run: Prepared, observer: RunObserver, started: float, usage_at_start: torch.Tensor):
    """The rounds: (Federation, protocol, history, each rank's CPU usage, bytes per client and round).
    The observer hears every round, and the run's end with exit code 1 when it raises."""
    cfg, module, fabric, dm = run.cfg, run.module, run.fabric, run.dm
    train, val, test = run.splits
    try:
        protocol = eval_protocol(cfg, module)
        if module.runs_centrally:  # a federation of one client holding all the training data
            fed_cfg, clients = as_one_client(cfg, len(train.labels), fabric.device)
        else:
            fed_cfg = cfg
            clients = client_splits(cfg, run.part.client_indices, dm.train, protocol == "per_client", fabric.device,
                                    dm.test, test)
        fed = Federation(fabric, plan_rounds(fed_cfg, protocol), module, train, clients, val, test)
        fed.checkpointer.session_start, fed.checkpointer.data_fingerprint = started, dm.fingerprint
        per_client = bytes_per_client_round(module)
        fed.on_round_end = lambda e: log_round(fabric, observer, e, per_client)
        fed.on_round_done = observer.round_done
        observer.federation_built(fed)
        # A rank that owns no client (Central on several ranks: its one client lives on rank 0) only waits
        # while the others train, so it must not give up after --timeout.
        with collective_timeout(fabric, cfg.timeout if fed.owned else WAIT_FOREVER_MINUTES):
            history = fed.run()
            cpu = ranks_cpu_usage(fabric, usage_at_start)
    except BaseException:
        observer.finish(exit_code=1)
        raise
    return fed, protocol, history, cpu, per_client


def build_record(run: Prepared, fed: Federation, protocol: str, history: list[dict], cpu: dict, per_client: dict,
                 started: float, annotations: dict[str, Any] | None) -> dict[str, Any]:
    """The run record: config, versions, data, partition, history with its summary, execution, warnings."""
    cfg, dm, module, fabric = run.cfg, run.dm, run.module, run.fabric
    counts = run.part.counts(dm.train.labels.numpy(), dm.num_classes)
    record = {
        "run_name": cfg.run_name(), "experiment": cfg.experiment, "config": cfg.to_dict(), "git_commit": git_commit(),
        "code_version": code_version(cfg), "versions": package_versions(),
        "method": cfg.method.name, "dataset": cfg.data.name, "data_root": dm.root, **(annotations or {}),
        "protocol": protocol, "world_size": fabric.world_size,
        "num_classes": dm.num_classes, "class_names": list(dm.class_names),
        "backbone": module.describe_backbone(),
        **({"prompts": module.prompt_info} if module.prompt_info is not None else {}),
        "partition": {**run.part.to_json(), "counts": counts.tolist()},
        "splits": {"train": len(dm.train), "val": 0 if dm.val is None else len(dm.val), "test": len(dm.test)},
        # per class, the global test set's images: Acc equals balanced Acc when they are all equal
        "test_class_counts": torch.bincount(dm.test.labels.long(), minlength=dm.num_classes).tolist(),
        "bytes_per_client_round": per_client,
        "history": history, **summarise(history, protocol),
        "wall_seconds": fed.checkpointer.elapsed() if fed is not None else time.time() - started,
        "execution": {**execution_record(fabric, cfg.precision), "layout": run.layout, "rank_idle": rank_idle(history),
                      "cpu": cpu},
    }
    resumed = fed.checkpointer.resumed if fed is not None else None
    if resumed:
        record["resumed"] = resumed
        if resumed.get("forced_differences"):
            record["resumed_with_force"] = resumed["forced_differences"]
    record["warnings"] = run.idle + collapse_warnings(record, module.trains)
    return record


def write_outputs(run: Prepared, record: dict[str, Any]) -> None:
    """Rank 0: the record (and final state), where find_record finds them, then the partition heatmap
    (once per partition; a heatmap that cannot be written is a warning); then every rank waits."""
    cfg, fabric, dm, p = run.cfg, run.fabric, run.dm, run.cfg.partition
    if fabric.global_rank == 0:
        state = {k: v.detach().cpu() for k, v in run.module.state_dict().items()} if cfg.save_final_state else None
        try:
            write_run_record(cfg, record, state)  # first; never over a record of another configuration
        except OSError as err:  # a full disk (NoSpaceError names it): the scores are not lost with the file
            raise FedbenchError(f"{cfg.run_name()}: the run finished but its record was not written: {err}. "
                                f"Its best scores: {best_test_scores(record)}. Free space and run it again"
                                + (" with --resume true (its last checkpoint is kept)." if cfg.checkpoint_every
                                   else ".")) from err
        heatmap = partition_plot_path(cfg)
        if not heatmap.exists():  # one per partition, shared by every method run on it
            counts = run.part.counts(dm.train.labels.numpy(), dm.num_classes)
            try:
                plot_partition(counts, str(heatmap), list(dm.class_names),
                               title=f"{cfg.data.name} {p.scheme} {p.described_args()} seed={cfg.seed}")
            except OSError as err:
                optional_output_failed(f"the partition heatmap {heatmap}", err)
    barrier(fabric, "rank 0 to write the record")


def run_experiment(cfg: RunConfig, fabric: Fabric | None = None, observer: RunObserver | None = None,
                   annotations: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one experiment on ``fabric`` (made from cfg and launched when not given); returns the record.
    ``observer`` receives the per-round metrics, the final record and the end of the run (W&B logging:
    the caller passes bench.tracking.wandb_logger.wandb_observer(cfg)). ``annotations``: extra record
    entries, e.g. a table's command-line overrides (the table runner gives them to its W&B observer too)."""
    apply_allocator_policy()  # once per process; a no-op when the CLI did it
    with run_scope():
        return run_in_scope(cfg, fabric, observer, annotations)


def run_in_scope(cfg: RunConfig, fabric: Fabric | None, observer: RunObserver | None,
                 annotations: dict[str, Any] | None) -> dict[str, Any]:
    usage_at_start = process_usage()
    started = time.time()
    run = prepare_run(cfg, fabric)
    observer = observer or RunObserver()
    observer.start(run.cfg, run.fabric.global_rank)
    loggers = run_loggers(run.cfg) + observer.loggers() if run.fabric.global_rank == 0 else []
    with attached_loggers(run.fabric, loggers):
        fed, protocol, history, cpu, per_client = federate(run, observer, started, usage_at_start)
    record = build_record(run, fed, protocol, history, cpu, per_client, started, annotations)
    if run.fabric.global_rank == 0:
        for warning in record["warnings"]:
            print(f"fedbench: warning: {run.cfg.run_name()}: {warning}", file=sys.stderr, flush=True)
    observer.summary(record)
    observer.finish()
    write_outputs(run, record)
    if run.own_fabric:
        wait_for_launched_ranks(run.fabric)
    return record
