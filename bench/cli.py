"""`fedbench` command: run one experiment, run/render a table, check the regression set, or time the hot loop.

    fedbench run --config configs/experiments/quick.yaml --method.name fedprox --method.args '{mu: 0.01}'
    fedbench run --print_config
    fedbench run --data-home /data --data.name kvasir    # datasets under /data by their archive names
    fedbench table --config configs/tables/table2_fashion-mnist.yaml [--wandb]
    fedbench regression [--only fedavg] [--update --reason "why the numbers moved"]
    fedbench coverage [--paper fedbm] [--json] [--uncovered-only]   # which published cells the configs reproduce
    fedbench bench
"""
from __future__ import annotations

import os
import signal
import sys
import typing
import warnings

from jsonargparse import ActionConfigFile, ArgumentParser

from bench.config import OPTION_GROUPS, TOP_LEVEL_KEYS, RunConfig
from bench.core.allocator import apply_allocator_policy
from bench.core.errors import FedbenchError, FedbenchNotice, FedbenchWarning
from bench.core.lifetime import Interrupted, die_with_parent, launched_by_fabric, terminate_on_sigterm
from datamodules.data_home import DATA_HOME_ENV, set_data_home

HELP = {
    "resume": "true: continue from the latest checkpoint, refused if it was written under another config, code "
              "or data; force: continue anyway (the record lists the differences)",
    "devices": "ranks (Fabric processes); auto: one 1-thread rank per core on a multi-core CPU, each training "
               "its own clients (one rank for a central run or on a GPU); see bench/workers.py",
    "timeout": "minutes a rank waits for the others at a round's collective before giving up with an error",
}


def run_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="fedbench run", description="Run one federated experiment.",
                            default_env=False, exit_on_error=True, allow_abbrev=False)
    parser.add_argument("--config", action=ActionConfigFile, help="YAML config (see configs/)")
    for name, typ in OPTION_GROUPS.items():
        parser.add_argument(f"--{name}", type=typ, default=typ())
    defaults, hints = RunConfig(), typing.get_type_hints(RunConfig)
    for field in TOP_LEVEL_KEYS:
        parser.add_argument(f"--{field}", type=hints[field], default=getattr(defaults, field), help=HELP.get(field))
    parser.add_argument("--data-home", type=str | None, default=None,
                        help=f"folder holding the datasets under their archive names (default ${DATA_HOME_ENV}, "
                             "else ./data); an explicit --data.root wins")
    parser.set_defaults(devices="auto")  # the command's default: the cores as client workers (bench/workers.py)
    return parser


def parse_run(argv: list[str]) -> RunConfig:
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
    apply_allocator_policy()  # before torch allocates anything (bench/core/allocator.py)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.showwarning = show_warning
    if launched_by_fabric():  # a rank Fabric started: it ends with rank 0's process, even on SIGKILL
        die_with_parent(signal.SIGKILL)  # (SIGKILL: a rank blocked in a collective runs no Python handler)
    previous = terminate_on_sigterm()
    try:
        return run_command(argv)
    except (KeyboardInterrupt, Interrupted) as stop:
        if os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("RANK", "0") == "0":  # one line, not one per rank
            what = "Ctrl-C" if isinstance(stop, KeyboardInterrupt) else "SIGTERM"
            print(f"fedbench: interrupted ({what}): stopped every rank and worker. Finished runs kept their records; "
                  "an unfinished run wrote none (rerun it, or resume it with --resume true if it checkpointed).",
                  file=sys.stderr, flush=True)
        return 130 if isinstance(stop, KeyboardInterrupt) else 143
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
            from bench.experiment import run_experiment
            from bench.records import find_record
            from bench.reporting.wandb_logger import wandb_observer

            cfg = parse_run(rest)
            earlier = find_record(cfg) is not None  # a record of this very configuration
            record = run_experiment(cfg, observer=wandb_observer(cfg))
            from lightning.fabric.utilities.rank_zero import rank_zero_only

            if record and rank_zero_only.rank == 0:  # one line, not one per rank
                best = record.get("best", {})
                shown = ", ".join(f"{k}={v:.2f}" for k, v in best.items()
                          if k.startswith("test/") and isinstance(v, float) and k != "test/predicted_classes")
                print(f"{record['run_name']}: {shown}")
                how = "replaced the record of an earlier run of this configuration" if earlier else "new"
                print(f"record: {find_record(cfg)} ({how})")
            return 0
        if command == "table":
            from bench.reporting.table_runner import main as table_main

            return table_main(rest)
        if command == "regression":
            from bench.reporting.regression import main as regression_main

            return regression_main(rest)
        if command == "coverage":
            from bench.reporting.coverage import main as coverage_main

            return coverage_main(rest)
        if command == "bench":
            from bench.reporting.perf import main as perf_main

            return perf_main(rest)
    except FedbenchError as err:
        print(f"fedbench: error: {err}", file=sys.stderr)
        return 2
    print(f"fedbench: unknown command {command!r}; use run, table, regression, coverage or bench.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
