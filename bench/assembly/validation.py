"""Every option of a run checked before any work starts: types, ranges, precision, accelerator,
``method.args`` against the method's signature, and writable output folders.

Each check raises one FedbenchError naming the option, what it must be and the value given.
"""
from __future__ import annotations

import inspect
import math
import shutil
import tempfile
import typing
from pathlib import Path
from typing import Any

from bench.assembly.config import OPTION_GROUPS, PRECISION_DTYPES, RunConfig
from bench.core import compat
from bench.core.errors import FedbenchError, PartitionError
from bench.core.option_types import describe, matches
from bench.core.paths import plain_name
from datamodules.base import DATASETS, splittable_datasets
from datamodules.partition import check_per_class_shards, scheme_options
from datamodules.partitions import PARTITION_SCHEMES
from datamodules.tensors import human_bytes, machine_memory
from lightning_modules.base import METHODS, FederatedModule
from lightning_modules.components.prompts import load_prompt_file, match_concepts

# 64-true/32-true: the dtype fedbench sets; the mixed ones: Fabric's autocast (16-mixed on CUDA only)
SUPPORTED_PRECISIONS = (*PRECISION_DTYPES, "bf16-mixed", "16-mixed")

MIN_IMAGE_SIZE = 8  # the smallest size the backbones (simple CNN, ResNet, EfficientNet) are built for
# arguments build_module fills itself (from the data and the method options), never from method.args
FILLED_BY_BUILDER = frozenset({"num_classes", "in_channels", "class_names", "dataset_name", "backbone", "pretrained",
                               "optimizer", "lr", "momentum", "weight_decay", "gray_stem"})


# ---- types (bench/core/option_types.py: matches, describe) ------------------------------------------
def check_value(name: str, value: Any, hint: Any) -> None:
    if not matches(value, hint):
        raise FedbenchError(f"{name} must be {describe(hint)}, got {value!r} ({type(value).__name__}).")


def check_field_types(cfg: RunConfig) -> None:
    """Every option has the type its dataclass declares (configs from YAML tables are not parsed by
    jsonargparse, so a quoted number or a typo'd value would otherwise surface mid-run)."""
    groups = [("", cfg, RunConfig)] + [(f"{name}.", getattr(cfg, name), cls) for name, cls in OPTION_GROUPS.items()]
    for prefix, obj, cls in groups:
        for field, hint in typing.get_type_hints(cls).items():
            if field not in OPTION_GROUPS:
                check_value(f"{prefix}{field}", getattr(obj, field), hint)


# ---- method.args ---------------------------------------------------------------------------------
def option_sources(cls: type) -> list:
    """Where a method's options are declared, most specific first: its classes' constructors (subclass
    first), then its objective terms' (``objective_terms``, e.g. NPR's)."""
    classes = [k.__init__ for k in cls.__mro__ if isinstance(k, type) and issubclass(k, FederatedModule)]
    return classes + list(cls.objective_terms)


def method_signature(cls: type) -> dict[str, inspect.Parameter]:
    """The keyword parameters a method accepts, over its class hierarchy and its parts."""
    params: dict[str, inspect.Parameter] = {}
    for source in option_sources(cls):
        for p in inspect.signature(source).parameters.values():
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                params.setdefault(p.name, p)
    for key, default in cls.term_defaults.items():  # a composed method's own defaults
        params[key] = params[key].replace(default=default)
    return params


def method_hints(cls: type) -> dict[str, Any]:
    """The annotations of the keyword parameters (resolved per source, the most specific winning)."""
    hints: dict[str, Any] = {}
    for source in reversed(option_sources(cls)):
        try:
            resolved = typing.get_type_hints(source.__init__ if isinstance(source, type) else source)
        except Exception:  # noqa: BLE001 - an annotation that cannot be resolved is not checked
            resolved = {}
        hints.update(resolved)
    return hints


def check_method_args(cfg: RunConfig) -> None:
    """Unknown ``method.args`` keys and values of the wrong type, named with what the method accepts."""
    m = cfg.method
    cls = METHODS.get(m.name)
    if not isinstance(m.args, dict):
        raise FedbenchError(f"method.args must be a mapping of {m.name!r}'s options, got {m.args!r}.")
    params = method_signature(cls)
    own = sorted(set(params) - FILLED_BY_BUILDER - {"betas"})
    unknown = sorted(set(m.args) - set(params))
    if unknown:
        raise FedbenchError(f"method.args for {m.name!r} has unknown option(s) {unknown}; "
                            f"{m.name!r} accepts: {own or 'no extra options'}.")
    if reserved := sorted(set(m.args) & FILLED_BY_BUILDER):
        raise FedbenchError(f"method.args sets {reserved}: these come from the data or the method's own options "
                            f"(e.g. --method.{reserved[0]}), not from method.args.")
    hints = method_hints(cls)
    for key, value in m.args.items():
        hint = hints.get(key)
        if hint is None and params[key].default not in (inspect.Parameter.empty, None):
            hint = float if type(params[key].default) is float else type(params[key].default)
        if hint is not None:
            check_value(f"method.args.{key} of {m.name!r}", value, hint)


# ---- method.args.prompts ------------------------------------------------------------------------
def check_prompts(cfg: RunConfig) -> None:
    """A prompts file (``method.args.prompts``) is readable, well formed, and names exactly the dataset's
    classes (read from the folder names for class-folder: no image is decoded)."""
    path = cfg.method.args.get("prompts") if isinstance(cfg.method.args, dict) else None
    if not isinstance(path, str):
        return
    file = load_prompt_file(path)
    if file.concepts:
        match_concepts(file, cfg.data.name, dataset_class_names(cfg))


def dataset_class_names(cfg: RunConfig) -> list[str]:
    """The dataset's class names without decoding an image (folder names, for class-folder)."""
    d = cfg.data
    return list(DATASETS.get(d.name)(root=d.root, cache_dir=d.cache_dir).class_names)


# ---- fed.protocol --------------------------------------------------------------------------------
def check_protocol(cfg: RunConfig) -> None:
    """A method that trains one model on the pooled data is scored globally only; a run without a
    validation split (data.val_fraction 0) or with its clients' test splits from their sites
    (fed.client_test site) must be scored per client."""
    cls = METHODS.get(cfg.method.name)
    if cfg.data.client_split_file is not None and DATASETS.get(cfg.data.name).client_split_format is None:
        raise FedbenchError(f"data.client_split_file is a published client split, which {cfg.data.name!r} does not "
                            f"read (only {', '.join(splittable_datasets())}); leave it unset.")
    if cls.runs_centrally and cfg.fed.protocol not in (None, "global"):
        raise FedbenchError(f"{cfg.method.name!r} trains one model on the pooled data: fed.protocol "
                            f"{cfg.fed.protocol!r} does not apply (leave it unset).")
    protocol = cfg.scored_protocol(cls.protocol, cls.runs_centrally)
    if cfg.data.val_fraction == 0 and protocol != "per_client":
        raise FedbenchError(f"data.val_fraction 0 leaves no validation split, which the {protocol!r} protocol of "
                            f"{cfg.method.name!r} uses: set it in (0, 1), or score the run per client "
                            "(fed.protocol per_client).")
    if cfg.fed.client_test == "site":
        if protocol != "per_client":
            raise FedbenchError(f"fed.client_test site gives each client its own test split, which only the "
                                f"per-client protocol uses ({cfg.method.name!r} is scored {protocol!r}): set "
                                "fed.protocol per_client, or leave fed.client_test at 'carved'.")
        if cfg.partition.scheme != "natural":
            raise FedbenchError(f"fed.client_test site takes each client's test split from its site, which needs "
                                f"the natural partition (one client per site), not {cfg.partition.scheme!r}: set "
                                "partition.scheme natural, or fed.client_test carved.")


# ---- data.fold, method.gray_stem ----------------------------------------------------------------
def check_folds(cfg: RunConfig) -> None:
    """K-fold cross-validation: K >= 2, the fold in 0..K-1, a dataset that may be re-split (no fixed official
    test split, or one a paper cross-validates: datamodules/base.py ``cross_validation``), and the run's own
    test split (not another dataset's)."""
    d = cfg.data
    if d.fold is None:
        if d.folds != 5:
            raise FedbenchError(f"data.folds {d.folds} is set but data.fold is not: name the fold to test on "
                                f"(--data.fold 0..{d.folds - 1}), or drop data.folds.")
        return
    require(d.folds >= 2, "data.folds", ">= 2 (K-fold cross-validation)", d.folds)
    require(0 <= d.fold < d.folds, "data.fold", f"in 0..{d.folds - 1} (the fold tested, of data.folds {d.folds})",
            d.fold)
    if DATASETS.get(d.name).cross_validation is None:
        raise FedbenchError(f"data.fold: dataset {d.name!r} has a fixed official test split, which K-fold "
                            "cross-validation would replace (no paper does that for it); leave data.fold unset.")
    if d.test_dataset is not None:
        raise FedbenchError(f"data.fold cross-validates the run's own dataset, but data.test_dataset "
                            f"{d.test_dataset!r} tests on another one: use one or the other.")


def check_gray_stem(cfg: RunConfig) -> None:
    """``method.gray_stem fresh`` re-initialises the stem of a backbone built by name, for 1-channel data."""
    if cfg.method.gray_stem == "sum":
        return
    if METHODS.get(cfg.method.name).build_backbone is not FederatedModule.build_backbone:
        raise FedbenchError(f"method.gray_stem {cfg.method.gray_stem!r}: {cfg.method.name!r} brings its own "
                            "encoder (no ImageNet stem to replace); leave method.gray_stem at 'sum'.")
    channels = DATASETS.get(cfg.data.name).in_channels
    if channels != 1:
        raise FedbenchError(f"method.gray_stem {cfg.method.gray_stem!r} replaces the stem of 1-channel "
                            f"images; {cfg.data.name!r} has {channels} channels: leave method.gray_stem at 'sum'.")


# ---- ranges --------------------------------------------------------------------------------------
def require(ok: bool, option: str, rule: str, value: Any) -> None:
    if not ok:
        raise FedbenchError(f"{option} must be {rule}, got {value!r}.")


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def check_ranges(cfg: RunConfig) -> None:
    d, p, f, m = cfg.data, cfg.partition, cfg.fed, cfg.method
    require(d.image_size is None or d.image_size >= MIN_IMAGE_SIZE, "data.image_size",
            f">= {MIN_IMAGE_SIZE} (or null for the dataset's default size)", d.image_size)
    for name in ("max_train_samples", "max_test_samples"):
        value = getattr(d, name)
        require(value is None or value >= 1, f"data.{name}", ">= 1 (or null for no cap)", value)
    require(finite(d.val_fraction) and 0 <= d.val_fraction < 1, "data.val_fraction",
            "in [0, 1) (0: no validation split, per-client protocol only)", d.val_fraction)
    require(p.num_clients >= 1, "partition.num_clients", ">= 1", p.num_clients)
    PARTITION_SCHEMES.get(p.scheme)  # an unknown scheme: one error naming the closest and every registered one
    check_partition_args(cfg)
    for name in ("rounds", "local_epochs", "batch_size", "eval_every"):
        if getattr(f, name) < 1:
            raise FedbenchError(f"fed.{name} must be >= 1, got {getattr(f, name)}.")
    require(f.eval_batch_size is None or f.eval_batch_size >= 1, "fed.eval_batch_size", ">= 1 (or null: automatic)",
            f.eval_batch_size)
    if not (finite(f.sample_ratio) and 0.0 < f.sample_ratio <= 1.0):
        raise FedbenchError(f"fed.sample_ratio must be in (0, 1], got {f.sample_ratio}.")
    require(finite(f.lr_decay) and 0 < f.lr_decay <= 1, "fed.lr_decay", "in (0, 1] (the lr is multiplied by it "
            "every round)", f.lr_decay)
    require(finite(f.lr_gamma) and 0 < f.lr_gamma <= 1, "fed.lr_gamma", "in (0, 1]", f.lr_gamma)
    require(all(r >= 0 for r in f.lr_milestones), "fed.lr_milestones", "rounds >= 0", f.lr_milestones)
    require(finite(f.client_test_fraction) and 0 < f.client_test_fraction < 1, "fed.client_test_fraction",
            "in (0, 1)", f.client_test_fraction)
    require(finite(m.lr) and m.lr > 0, "method.lr", "a finite number > 0", m.lr)
    require(finite(m.momentum) and 0 <= m.momentum < 1, "method.momentum", "in [0, 1)", m.momentum)
    require(finite(m.weight_decay) and m.weight_decay >= 0, "method.weight_decay", "a finite number >= 0",
            m.weight_decay)
    require(cfg.seed >= 0, "seed", ">= 0", cfg.seed)
    require(cfg.devices == "auto" or cfg.devices >= 1, "devices", ">= 1", cfg.devices)
    require(cfg.num_nodes >= 1, "num_nodes", ">= 1", cfg.num_nodes)
    require(cfg.threads is None or cfg.threads >= 1, "threads", ">= 1 (or null for Lightning's choice)", cfg.threads)
    require(cfg.checkpoint_every >= 0, "checkpoint_every", ">= 0 (0 = never)", cfg.checkpoint_every)
    require(finite(cfg.timeout) and cfg.timeout > 0, "timeout", "a number of minutes > 0", cfg.timeout)
    check_output_names(cfg)


def check_output_names(cfg: RunConfig) -> None:
    """The experiment and the run's record name are folder and file names under output_dir (and the
    checkpoint folder): plain names only (bench/core/paths.py)."""
    plain_name(cfg.experiment, "experiment", "the output folder")
    plain_name(cfg.record_name(), "the run name (method, data and partition names)", f"{cfg.experiment}/")


def known_class_count(cfg: RunConfig) -> int | None:
    """The dataset's number of classes when it is fixed (a class attribute) or readable from folder names;
    None when the data is missing (the data check reports that)."""
    cls = DATASETS.get(cfg.data.name)
    names = inspect.getattr_static(cls, "class_names", None)
    if isinstance(names, (list, tuple)):
        return len(names)
    try:
        return len(dataset_class_names(cfg))
    except FedbenchError:
        return None


def check_partition_args(cfg: RunConfig) -> None:
    """``partition.args`` against the scheme (unknown options, wrong types: datamodules/partition.py
    scheme_options), then the ranges of the built-in options the scheme takes."""
    p = cfg.partition
    if not isinstance(p.args, dict):
        raise PartitionError(f"partition.args must be a mapping of the {p.scheme!r} scheme's options, got {p.args!r}.")
    o = scheme_options(p.scheme, p.args)
    beta = getattr(o, "beta", None)
    if beta is not None and not all(finite(b) and b > 0 for b in (beta if isinstance(beta, list) else [beta])):
        raise PartitionError(f"partition.args.beta must be > 0, got {beta}.")
    if hasattr(o, "shards_per_client"):
        require(o.shards_per_client >= 1, "partition.args.shards_per_client", ">= 1", o.shards_per_client)
    if hasattr(o, "min_size"):
        require(o.min_size >= 0, "partition.args.min_size", ">= 0", o.min_size)
    if hasattr(o, "missing_prob"):
        require(finite(o.missing_prob) and 0 <= o.missing_prob < 1, "partition.args.missing_prob", "in [0, 1)",
                o.missing_prob)


def check_partition(cfg: RunConfig) -> None:
    """FedNTD's per-class shards need s * N to be a multiple of the number of classes."""
    p = cfg.partition
    if p.scheme != "shards":
        return
    o = scheme_options(p.scheme, p.args)
    if o.shard_mode == "per_class":
        num_classes = known_class_count(cfg)
        if num_classes is not None:
            check_per_class_shards(p.num_clients, o.shards_per_client, num_classes)


def check_precision(cfg: RunConfig) -> None:
    """The precisions fedbench applies in full: the true ones whose dtype it sets itself (PRECISION_DTYPES,
    issue 13: modules are moved with fabric.to_device, never converted by fabric.setup) and the mixed ones,
    which are Fabric's autocast around every forward pass (weights stay float32). Fabric's half-true
    precisions would be half-applied, so they are rejected."""
    if cfg.precision not in SUPPORTED_PRECISIONS:
        raise FedbenchError(f"precision {cfg.precision!r} is not supported; choose one of {list(SUPPORTED_PRECISIONS)} "
                            "(64-true: float64 weights and batches, for machine-independent numbers; bf16-mixed: "
                            "autocast, a speed option for GPUs).")


def check_accelerator(cfg: RunConfig) -> None:
    """The accelerator exists on this machine and has enough devices."""
    from lightning.fabric.accelerators import CUDAAccelerator, MPSAccelerator

    cuda, mps = CUDAAccelerator.is_available(), MPSAccelerator.is_available()
    acc = cfg.accelerator
    if acc == "cuda" and not cuda or acc == "mps" and not mps or acc == "gpu" and not (cuda or mps):
        raise FedbenchError(f"--accelerator {acc} was requested but this machine has no "
                            f"{'CUDA' if acc == 'cuda' else 'Apple MPS' if acc == 'mps' else 'GPU'} available; "
                            "use --accelerator cpu (or auto).")
    if acc in ("cuda", "gpu") and cuda and cfg.devices != "auto" and cfg.devices > CUDAAccelerator.auto_device_count():
        raise FedbenchError(f"--devices {cfg.devices} but this machine has {CUDAAccelerator.auto_device_count()} "
                            "CUDA GPU(s).")
    on_cpu = acc == "cpu" or (acc == "auto" and not (cuda or mps))
    check_cpu_ranks(cfg, on_cpu)
    if cfg.compile and on_cpu and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        raise FedbenchError("--compile true on CPU needs a C++ compiler (torch.compile builds its kernels with "
                            "g++ or clang++), and none is on PATH; install one (apt-get install g++) or drop --compile.")
    if on_cpu and cfg.precision == "16-mixed":
        raise FedbenchError("--precision 16-mixed needs a CUDA GPU (fp16 autocast is not supported on CPU, where "
                            "Fabric would silently switch to bf16-mixed); use bf16-mixed or 32-true.")


def check_launcher(cfg: RunConfig) -> None:
    """Several nodes need a launcher that starts one process per rank on every node (torchrun, SLURM's
    srun, or NODE_RANK/MASTER_ADDR set by hand), and the launcher's world size must be devices x num_nodes:
    otherwise Fabric would wait for ranks that never come."""
    import os

    import torch.distributed as dist
    from lightning.fabric.plugins.environments import SLURMEnvironment

    launch = ("torchrun --nnodes <num_nodes> --nproc-per-node <devices> --node-rank <this node> --master-addr "
              "<node 0> --master-port <port> -m bench.cli run ... --devices <devices> --num_nodes <num_nodes> on "
              "every node, or srun under SLURM (docs/scaling.md, 'Several machines')")
    if cfg.devices == "auto":
        from bench.assembly.workers import launcher_ranks_per_node

        if launcher_ranks_per_node() is not None:
            return  # auto takes the launcher's processes per node
        if cfg.num_nodes > 1:
            raise FedbenchError(f"--num_nodes {cfg.num_nodes} with --devices auto needs torchrun or SLURM (which say "
                                "how many processes each node runs); launched by hand, pass --devices <ranks per node>.")
        return
    if dist.is_available() and dist.is_torchelastic_launched():
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world != cfg.devices * cfg.num_nodes:
            raise FedbenchError(f"torchrun started {world} process(es) in all, but --devices {cfg.devices} x "
                                f"--num_nodes {cfg.num_nodes} = {cfg.devices * cfg.num_nodes}: pass --devices "
                                "<torchrun's --nproc-per-node> and --num_nodes <torchrun's --nnodes>.")
        return
    if cfg.num_nodes == 1:
        return
    if SLURMEnvironment.detect():
        nodes, tasks = os.environ.get("SLURM_NNODES"), os.environ.get("SLURM_NTASKS_PER_NODE")
        if nodes is not None and int(nodes) != cfg.num_nodes or tasks is not None and int(tasks) != cfg.devices:
            raise FedbenchError(f"SLURM gives {nodes} node(s) x {tasks} task(s) per node, but --num_nodes "
                                f"{cfg.num_nodes} --devices {cfg.devices}: make them equal (#SBATCH --nodes, "
                                "--ntasks-per-node).")
        return
    if "NODE_RANK" in os.environ and "MASTER_ADDR" in os.environ:
        return  # launched by hand: this node's processes are started by Fabric
    raise FedbenchError(f"--num_nodes {cfg.num_nodes} needs a multi-node launch: {launch}.")


# ---- outputs -------------------------------------------------------------------------------------
def check_writable(folder: str, option: str) -> None:
    """``folder`` can be created and written (probed in its nearest existing parent with a file that
    is removed at once), so a run cannot fail at its end for an unwritable path."""
    path = Path(folder).expanduser().absolute()
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise FedbenchError(f"{option} {folder!r} cannot be created: {str(existing)!r} is a file, not a folder.")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise FedbenchError(f"{option} {folder!r} is not writable ({err.strerror or err} in {str(existing)!r}); "
                            "choose another folder.") from err


def check_outputs(cfg: RunConfig) -> None:
    check_writable(cfg.output_dir, "--output_dir")
    if cfg.checkpoint_every > 0:
        check_writable(cfg.checkpoint_dir, "--checkpoint_dir")


def check_backbone(cfg: RunConfig) -> None:
    """An unknown method.backbone, for the methods that build theirs by name (CLIP methods bring their
    own), is refused before any data is read or rank started."""
    from lightning_modules.backbones import check_backbone_name

    cls = METHODS.get(cfg.method.name)
    if cls.build_backbone is FederatedModule.build_backbone:
        check_backbone_name(cfg.method.backbone)


def check_loggers(cfg: RunConfig) -> None:
    """--tensorboard true needs tensorboard or tensorboardX (Lightning's TensorBoardLogger writes with either;
    the locked environment has tensorboardX)."""
    if cfg.tensorboard and not compat.tensorboard_available():
        raise FedbenchError("tensorboard: true needs the tensorboard package, which this environment lacks "
                            "(pip install tensorboardX, or tensorboard); every run logs the same per-round scalars to CSV "
                            "under <output_dir>/<experiment>/csv/ and, with --wandb, to W&B.")


def check_data_paths(cfg: RunConfig) -> None:
    """data.root and data.test_root name folders: an existing file there is one error (not a traceback)."""
    for option, value in (("data.root", cfg.data.root), ("data.test_root", cfg.data.test_root)):
        path = Path(value).expanduser() if value else None
        if path is not None and path.exists() and not path.is_dir():
            raise FedbenchError(f"{option} '{path}' is a file, not a folder: pass the folder that holds the dataset "
                                "(where its archive unpacks), e.g. the file's parent folder.")


def check_image_size(cfg: RunConfig) -> None:
    """data.image_size is bounded by memory: one training batch of float32 images must fit in this machine's
    memory (the whole decoded dataset is checked when it is decoded: datamodules/tensors.py)."""
    size = cfg.data.image_size
    channels = getattr(DATASETS.get(cfg.data.name), "in_channels", 3)
    channels = channels if isinstance(channels, int) else 3
    need, have = cfg.fed.batch_size * channels * size * size * 4 if size else 0, machine_memory()
    if have is not None and need > have:
        raise FedbenchError(f"data.image_size {size}: one training batch of {cfg.fed.batch_size} images at "
                            f"{size}x{size} takes {human_bytes(need)} as float32, more than this machine's "
                            f"{human_bytes(have)} of memory. Use a smaller data.image_size (unset: the dataset's "
                            "default size; 224 for ImageNet backbones).")


def check_cpu_ranks(cfg: RunConfig, on_cpu: bool) -> None:
    """--devices N on CPU starts N processes on this machine (unless torchrun or SLURM starts them): more than
    its cores only time-slices them, so it is refused, as --jobs refuses more jobs than GPUs."""
    import os

    import torch.distributed as dist

    if not on_cpu or cfg.devices == "auto" or cfg.num_nodes > 1 or dist.is_available() and dist.is_torchelastic_launched():
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cfg.devices > cores:
        raise FedbenchError(f"--devices {cfg.devices} would start {cfg.devices} CPU ranks (processes), but this machine "
                            f"has {cores} core(s) for them: use --devices {cores} or fewer (--devices auto: one "
                            "rank per core; the numbers are the same for any --devices, docs/speed.md).")


def validate_config(cfg: RunConfig) -> None:
    """All checks that need neither decoded data nor a launched Fabric (safe to run for every row of a
    table); a prompts file is matched with the dataset's class names (folder names, for class-folder)."""
    check_field_types(cfg)
    check_data_paths(cfg)
    METHODS.get(cfg.method.name)
    DATASETS.get(cfg.data.name)
    if cfg.data.test_dataset is not None:
        DATASETS.get(cfg.data.test_dataset)
    elif cfg.data.test_root is not None:
        raise FedbenchError("data.test_root is set but data.test_dataset is not: name the dataset to test on "
                            "(e.g. --data.test_dataset brain-tumor), or drop data.test_root.")
    check_protocol(cfg)
    check_folds(cfg)
    check_gray_stem(cfg)
    check_backbone(cfg)
    check_ranges(cfg)
    check_image_size(cfg)
    check_partition(cfg)
    check_precision(cfg)
    check_accelerator(cfg)
    check_launcher(cfg)
    check_method_args(cfg)
    check_prompts(cfg)
    check_loggers(cfg)
