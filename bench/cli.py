"""`fedbench` command: list what there is, fetch a dataset, run one experiment, run/render a table, check the regression set,
or time the hot loop.

    fedbench list                                   # methods (paper, one line), datasets (path under the data home), partition schemes
    fedbench run --config configs/experiments/quick.yaml --method.name fedprox --method.args '{mu: 0.01}'
    fedbench run --print-config                     # every option, with defaults
    fedbench run --data-home /data --data.name kvasir    # datasets under /data by their archive names
    fedbench table --config configs/tables/table2_fashion-mnist.yaml [--wandb]
    fedbench table --config configs/tables/table2_fashion-mnist.yaml --seeds 0 --rows FedAvg,FedBM --dry-run  # the plan only
    fedbench regression [--only fedavg] [--update --reason "why the numbers moved"]
    fedbench coverage [--paper fedbm] [--json] [--uncovered-only]   # which published cells the configs reproduce
    fedbench dashboard --config configs/tables/table2_fashion-mnist.yaml  # a W&B workspace + report for the table
    fedbench data get kvasir [--data-home /data]    # download, check and unpack a public dataset (docs/data.md)
    fedbench bench

Every command follows jsonargparse's conventions (bench/tables/flags.py): --print_config prints its
options, a boolean flag is {true,false} (bare: true), a list is [a,b] (also a,b, a b, the flag repeated or
--flag+ c), either spelling of a flag works (--output-dir or --output_dir), an error is one "fedbench: error:"
line, and --help lists the flags (fedbench run --help).
"""
from __future__ import annotations

import difflib
import gc
import os
import signal
import sys
import typing
import warnings
from pathlib import Path

from bench.core import lifetime

if __name__ == "__main__" or Path(sys.argv[0]).name == "fedbench":  # the command itself (or a rank it started)
    lifetime.interrupt_during_startup()  # Ctrl-C while torch is still importing: one line and 130, no traceback

from jsonargparse import ActionConfigFile, ArgumentParser

from bench.assembly.config import OPTION_GROUPS, TOP_LEVEL_KEYS, RunConfig
from bench.assembly.ports import launcher_pid
from bench.core.allocator import apply_allocator_policy
from bench.core.compat import skip_unused_imports
from bench.core.errors import FedbenchError, FedbenchNotice, FedbenchWarning
from bench.core.import_gc import stack_import
from bench.core.lifetime import Interrupted, die_with_parent, launched_by_fabric, terminate_on_sigterm
from bench.tables.flags import CommandParser, config_kind
from datamodules.data_home import DATA_HOME_ENV, set_data_home

HELP = {
    "resume": "true: continue from the latest checkpoint, refused if it was written under another config, code "
              "or data; force: continue anyway (the record lists the differences)",
    "devices": "ranks (Fabric processes); auto: one 1-thread rank per core on a multi-core CPU, each training "
               "its own clients (one rank for a central run or on a GPU); see bench/assembly/workers.py",
    "timeout": "minutes a rank waits for the others at a round's collective before giving up with an error",
}


class RunParser(CommandParser):
    """jsonargparse, with fedbench's conventions (bench/tables/flags.py); its ``--print_config`` is
    jsonargparse's own (the run's whole config, which ``--config`` reads back)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(print_options=False, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> typing.NoReturn:
        if os.environ.get("JSONARGPARSE_DEBUG"):  # it raises, with jsonargparse's traceback
            ArgumentParser.error(self, message, ex)
        super().error(message, ex)


def run_parser() -> ArgumentParser:
    parser = RunParser(prog="fedbench run", default_env=False, exit_on_error=True, allow_abbrev=False,
                       description="Run one federated experiment. Flags take either spelling (--output-dir or "
                                   "--output_dir); a boolean flag may be bare (--wandb: true) or take true/false.")
    parser.add_argument("--config", action=ActionConfigFile, help="YAML config (see configs/)")
    for name, typ in OPTION_GROUPS.items():
        parser.add_argument(f"--{name}", type=typ, default=typ())
    defaults, hints = RunConfig(), typing.get_type_hints(RunConfig)
    for field in TOP_LEVEL_KEYS:
        parser.add_argument(f"--{field}", type=hints[field], default=getattr(defaults, field), help=HELP.get(field))
    parser.add_argument("--data-home", type=str | None, default=None,
                        help=f"folder holding the datasets under their archive names (default ${DATA_HOME_ENV}, "
                             "else ./data); an explicit --data.root wins")
    parser.set_defaults(devices="auto")  # the command's default: the cores as client workers (bench/assembly/workers.py)
    show_choices(parser)
    return parser


# options whose value is a registered name -> the catalog's entries of that registry (bench/tables/catalog.py)
REGISTRY_OPTIONS = {"--method.name": "methods", "--data.name": "datasets", "--partition.scheme": "schemes"}


def show_choices(parser: ArgumentParser) -> None:
    """``--help`` of --method.name, --data.name and --partition.scheme lists the registered names (from the
    catalog, as `fedbench list` does: no import of torch; a typo is refused with the closest name later)."""
    from bench.tables.catalog import load

    entries = load()
    for flag, key in REGISTRY_OPTIONS.items():
        parser._option_string_actions[flag].help = (f"one of: {', '.join(sorted(entries[key]))} "
                                                    "(`fedbench list` says what each is)")


def refuse_other_configs(argv: list[str]) -> None:
    """``fedbench run --config`` given a table config (or the regression set): one error naming the command
    that reads it, before jsonargparse reports its keys one by one."""
    for i, token in enumerate(argv):
        name, eq, value = token.partition("=")
        path = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        if name == "--config" and path:
            kind, _ = config_kind(path)
            if kind in ("table", "regression"):
                command = "table --config" if kind == "table" else "regression --config"
                raise FedbenchError(f"{path} is a {kind} config, not a run's: use `fedbench {command} {path}`.")


def shipped_configs(argv: list[str]) -> list[str]:
    """``argv`` with a --config not in the working directory looked up in the checkout or the installed
    package (bench.core.paths.shipped)."""
    from bench.core.paths import shipped

    return [str(shipped(a)) if i and argv[i - 1] == "--config" else
            f"--config={shipped(a.split('=', 1)[1])}" if a.startswith("--config=") else a for i, a in enumerate(argv)]


def parse_run(argv: list[str]) -> RunConfig:
    argv = shipped_configs(argv)
    refuse_other_configs(argv)
    parser = run_parser()
    ns = parser.parse_args(argv)
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes  # renamed in 4.49
    init = instantiate(ns)
    kwargs = {k: v for k, v in vars(init).items() if k not in ("config", "__path__")}
    kwargs.pop("print_config", None)
    if kwargs.get("data_home"):
        set_data_home(kwargs["data_home"])
    kwargs.pop("data_home", None)
    return RunConfig(**kwargs)


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """fedbench's own warnings and notices as one plain line; others as Python shows them. (Replaces
    ``warnings.showwarning``, not ``formatwarning``, which Lightning replaces on import with a format that
    drops the category for any file whose path contains "lightning", such as lightning_modules/.)"""
    if issubclass(category, FedbenchWarning):
        kind = "notice" if issubclass(category, FedbenchNotice) else "warning"
        print(f"fedbench: {kind}: {message}", file=file or sys.stderr, flush=True)
        return
    PYTHON_SHOW(message, category, filename, lineno, file, line)


PYTHON_SHOW = warnings.showwarning


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    skip_unused_imports()  # before Lightning imports torchmetrics and timm wandb: ~2 s less per process (compat.py)
    apply_allocator_policy()  # before torch allocates anything (bench/core/allocator.py)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.showwarning = show_warning
    if launched_by_fabric():  # a rank Fabric started: it ends with rank 0's process, even on SIGKILL
        # (SIGKILL: a rank blocked in a collective runs no Python handler). The launcher's pid, which it left
        # in the environment: a launcher that died while this rank was starting is noticed at once.
        die_with_parent(signal.SIGKILL, parent=launcher_pid())
    previous = terminate_on_sigterm()
    lifetime.end_startup()  # from here a Ctrl-C is a KeyboardInterrupt, handled below
    try:
        return run_command(argv)
    except (KeyboardInterrupt, Interrupted) as stop:
        what = "Ctrl-C" if isinstance(stop, KeyboardInterrupt) else "SIGTERM"
        lifetime.say_interrupted(what)  # one line (rank 0 only), not one per rank
        return lifetime.INTERRUPT_STATUS[what]
    finally:
        if previous is not None:  # main() called from Python (tests): give the caller its handler back
            signal.signal(signal.SIGTERM, previous)


def run_command(argv: list[str]) -> int:
    """One fedbench command (argv after the program name); its exit status."""
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    command, rest = argv[0], argv[1:]
    try:
        if command == "run":
            return run_one(rest)
        module = command_module(command)
        if module is not None:
            return module.main(rest)
    except FedbenchError as err:
        if print_error_here(str(err)):  # an error every rank hit: printed by rank 0 only
            print(f"fedbench: error: {err}", file=sys.stderr)
        return 2
    print(f"fedbench: error: {unknown_command_message(command)}", file=sys.stderr)
    return 2


def run_one(argv: list[str]) -> int:
    """`fedbench run`: parse and check the names (no torch yet: a typo is answered at once), say what runs,
    then import the training stack and run."""
    from bench.assembly.records import best_test_scores, find_record
    from bench.tables.catalog import check_names

    cfg = parse_run(argv)
    check_names(cfg.method.name, [d for d in (cfg.data.name, cfg.data.test_dataset) if d], cfg.partition.scheme)
    earlier = find_record(cfg) is not None  # a record of this very configuration
    if lifetime.first_process():
        rounds = f"{cfg.fed.rounds} round{'s' if cfg.fed.rounds != 1 else ''}"
        print(f"fedbench run: {cfg.run_name()} ({rounds}, {cfg.partition.num_clients} clients, devices {cfg.devices}); "
              f"record under {cfg.output_dir}", flush=True)
    with stack_import():  # the collector off while torch and Lightning import (bench/core/import_gc.py)
        from bench.assembly.experiment import run_experiment
        from bench.tracking.wandb_logger import wandb_observer

    record = run_experiment(cfg, observer=wandb_observer(cfg))
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    if record and rank_zero_only.rank == 0:  # one line, not one per rank
        print(f"{record['run_name']}: {best_test_scores(record)}")
        how = "replaced the record of an earlier run of this configuration" if earlier else "new"
        print(f"record: {find_record(cfg)} ({how})")
    return 0


def print_error_here(text: str) -> bool:
    """Whether this process prints the error ``text`` (bench/engine/liveness.print_error_once): always, when no
    process group can exist yet (torch.distributed not imported: an argument error, answered without torch)."""
    if "torch.distributed" not in sys.modules:
        return True
    from bench.engine.liveness import print_error_once

    return print_error_once(text)


def unknown_command_message(command: str) -> str:
    """A mistyped command answered with the closest one (``tabel``: did you mean table?)."""
    close = difflib.get_close_matches(command, COMMANDS, n=1, cutoff=0.5)
    guess = f"did you mean {close[0]}? " if close else ""
    return (f"unknown command {command!r}; {guess}The commands: {', '.join(COMMANDS[:-1])} and {COMMANDS[-1]} "
            "(`fedbench --help` shows examples).")


COMMANDS = ("list", "run", "table", "regression", "coverage", "dashboard", "data", "bench")


def command_module(command: str):
    """The module of a command other than ``run``: its ``main(argv)`` and ``build_parser()`` (None: no such
    command)."""
    if command == "list":
        from bench.commands import listing as module
    elif command == "table":
        from bench.scheduling import table_runner as module
    elif command == "regression":
        from bench.commands import regression as module
    elif command == "coverage":
        from bench.commands import coverage as module
    elif command == "dashboard":
        from bench.commands import dashboard as module
    elif command == "data":
        from bench.commands import data_command as module
    elif command == "bench":
        from bench.perf import perf as module
    else:
        return None
    return module


def console_main() -> None:
    """The ``fedbench`` command (and ``python -m bench.cli``): ``main()``'s status as the exit status, without
    the interpreter's final garbage collection of torch's and Lightning's objects (0.9-1.5 s here, far longer
    on a busy machine, before the shell gets its prompt back). Every exit, normal or interrupted (130, 143):
    by then the command has written and closed what it writes (records through bench/core/atomic_io, the
    loggers finalized by bench/assembly/run_outputs.attached_loggers), stdout and stderr are flushed here, and exit
    handlers still run (W&B, multiprocessing's semaphores); only unreachable cycles are left to the OS."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    gc.freeze()  # the final collections skip every object alive now (tests/commands/test_startup.py)
    sys.exit(code)


if __name__ == "__main__":
    console_main()
