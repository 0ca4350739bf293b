"""Every option of a run checked before any work starts: types, ranges, precision, accelerator,
``method.args`` against the method's signature, and writable output folders.

Each check raises one FedbenchError naming the option, what it must be and the value given.
"""
from __future__ import annotations

import collections.abc
import inspect
import math
import shutil
import tempfile
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from bench.config import OPTION_GROUPS, RunConfig
from bench.core.errors import FedbenchError, PartitionError
from datamodules.base import DATASETS
from lightning_modules.base import METHODS, FederatedModule

MIN_IMAGE_SIZE = 8  # the smallest size the backbones (simple CNN, ResNet, EfficientNet) are built for
GPU_ACCELERATORS = ("gpu", "cuda", "mps")
# arguments build_module fills itself (from the data and the method options), never from method.args
FILLED_BY_BUILDER = frozenset({"num_classes", "in_channels", "class_names", "dataset_name", "backbone", "pretrained",
                               "optimizer", "lr", "momentum", "weight_decay"})


# ---- types ---------------------------------------------------------------------------------------
def matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` (parsed from YAML/JSON) fits the annotation ``hint``; unknown hints pass."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return True
    if hint is type(None) or hint is None:
        return value is None
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin in (Union, types.UnionType):
        return any(matches(value, a) for a in args)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(matches(v, args[0]) for v in value)
        return not args or (len(value) == len(args) and all(matches(v, a) for v, a in zip(value, args)))
    if origin in (list, collections.abc.Sequence) or hint in (list, tuple):
        return isinstance(value, (list, tuple)) and (not args or all(matches(v, args[0]) for v in value))
    if origin in (dict, collections.abc.Mapping) or hint is dict:
        return isinstance(value, dict) and (len(args) < 2 or all(matches(v, args[1]) for v in value.values()))
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def describe(hint: Any) -> str:
    """A readable name of an annotation: 'float', 'int or None', "one of ['text', 'random']"."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is type(None):
        return "None"
    if origin is Literal:
        return f"one of {list(args)}"
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is tuple:
        return f"a list of {describe(args[0])}" if len(args) == 2 and args[1] is Ellipsis else \
            f"a list of {len(args)} ({', '.join(describe(a) for a in args)})"
    if origin in (list, collections.abc.Sequence):
        return f"a list of {describe(args[0])}" if args else "a list"
    if origin in (dict, collections.abc.Mapping):
        return "a mapping"
    return getattr(hint, "__name__", str(hint))


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
def method_signature(cls: type) -> dict[str, inspect.Parameter]:
    """The keyword parameters a method accepts, over its class hierarchy (subclass first)."""
    params: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        if isinstance(klass, type) and issubclass(klass, FederatedModule):
            for p in inspect.signature(klass.__init__).parameters.values():
                if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                    params.setdefault(p.name, p)
    return params


def method_hints(cls: type) -> dict[str, Any]:
    """The annotations of the keyword parameters (resolved per class, subclass first)."""
    hints: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if isinstance(klass, type) and issubclass(klass, FederatedModule):
            try:
                resolved = typing.get_type_hints(klass.__init__)
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


# ---- fed.protocol --------------------------------------------------------------------------------
def check_protocol(cfg: RunConfig) -> None:
    """A method that trains one model on the pooled data is scored globally only."""
    if METHODS.get(cfg.method.name).runs_centrally and cfg.fed.protocol not in (None, "global"):
        raise FedbenchError(f"{cfg.method.name!r} trains one model on the pooled data: fed.protocol "
                            f"{cfg.fed.protocol!r} does not apply (leave it unset).")


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
    require(finite(d.val_fraction) and 0 < d.val_fraction < 1, "data.val_fraction", "in (0, 1)", d.val_fraction)
    require(p.num_clients >= 1, "partition.num_clients", ">= 1", p.num_clients)
    if p.scheme.startswith("dirichlet") and not (finite(p.beta) and p.beta > 0):
        raise PartitionError(f"partition.beta must be > 0, got {p.beta}.")
    require(p.shards_per_client >= 1, "partition.shards_per_client", ">= 1", p.shards_per_client)
    require(p.min_size >= 0, "partition.min_size", ">= 0", p.min_size)
    require(finite(p.missing_prob) and 0 <= p.missing_prob < 1, "partition.missing_prob", "in [0, 1)", p.missing_prob)
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
    require(cfg.threads is None or cfg.threads >= 1, "threads", ">= 1 (or null for Lightning's choice)", cfg.threads)
    require(cfg.checkpoint_every >= 0, "checkpoint_every", ">= 0 (0 = never)", cfg.checkpoint_every)
    require(finite(cfg.timeout) and cfg.timeout > 0, "timeout", "a number of minutes > 0", cfg.timeout)
    require(bool(cfg.experiment) and "/" not in cfg.experiment and cfg.experiment not in (".", ".."), "experiment",
            "a non-empty name without '/'", cfg.experiment)


def check_accelerator(cfg: RunConfig) -> None:
    """The accelerator exists on this machine, has enough devices, and supports the precision."""
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
    if cfg.compile and on_cpu and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        raise FedbenchError("--compile true on CPU needs a C++ compiler (torch.compile builds its kernels with "
                            "g++ or clang++), and none is on PATH; install one (apt-get install g++) or drop --compile.")
    if on_cpu and cfg.precision == "16-mixed":
        raise FedbenchError("--precision 16-mixed needs a CUDA GPU (fp16 autocast is not supported on CPU, where "
                            "Fabric would silently switch to bf16-mixed); use bf16-mixed or 32-true.")


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


def validate_config(cfg: RunConfig) -> None:
    """All checks that need neither data nor a launched Fabric (safe to run for every row of a table)."""
    check_field_types(cfg)
    METHODS.get(cfg.method.name)
    DATASETS.get(cfg.data.name)
    check_protocol(cfg)
    check_ranges(cfg)
    check_accelerator(cfg)
    check_method_args(cfg)
