"""Every private name of torch and Lightning that fedbench uses, in this one module.

A library may rename a private name in any release. So each use goes through a function here that
first checks the installed major version against the ones fedbench was tested with (``TESTED``; the
bounds in pyproject.toml; the exact versions in requirements.lock) and then looks the name up,
failing with one FedbenchError that names the library, the version and the fix, instead of an
AttributeError deep in a run. ``check()`` resolves every name at once: a run calls it before it
starts (bench/assembly/experiment.py make_fabric). tests/core/test_compat.py checks that no other module of
bench, datamodules or lightning_modules uses a private torch or Lightning name.

The names:

- ``torch.distributed.distributed_c10d._get_default_store``: the key-value store of the default
  process group (bench/engine/liveness.py posts which rank reached which collective, and a rank's error);
- ``torch.nn.modules.batchnorm._BatchNorm``: the base of every BatchNorm layer with running
  statistics (FedBM's BN-statistics loss hooks them);
- ``lightning.fabric.loggers.tensorboard._TENSORBOARD_AVAILABLE`` / ``_TENSORBOARDX_AVAILABLE``:
  whether Lightning's TensorBoardLogger can write (--tensorboard is refused up front otherwise);
- ``lightning.fabric.strategies.launchers.subprocess_script._ChildProcessObserver`` (its ``_run``,
  ``_child_processes``) and ``_launch_process_observer``: Fabric's watcher of the ranks it launched,
  which bench/assembly/rank_observer.py replaces (Fabric has no public option for it);
- ``torch._foreach_add_``, ``_foreach_sub``, ``_foreach_sub_``, ``_foreach_mul``, ``_foreach_norm``: one
  multi-tensor op per list instead of one per parameter (FedProx's, FedDyn's and Scaffold's per-step work);
- torchmetrics' optional-dependency flags ``torchmetrics.utilities.imports._TORCHVISION_AVAILABLE`` and the
  others in ``TORCHMETRICS_EXTRAS``: set False in fedbench's own processes (``skip_torchmetrics_extras``), so
  that importing Lightning, which imports torchmetrics, does not also import torchvision and transformers for
  image and text metrics fedbench never computes (issue 41: about 2 s of every process's start), nor
  matplotlib (its ``Metric.plot``) and regex (SacreBLEU's tokenizer). torchmetrics' own package also imports
  scipy.signal whenever scipy is installed (a patch for its audio metrics; scipy.signal brings scipy.stats:
  about 0.9 s): while that one module runs, lightning_utilities' public ``package_available`` answers "no" for
  the names in ``TORCHMETRICS_TOP_SKIPS``. Unlike the names above this one degrades instead of failing: with
  another torchmetrics major version, or a flag gone, the imports are only slower (tests/core/test_compat.py
  says when a flag is gone or the package's own import of scipy changed).
- timm's package imports ``timm.utils.summary``, which tries ``import wandb`` for an option fedbench never
  passes (about 0.5 s of every process that builds a timm or CLIP backbone): while timm's package runs, an
  import of the names in ``TIMM_SKIPS`` not yet done fails as if they were not installed (timm catches it).
  wandb imported before (W&B tracking) or after is the real one. ``skip_unused_imports`` does both skips.
"""
from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from bench.core.errors import FedbenchError

# distribution -> (lowest, highest) major version tested; keep equal to pyproject.toml's bounds
TESTED = {"torch": (2, 2), "lightning": (2, 2)}
# (distribution, module, name): every private name used, resolved by check()
NAMES = (
    ("torch", "torch.distributed.distributed_c10d", "_get_default_store"),
    ("torch", "torch.nn.modules.batchnorm", "_BatchNorm"),
    ("lightning", "lightning.fabric.loggers.tensorboard", "_TENSORBOARD_AVAILABLE"),
    ("lightning", "lightning.fabric.loggers.tensorboard", "_TENSORBOARDX_AVAILABLE"),
    ("lightning", "lightning.fabric.strategies.launchers.subprocess_script", "_ChildProcessObserver"),
    ("lightning", "lightning.fabric.strategies.launchers.subprocess_script", "_launch_process_observer"),
    *(("torch", "torch", f"_foreach_{op}") for op in ("add_", "sub", "sub_", "mul", "norm")),
)
FIX = "install the tested versions (pip install -r requirements.lock)"
# torchmetrics' flags of optional packages whose metrics fedbench never computes (image metrics: torchvision;
# text: transformers; audio and signal helpers: scipy); tested with torchmetrics 1.x (requirements.lock)
TORCHMETRICS_MODULE = "torchmetrics.utilities.imports"
TORCHMETRICS_EXTRAS = ("_TORCHVISION_AVAILABLE", "_TRANSFORMERS_AVAILABLE", "_TRANSFORMERS_GREATER_EQUAL_4_4",
                       "_SCIPY_AVAILABLE", "_SCIPY_GREATER_EQUAL_1_8", "_SCIPI_AVAILABLE", "_MATPLOTLIB_AVAILABLE",
                       "_REGEX_AVAILABLE")
TORCHMETRICS_PACKAGE = "torchmetrics"
TORCHMETRICS_TOP_SKIPS = ("scipy",)  # what torchmetrics/__init__.py imports if package_available says so
TIMM_PACKAGE = "timm"
TIMM_SKIPS = ("wandb",)  # what timm's package imports in a try (timm/utils/summary.py) and fedbench never uses
TORCHMETRICS_TESTED_MAJOR = 1


def tested(dist: str) -> str:
    low, high = TESTED[dist]
    return f"{dist} {low}.x" if low == high else f"{dist} {low}.x to {high}.x"


@functools.cache
def check_version(dist: str) -> None:
    """One FedbenchError when the installed major version of ``dist`` is outside the tested ones."""
    try:
        installed = version(dist)
    except PackageNotFoundError:
        raise FedbenchError(f"fedbench needs {tested(dist)}, which is not installed: {FIX}.") from None
    major = int(installed.split(".")[0])
    low, high = TESTED[dist]
    if not low <= major <= high:
        raise FedbenchError(f"fedbench uses internals of {dist} that it was tested with in {tested(dist)} only; "
                            f"{dist} {installed} is installed: {FIX}.")


def private(dist: str, module: str, name: str) -> Any:
    """The private ``module.name`` of ``dist``, after the version check; one FedbenchError when a
    release has renamed or removed it."""
    check_version(dist)
    value = getattr(importlib.import_module(module), name, None)
    if value is None:
        raise FedbenchError(f"{dist} {version(dist)} has no {module}.{name}, which fedbench uses (tested with "
                            f"{tested(dist)}): {FIX}.")
    return value


def check() -> None:
    """Resolve every private name (NAMES): one FedbenchError before a run starts when one is gone."""
    for dist, module, name in NAMES:
        private(dist, module, name)


def default_store() -> Any:
    """The key-value store of torch.distributed's default process group."""
    return private("torch", "torch.distributed.distributed_c10d", "_get_default_store")()


def batch_norm_base() -> type:
    """The base class of torch's BatchNorm layers (1d, 2d, 3d, sync, lazy)."""
    return private("torch", "torch.nn.modules.batchnorm", "_BatchNorm")


@functools.cache
def foreach(op: str) -> Callable[..., Any]:
    """torch's multi-tensor ``torch._foreach_<op>`` (``foreach("mul")(tensors, scalar)``), resolved once."""
    return private("torch", "torch", f"_foreach_{op}")


def tensorboard_available() -> bool:
    """Whether Lightning's TensorBoardLogger finds tensorboard or tensorboardX to write with."""
    module = "lightning.fabric.loggers.tensorboard"
    return bool(private("lightning", module, "_TENSORBOARD_AVAILABLE")
                or private("lightning", module, "_TENSORBOARDX_AVAILABLE"))


LAUNCHER = "lightning.fabric.strategies.launchers.subprocess_script"
Verdict = Callable[[list[int | None]], bool | None]


@functools.cache
def rank_watcher_class() -> type:
    """Fabric's watcher of launched ranks with a verdict hook: ``verdict(exit codes)`` returns True (stop
    watching), False (keep watching) or None (Fabric's own rule: SIGKILL everything on a failed rank)."""
    base = private("lightning", LAUNCHER, "_ChildProcessObserver")

    class RankWatcher(base):
        def __init__(self, main_pid: int, child_processes: list[subprocess.Popen], sleep_period: float,
                     verdict: Verdict) -> None:
            super().__init__(main_pid=main_pid, child_processes=child_processes, sleep_period=sleep_period)
            self.verdict = verdict
            self.sleep_period = sleep_period

        def poll_once(self) -> bool:
            """One poll of the ranks: whether the watch is over."""
            return self._run()

        def _run(self) -> bool:
            said = self.verdict([proc.poll() for proc in self._child_processes])
            return super()._run() if said is None else said

    return RankWatcher


def rank_watcher(main_pid: int, child_processes: list[subprocess.Popen], sleep_period: float,
                 verdict: Verdict) -> Any:
    return rank_watcher_class()(main_pid, child_processes, sleep_period, verdict)


def install_rank_watcher(launch: Callable[[list[subprocess.Popen]], None]) -> None:
    """Make Fabric's subprocess launcher call ``launch(child processes)`` to watch the ranks it started."""
    private("lightning", LAUNCHER, "_launch_process_observer")
    importlib.import_module(LAUNCHER)._launch_process_observer = launch


def rank_watcher_launcher() -> Callable[[list[subprocess.Popen]], None]:
    """What Fabric's subprocess launcher calls now to watch its ranks."""
    return private("lightning", LAUNCHER, "_launch_process_observer")


class _TorchmetricsExtrasOff(importlib.abc.MetaPathFinder):
    """Finds ``torchmetrics`` and then ``torchmetrics.utilities.imports`` once each, as Python would, and runs
    the package without its import of scipy (``_run_without_top_skips``) and the flags module with its extras'
    flags set False right after it runs (before any other torchmetrics module reads them)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in (TORCHMETRICS_PACKAGE, TORCHMETRICS_MODULE):
            return None
        if name == TORCHMETRICS_MODULE:  # the package's first import of its own: this finder's last
            sys.meta_path.remove(self)
        return _spec_run_by(name, path, _run_without_top_skips if name == TORCHMETRICS_PACKAGE else _run_with_extras_off)


def _spec_run_by(name: str, path: Any, wrap: Callable[..., None], *before: Any) -> Any:
    """Module ``name``'s spec as Python would find it, its loader running the module as ``wrap(*before, run,
    module)`` (``run``: the loader's own exec_module); the plain spec where it has no such loader."""
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
        return spec
    spec.loader.exec_module = functools.partial(wrap, *before, spec.loader.exec_module)
    return spec


def _run_with_extras_off(run: Callable[[Any], None], module: Any) -> None:
    run(module)
    for flag in TORCHMETRICS_EXTRAS:
        if hasattr(module, flag):
            setattr(module, flag, False)


def _run_without_top_skips(run: Callable[[Any], None], module: Any) -> None:
    """Runs torchmetrics' package with lightning_utilities' ``package_available`` answering False for
    ``TORCHMETRICS_TOP_SKIPS`` meanwhile (the package binds the name at its top; it is rebound to the real one
    after)."""
    from lightning_utilities.core import imports

    real = imports.package_available
    imports.package_available = lambda name: name not in TORCHMETRICS_TOP_SKIPS and real(name)
    try:
        run(module)
    finally:
        imports.package_available = real
        if hasattr(module, "package_available"):
            module.package_available = real


def skip_torchmetrics_extras() -> None:
    """In this process, torchmetrics imports none of its image, text and audio extras (see the module's
    docstring). Call before anything imports Lightning or torchmetrics; a no-op once torchmetrics is imported,
    when it is not torchmetrics 1.x, or when already done."""
    if "torchmetrics" in sys.modules or any(isinstance(f, _TorchmetricsExtrasOff) for f in sys.meta_path):
        return
    try:
        if int(version("torchmetrics").split(".")[0]) != TORCHMETRICS_TESTED_MAJOR:
            return
    except (PackageNotFoundError, ValueError):
        return
    sys.meta_path.insert(0, _TorchmetricsExtrasOff())


class _Absent(importlib.abc.MetaPathFinder):
    """Fails the import of ``names`` (and their submodules) as if they were not installed."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r} (skipped while timm imports)", name=name)
        return None


class _TimmWithoutSkips(importlib.abc.MetaPathFinder):
    """Finds ``timm`` once, as Python would, and runs its package with ``TIMM_SKIPS`` absent meanwhile."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != TIMM_PACKAGE:
            return None
        sys.meta_path.remove(self)
        return _spec_run_by(name, path, _run_with_absent, TIMM_SKIPS)


def _run_with_absent(names: tuple[str, ...], run: Callable[[Any], None], module: Any) -> None:
    absent = _Absent(names)
    sys.meta_path.insert(0, absent)
    try:
        run(module)
    finally:
        sys.meta_path.remove(absent)


def skip_timm_wandb() -> None:
    """In this process, timm's import does not import wandb (see the module's docstring). A no-op once timm is
    imported or when already done."""
    if TIMM_PACKAGE in sys.modules or any(isinstance(f, _TimmWithoutSkips) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _TimmWithoutSkips())


def skip_unused_imports() -> None:
    """What every fedbench process calls first: ``skip_torchmetrics_extras`` and ``skip_timm_wandb``."""
    skip_torchmetrics_extras()
    skip_timm_wandb()
