"""One experiment end to end: data -> partition -> method -> rounds (or central) -> record."""
from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import math
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.fabric import Fabric
from lightning.fabric.loggers import CSVLogger, Logger

from bench import rank_observer
from bench.central import as_one_client
from bench.cluster import fabric_layout
from bench.code_version import code_version
from bench.config import PRECISION_DTYPES, RunConfig
from bench.core import compat
from bench.core.allocator import allocator_status, apply_allocator_policy
from bench.core.batches import DeviceData
from bench.core.cpu_bf16 import check_cpu_bf16
from bench.core.errors import FedbenchError, PartitionError
from bench.core.lifetime import wait_for_children
from bench.core.numerics import apply_gpu_math, gpu_math_settings
from bench.core.ranks import run_scope, set_ranks
from bench.core.seeding import INIT, derive_seed
from bench.federation import ClientSplit, Federation
from bench.health import collapse_warnings, idle_option_warnings
from bench.liveness import (
    WAIT_FOREVER_MINUTES,
    barrier,
    collective_timeout,
    launch_timeout,
    nccl_error_handling,
    run_ranks,
    waiting_on,
)
from bench.partition_plot import plot_partition
from bench.ports import port_error, prepare_master_port
from bench.records import (
    best_test_scores,
    git_commit,
    package_versions,
    rank_idle,
    summarise,
    write_run_record,
)
from bench.run_plan import eval_protocol, plan_rounds
from bench.speed_options import apply_speed_options, with_channels_last
from bench.validation import check_method_args, check_outputs, method_signature, validate_config
from bench.workers import rank_threads, resolve_workers, visible_gpus
from datamodules.base import DATASETS, FederatedDataModule
from datamodules.data_home import data_home
from datamodules.partition import partition
from datamodules.splits import stratified_split, stratified_subset
from datamodules.tensors import TensorSplit
from lightning_modules.base import METHODS, FederatedModule, needs_loss_scaling


class RunObserver:
    """What a caller watches of a run: run_experiment calls it on every rank (an observer that logs
    acts on rank 0). This one does nothing; W&B's is bench.reporting.wandb_logger.WandbObserver,
    which the CLI and the table runner pass when cfg.wandb is set."""

    def start(self, cfg: RunConfig, rank: int) -> None:
        """The run's data and model are built; ``rank`` is this process's global rank."""

    def loggers(self) -> list[Logger]:
        """Fabric loggers this observer adds to the run (after ``start``; W&B's on rank 0): every round's
        scalars reach them, with the CSV and TensorBoard loggers, through ``fabric.log_dict``."""
        return []

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """The scalars of round ``step`` (what the run's Fabric loggers received)."""

    def summary(self, record: dict[str, Any]) -> None:
        """The finished run's record, before it is written."""

    def finish(self, exit_code: int = 0) -> None:
        """The run is over: exit code 0 after ``summary``, 1 when it raised."""


def quiet_lightning() -> None:
    """Lightning's start-up lines at INFO ("Initializing distributed: GLOBAL_RANK ...", the "All distributed
    processes registered" banner, "GPU available: ...") are not shown; its warnings and errors are."""
    for name in ("lightning.fabric", "lightning.pytorch", "lightning_fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)


def make_fabric(cfg: RunConfig, loggers: list | None = None) -> Fabric:
    """Fabric on cfg.devices ranks per node (resolved to an int, bench/workers.py) x cfg.num_nodes nodes.
    Under torchrun or SLURM, Fabric takes the ranks from the launcher's environment
    (TorchElasticEnvironment / SLURMEnvironment; one device per task when each SLURM task sees only
    its own GPU, bench/cluster.py) and starts no process."""
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


def partition_of(cfg: RunConfig, labels: np.ndarray, groups: np.ndarray | None):
    p = cfg.partition
    return partition(labels, p.scheme, p.num_clients, cfg.seed, beta=p.beta, shards_per_client=p.shards_per_client,
                     min_size=p.min_size, groups=groups, missing_prob=p.missing_prob, shard_mode=p.shard_mode,
                     client_proportions=p.proportions)


def run_partition(cfg: RunConfig, dm: FederatedDataModule):
    """The run's partition of dm's training split. When data.max_train_samples kept too few samples for
    it, the error says so and names the smallest cap (of a geometric ladder from clients x min_size
    up) whose partition succeeds."""
    groups = None if dm.train.groups is None else dm.train.groups.numpy()
    try:
        return partition_of(cfg, dm.train.labels.numpy(), groups)
    except PartitionError as err:
        cap = cfg.data.max_train_samples
        if not cap or groups is not None:
            raise
        works = smallest_working_cap(cfg)
        fix = (f"--data.max_train_samples {works} works (the smallest of clients x min_size x 1.25^k that does)" if works else
               "no cap up to the whole training split works: use fewer clients or a smaller partition.min_size")
        raise PartitionError(f"data.max_train_samples {cap} keeps {len(dm.train)} training samples, too few for "
                             f"this partition ({err}) {fix}.") from err


def smallest_working_cap(cfg: RunConfig) -> int | None:
    """The smallest data.max_train_samples in needed x 1.25^k (needed = clients x min_size) whose
    training split partitions without error, or None."""
    uncapped = copy.deepcopy(cfg)
    uncapped.data.max_train_samples = None
    dm = setup_datamodule(uncapped)  # the decode cache: no second decode
    full = dm.train.labels.numpy()
    p = cfg.partition
    cap = max(cfg.data.max_train_samples + 1, p.num_clients * max(1, p.min_size))
    while cap < len(full):
        try:
            partition_of(cfg, full[stratified_subset(full, cap, dm.split_seed)], None)
            return cap
        except PartitionError:
            cap = int(cap * 1.25) + 1
    return None


def wait_for_launched_ranks(fabric: Fabric) -> None:
    """In the process that launched the other ranks (Fabric's subprocess launcher): return only after
    they have exited (bench/core/lifetime.py). Elsewhere (torchrun, SLURM, one rank) nothing to wait for."""
    launcher = getattr(fabric.strategy, "launcher", None)
    procs = getattr(launcher, "procs", None) or []
    if procs:
        wait_for_children(procs)


def build_datamodule(cfg: RunConfig) -> FederatedDataModule:
    d = cfg.data
    return DATASETS.get(d.name)(root=d.root, image_size=d.image_size, cache_dir=d.cache_dir,
                               max_train_samples=d.max_train_samples, max_test_samples=d.max_test_samples,
                               val_fraction=d.val_fraction, run_seed=cfg.seed, client_split_file=d.client_split_file,
                               fold=d.fold, folds=d.folds)


def setup_datamodule(cfg: RunConfig) -> FederatedDataModule:
    """The run's datamodule, decoded. With ``data.test_dataset`` (transfer evaluation, FACMIC Table 5)
    the test split is every image of that dataset (read from ``data.test_root`` at the run's image
    size; it must have the same classes), and the run's own test split becomes its validation split:
    the model is selected on its own dataset's test images (best-val-acc: the round FACMIC's main.py
    saves, its best accuracy on the training dataset's test folder) and scored on the other dataset."""
    dm = build_datamodule(cfg)
    dm.setup()
    d = cfg.data
    if d.test_dataset:
        test_root = d.test_root
        if test_root and not Path(test_root).expanduser().is_absolute() and not Path(test_root).exists():
            test_root = str(data_home() / test_root)  # a relative test_root names a folder of the data home
        other = DATASETS.get(d.test_dataset)(root=test_root, image_size=dm.image_size, cache_dir=d.cache_dir)
        other.setup()
        if list(other.class_names) != list(dm.class_names) or other.in_channels != dm.in_channels:
            raise FedbenchError(f"data.test_dataset {d.test_dataset!r} has classes {list(other.class_names)} "
                                f"({other.in_channels} channels); the run trains on {list(dm.class_names)} "
                                f"({dm.in_channels}): a model can only be tested on the classes it was trained on.")
        splits = [other.train, other.val, other.test]
        dm.val = dm.test
        dm.test = TensorSplit(torch.cat([s.images for s in splits]), torch.cat([s.labels for s in splits]))
        dm.fingerprint = f"{dm.fingerprint}+{other.fingerprint}"
    return dm


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


def to_device(split: TensorSplit, dm: FederatedDataModule, device, dtype: torch.dtype = torch.float32) -> DeviceData:
    """The split on the device; its batches come out in ``dtype`` (the normalisation tensors' dtype)."""
    mean, std = dm.normalisation(device)
    return DeviceData(split.images.to(device), split.labels.to(device), mean.to(dtype), std.to(dtype),
                      origin=split.origin)


def site_test_splits(train: TensorSplit, test: TensorSplit, num_clients: int) -> list[np.ndarray]:
    """Each client's test samples under ``fed.client_test: site``: the test split's samples of its site
    (client c of the natural partition is the c-th site in sorted order, datamodules/partition.py)."""
    if train.groups is None or test.groups is None:
        raise PartitionError("fed.client_test site needs a site id for every train and test sample, which this "
                             "dataset does not give; use fed.client_test carved.")
    sites = np.unique(train.groups.numpy())
    if len(sites) != num_clients:
        raise PartitionError(f"fed.client_test site: {len(sites)} sites in the training data for {num_clients} "
                             "clients (the natural partition has one client per site).")
    test_groups = test.groups.numpy()
    out = []
    for c, site in enumerate(sites):
        idx = np.flatnonzero(test_groups == site)
        if len(idx) == 0:
            raise PartitionError(f"fed.client_test site: client {c} (site {site}) has no sample in the test split; "
                                 "use fed.client_test carved.")
        out.append(idx)
    return out


def client_splits(cfg: RunConfig, parts: list, train: TensorSplit, per_client: bool, device,
                  test: TensorSplit | None = None, test_data: DeviceData | None = None) -> list[ClientSplit]:
    """Each client's training indices and, for the per-client protocol, its own test split: carved from its
    training share (``fed.client_test: carved``) or the test split's samples of its site (``site``: ``test``
    gives the sites, ``test_data`` is the device split the indices refer to)."""
    out = []
    labels = train.labels.numpy()
    site_tests = None
    if per_client and cfg.fed.client_test == "site":
        if test is None or test_data is None:
            raise FedbenchError("fed.client_test site: the test split is needed to find each site's samples.")
        site_tests = site_test_splits(train, test, len(parts))
    for c, idx in enumerate(parts):
        if len(idx) == 0:
            raise PartitionError(f"Client {c} received no samples; use fewer clients or a larger partition.min_size.")
        if site_tests is not None:
            out.append(ClientSplit(torch.as_tensor(idx, device=device),
                                   torch.as_tensor(site_tests[c], device=device), test_data))
        elif per_client:
            f = cfg.fed.client_test_fraction
            tr, te = stratified_split(labels[idx], [1 - f, f], seed=derive_seed(cfg.seed, -1, c, INIT) % 2**32)
            if len(tr) == 0 or len(te) == 0:
                raise PartitionError(f"Client {c} has {len(idx)} samples: too few for a {1 - f:.0%}/{f:.0%} "
                                     "train/test split; raise partition.min_size.")
            out.append(ClientSplit(torch.as_tensor(idx[tr], device=device), torch.as_tensor(idx[te], device=device)))
        else:
            out.append(ClientSplit(torch.as_tensor(idx, device=device)))
    return out


def partition_plot_path(cfg: RunConfig) -> Path:
    """The client-by-class heatmap of a run's partition (it does not depend on the method)."""
    d = cfg.data
    parts = [d.name, d.root, d.max_train_samples, d.val_fraction, cfg.to_dict()["partition"], cfg.seed]
    key = json.dumps(parts + ([d.client_split_file] if d.client_split_file else [])
                     + ([d.fold, d.folds] if d.fold is not None else []))
    name = cfg.run_name().split("_", 1)[1]  # the run name without the method
    return (Path(cfg.output_dir) / cfg.experiment / "partitions"
            / f"{name}_{hashlib.sha1(key.encode()).hexdigest()[:8]}.png")


def bytes_per_client_round(module: FederatedModule) -> dict[str, int]:
    """What one client receives (the shared state) and sends (it plus the method's extra uploads, as
    float32 on the wire) per round."""
    shared = set(module.shared_keys())
    shared_bytes = sum(t.numel() * t.element_size() for k, t in module.state_dict().items() if k in shared)
    extra_bytes = 4 * sum(math.prod(s) for s in module.upload_shapes().values())
    return {"down": shared_bytes, "up": shared_bytes + extra_bytes}


def round_scalars(entry: dict, per_client: dict[str, int]) -> dict[str, float]:
    """Everything a round's history entry says, as flat scalars for a per-round logger (W&B): its
    evaluation metrics (evaluated rounds), lr, seconds, clients and samples trained, bytes moved."""
    clients = len(entry["clients"])
    loss = {} if entry.get("train_loss") is None else {"train/loss": entry["train_loss"]}
    loss.update({f"method/{k}": v for k, v in (entry.get("method_scalars") or {}).items()})
    return {**(entry.get("metrics") or {}), **loss, "lr": entry["lr"], "time/round_seconds": entry["round_seconds"],
            "time/train_seconds": entry["train_seconds"], "time/eval_seconds": entry["eval_seconds"],
            "clients_trained": clients, "samples_trained": entry["samples_trained"],
            "comm/bytes_down": per_client["down"] * clients, "comm/bytes_up": per_client["up"] * clients}


def run_loggers(cfg: RunConfig) -> list[Logger]:
    """The run's own Fabric loggers: CSV (always), under <output_dir>/<experiment>/csv/<run name>, and
    TensorBoard (cfg.tensorboard; validate_config checks the package is there) under .../tensorboard."""
    run_dir = Path(cfg.output_dir) / cfg.experiment
    out: list[Logger] = [CSVLogger(root_dir=str(run_dir / "csv"), name=cfg.run_name())]
    if cfg.tensorboard:
        from lightning.fabric.loggers import TensorBoardLogger

        out.append(TensorBoardLogger(root_dir=str(run_dir / "tensorboard"), name=cfg.run_name()))
    return out


@contextlib.contextmanager
def attached_loggers(fabric: Fabric, loggers: list[Logger]):
    """``loggers`` in ``fabric.loggers`` for the body (a table's runs share one launched Fabric, each with
    its own loggers); on leaving, each is finalized ("success", or "failed" when the body raised; the CSV
    file is written then) and taken out again."""
    fabric.loggers.extend(loggers)
    status = "failed"
    try:
        yield
        status = "success"
    finally:
        for logger in loggers:
            fabric.loggers.remove(logger)
            try:
                logger.finalize(status)
            except OSError as err:  # a full disk: the per-round CSV is a copy of what the record holds
                optional_output_failed(f"the {type(logger).__name__} log under {logger.log_dir}", err)


def optional_output_failed(what: str, err: BaseException) -> None:
    """An output the record does without (a plot, a CSV log) could not be written: one warning line."""
    print(f"fedbench: warning: {what} was not written ({err}); the run's record is written all the same.",
          file=sys.stderr, flush=True)


def log_round(fabric: Fabric, observer: RunObserver, entry: dict, per_client: dict[str, int]) -> None:
    """A finished round's scalars (round_scalars, with ``round``) to every Fabric logger, at step = round,
    and to the observer. Host floats from the round's history entry: no device sync, no collective (the
    loggers write on rank 0 only)."""
    scalars = {**round_scalars(entry, per_client), "round": entry["round"]}
    try:
        fabric.log_dict(scalars, step=entry["round"])
    except OSError as err:  # the CSV logger flushes every 100 steps: a full disk there must not end the run
        optional_output_failed(f"the loggers' copy of round {entry['round']}", err)
    observer.log(scalars, step=entry["round"])


def execution_record(fabric: Fabric, precision: str) -> dict[str, Any]:
    """How this run executed: ranks, torch threads per rank, the C allocator's policy
    (bench/core/allocator.py), the device, the precision and the CUDA float32 flags in effect
    (bench/core/numerics.py), with whether float16 losses were scaled."""
    return {"ranks": fabric.world_size, "threads_per_rank": torch.get_num_threads(),
            "allocator": allocator_status(), "device": str(fabric.device), "precision": precision,
            "loss_scaling": needs_loss_scaling(precision, fabric.device), "math": gpu_math_settings(),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled()}


USAGE_FIELDS = ("user_seconds", "system_seconds", "minor_faults", "major_faults")


def process_usage() -> torch.Tensor:
    """This process's CPU time (user, system, seconds) and page faults (minor, major) so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return torch.tensor([r.ru_utime, r.ru_stime, r.ru_minflt, r.ru_majflt], dtype=torch.float64)


def ranks_cpu_usage(fabric: Fabric, since: torch.Tensor) -> dict[str, list[float]]:
    """Each rank's CPU time and page faults since ``since`` (its own ``process_usage`` at the start of
    the run), gathered with one all-reduce: what the whole run cost the machine, rank by rank."""
    table = torch.zeros(fabric.world_size, len(USAGE_FIELDS), dtype=torch.float64, device=fabric.device)
    table[fabric.global_rank] = (process_usage() - since).to(fabric.device)
    if fabric.world_size > 1:
        with waiting_on(fabric, "the CPU-usage all-reduce at the end of the run"):
            fabric.all_reduce(table, reduce_op="sum")
    return {name: table[:, i].tolist() for i, name in enumerate(USAGE_FIELDS)}


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
    is one line naming the port (bench/ports.py), not torch's DistNetworkError traceback."""
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
                               title=f"{cfg.data.name} {p.scheme} beta={p.beta:g} seed={cfg.seed}")
            except OSError as err:
                optional_output_failed(f"the partition heatmap {heatmap}", err)
    barrier(fabric, "rank 0 to write the record")


def run_experiment(cfg: RunConfig, fabric: Fabric | None = None, observer: RunObserver | None = None,
                   annotations: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one experiment on ``fabric`` (made from cfg and launched when not given); returns the record.
    ``observer`` receives the per-round metrics, the final record and the end of the run (W&B logging:
    the caller passes bench.reporting.wandb_logger.wandb_observer(cfg)). ``annotations``: extra record
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
