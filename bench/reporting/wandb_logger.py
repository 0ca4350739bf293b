"""W&B logging on rank 0: offline unless a key is configured.

Every experiment run is one W&B run (job_type "train") in the group of its table (``experiment``),
tagged by method, dataset, partition scheme, beta and seed, with the run config, the per-round
metrics and a final summary. A rendered table is logged as a ``wandb.Table`` (plus its figures) in
one more run of the group, job_type "table". Files go under ``directory`` (default: ``$WANDB_DIR``,
else results/wandb); offline runs land in ``<directory>/wandb/offline-run-*`` and can be uploaded
later with ``wandb sync``.
"""
from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

from bench.code_version import code_version
from bench.config import RunConfig
from bench.core.errors import FedbenchError
from bench.experiment import RunObserver, round_scalars

FABRIC_STEP = "trainer/global_step"  # the step key wandb's Fabric logger adds to every row it logs
# the CSV's text columns (the others are numbers, or empty)
TEXT_COLUMNS = {"method", "metric", "values", "column", "round_rule", "protocol_differs", "other_papers", "baseline",
                "paper_source", "departures"}
COUNT_COLUMNS = {"n_seeds", "expected_seeds", "paired_n", "best"}


def csv_value(column: str, text: str) -> Any:
    """A CSV cell as the W&B table holds it: None when empty, text for the text columns, else a number."""
    if text == "":
        return None
    if column in TEXT_COLUMNS:
        return text
    try:
        number = float(text)
    except ValueError:  # a text column this list does not know yet
        return text
    return int(number) if column in COUNT_COLUMNS else number


def table_rows(csv_path: str, cells: list[dict]) -> tuple[list[str], list[list[Any]]]:
    """(columns, rows) of the table's W&B copy: every column of the CSV the table wrote, in its order
    (the paired difference to the baseline with its 95% interval and p, the paper's value, Δ and p,
    the protocol status, ...), then ``paired_note``, why a row has no paired difference (from the
    JSON's cells, which are in the CSV's row order)."""
    with open(csv_path, newline="") as f:
        header, *lines = list(csv.reader(f))
    if len(lines) != len(cells):
        raise FedbenchError(f"{csv_path} has {len(lines)} rows, its JSON {len(cells)} cells: render the table again.")
    rows = [[csv_value(c, v) for c, v in zip(header, line)] + [cell.get("paired_note")]
            for line, cell in zip(lines, cells)]
    return [*header, "paired_note"], rows


def default_dir() -> str:
    return os.environ.get("WANDB_DIR") or "results/wandb"


def partition_key(cfg) -> str:
    """The partition as a table column names it: dirichlet-0.05, shards-2, iid, ..."""
    p = cfg.partition
    if p.scheme in ("dirichlet", "dirichlet_missing", "lda"):
        return f"{p.scheme}-{p.beta:g}"
    if p.scheme == "shards":
        return f"shards-{p.shards_per_client}"
    return p.scheme


def run_identity(cfg, table: str | None = None, row: str | None = None, round_rule: str | None = None,
                 overridden: bool = False) -> dict[str, Any]:
    """What tells a train run apart in W&B (its config, for grouping and filtering): the table and
    row it fills (a single `fedbench run`: its experiment and method), dataset, partition key, beta,
    seed, protocol, the round rule its table reports, and whether command-line overrides (--set) changed
    it from its table config. (The method is the config's ``method.name``; these keys never shadow the
    config's option groups.)"""
    from bench.reporting.protocols import default_round_rule
    from lightning_modules.base import METHODS

    cls = METHODS.get(cfg.method.name)
    protocol = "global" if cls.runs_centrally else (cfg.fed.protocol or cls.protocol)
    p = cfg.partition
    return {"table": table or cfg.experiment, "row": row or cfg.method.name,
            "dataset": cfg.data.name, "partition_key": partition_key(cfg),
            "beta": p.beta if p.scheme in ("dirichlet", "dirichlet_missing", "lda") else None, "seed": cfg.seed,
            "protocol": protocol, "round_rule": round_rule or default_round_rule(protocol, None),
            "overridden": overridden}


def display_name(identity: dict[str, Any]) -> str:
    """A run's name as the table reads: ``FedCB · β=0.05 · seed 1`` (other partitions by their key)."""
    where = f"β={identity['beta']:g}" if identity.get("beta") is not None else identity["partition_key"]
    return f"{identity['row']} · {where} · seed {identity['seed']}"


def run_tags(cfg) -> list[str]:
    """method, dataset, partition scheme, beta (Dirichlet schemes) and seed of a RunConfig."""
    p = cfg.partition
    tags = [cfg.method.name, cfg.data.name, p.scheme]
    if p.scheme.startswith("dirichlet"):
        tags.append(f"beta={p.beta:g}")
    return tags + [f"seed={cfg.seed}"]


class WandbRun:
    """A thin wrapper so that the orchestrator never imports wandb when it is disabled."""

    def __init__(self, enabled: bool, project: str, group: str, name: str, tags: list[str], config: dict,
                 directory: str | None = None, job_type: str = "train") -> None:
        self.run = None
        if not enabled:
            return
        import wandb

        directory = directory or default_dir()
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        os.makedirs(directory, exist_ok=True)
        self.run = wandb.init(project=project, group=group, name=name, tags=tags, config=config, dir=directory,
                              mode=mode, job_type=job_type, reinit="finish_previous")

    def fabric_logger(self):
        """wandb's Fabric logger (wandb.integration.lightning.fabric.WandbLogger) on this run, with ``round``
        as the x-axis of every per-round chart; None when disabled. The logger adds its own step key
        (trainer/global_step, the round again) to each row: hidden in the UI."""
        if self.run is None:
            return None
        from wandb.integration.lightning.fabric import WandbLogger  # (warns once: "tested with Fabric 2.1.3")

        self.run.define_metric("round")
        self.run.define_metric("*", step_metric="round")
        self.run.define_metric(FABRIC_STEP, hidden=True)
        return WandbLogger(experiment=self.run)

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if self.run is not None:
            self.run.log(metrics, step=step)

    def summary(self, values: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.summary.update(values)

    def finish(self, exit_code: int = 0) -> None:
        if self.run is not None:
            self.run.finish(exit_code=exit_code)
            self.run = None


class WandbObserver(RunObserver):
    """Logs one experiment run (run_experiment's observer) to W&B on rank 0: config with the code
    version and the run's identity, tags, the summary at the table's round rule. The per-round scalars
    go through Fabric: ``loggers()`` gives run_experiment wandb's Fabric logger on this run, which
    ``fabric.log_dict`` feeds with the same keys as the CSV (and TensorBoard) logger."""

    def __init__(self, directory: str | None = None, annotations: dict[str, Any] | None = None,
                 identity: dict[str, Any] | None = None) -> None:
        self.directory = directory
        self.annotations = dict(annotations or {})  # extra config entries, e.g. a table's command-line overrides
        self.identity = identity  # run_identity(...) of its table row; None: a single run's own
        self.run: WandbRun | None = None
        self.logger = None

    def start(self, cfg: RunConfig, rank: int) -> None:
        self.identity = self.identity or run_identity(cfg, overridden=bool(self.annotations))
        self.run = WandbRun(rank == 0, cfg.wandb_project, cfg.experiment, display_name(self.identity), run_tags(cfg),
                            {**cfg.to_dict(), "code_version": code_version(cfg), **self.annotations, **self.identity},
                            self.directory)
        self.logger = self.run.fabric_logger()

    def loggers(self) -> list:
        """W&B's own Fabric logger on this run (rank 0): run_experiment's fabric.log_dict reaches it."""
        return [] if self.logger is None else [self.logger]

    def summary(self, record: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.summary({**run_summary(record), **rule_summary(record, self.identity["round_rule"])})

    def finish(self, exit_code: int = 0) -> None:
        if self.run is not None:
            self.run.finish(exit_code=exit_code)


def wandb_observer(cfg: RunConfig, directory: str | None = None, annotations: dict[str, Any] | None = None,
                   identity: dict[str, Any] | None = None) -> WandbObserver | None:
    """The observer to pass to run_experiment: W&B logging when cfg.wandb, else none. ``annotations``
    join the W&B run's config (what run_experiment also stores in the record); ``identity`` (run_identity)
    names the table row the run fills."""
    return WandbObserver(directory, annotations, identity) if cfg.wandb else None


def rule_summary(record: dict, rule: str) -> dict[str, Any]:
    """The metrics at the round the run's table reports (``rule``), under their plain names, so that
    W&B's run table shows what the markdown table does, not the last round's values."""
    from bench.reporting.protocols import select_round

    entry = select_round(record.get("history") or [], rule)
    if entry is None:
        return {}
    return {**entry["metrics"], "reported_round": entry["round"], "round_rule": rule}


def run_summary(record: dict) -> dict[str, Any]:
    """The final summary of a run record: best and final test metrics, best round, protocol."""
    out: dict[str, Any] = {f"best/{k}": v for k, v in (record.get("best") or {}).items()}
    out.update({f"final/{k}": v for k, v in (record.get("final") or {}).items()})
    out.update(best_round=record.get("best_round"), protocol=record.get("protocol"))
    return out


def log_table(table: dict, csv_path: str, figures: dict[str, str], project: str,
              directory: str | None = None) -> str | None:
    """Log a rendered table as a wandb.Table equal to its CSV (``table_rows``; ``table`` is the JSON
    bench/reporting/tables.py wrote beside it), and its PNG figures, in a run of the table's group with
    job_type "table". Returns the run's local files directory."""
    import wandb

    name = table.get("name") or f"{table['table']}_{table['dataset']}"
    config = {"table": table["table"], "dataset": table["dataset"], "papers": table.get("papers"),
              "setup": table.get("setup")}
    group = table.get("experiment") or name  # the group of the table's runs
    run = WandbRun(True, project, group, f"{name}-table", ["table", table["table"], table["dataset"]], config,
                   directory, job_type="table")
    columns, rows = table_rows(csv_path, table["cells"])
    media: dict[str, Any] = {RESULTS_KEY: wandb.Table(columns=columns, data=rows)}
    media.update({f"figures/{key.replace(' ', '_')}": wandb.Image(path) for key, path in figures.items() if Path(path).exists()})
    run.log(media)
    run.summary({"cells": len(rows), "missing_cells": sum(cell.get("mean") is None for cell in table["cells"])})
    run_dir = run.run.dir if run.run is not None else None
    run.finish()
    return run_dir


RESULTS_KEY = "results"  # the logged table's key (the dashboard's results panel shows it)


def replayed_rows(record: dict) -> list[dict[str, Any]]:
    """A record's per-round scalars as a live run logs them (round_scalars, with ``round``). A record
    written before the history kept timings, lr and bytes is refused (rerun it)."""
    per_client = record.get("bytes_per_client_round")
    try:
        if per_client is None:
            raise KeyError("bytes_per_client_round")
        return [{**round_scalars(e, per_client), "round": e["round"]} for e in record.get("history") or []]
    except KeyError as err:
        raise FedbenchError(f"Record {record.get('run_name')!r} lacks {err} (written by older code): rerun it "
                            "(fedbench table without --render-only) to log its rounds to W&B.") from None


def log_record(record: dict, identity: dict[str, Any], tags: list[str], project: str,
               directory: str | None = None) -> str | None:
    """One finished run's record as a W&B train run, after the fact: the same group, name, tags, config
    (the record's config, code version and command-line overrides, with ``identity``) and summary as a
    live run, and its per-round history through the same Fabric logger at the same steps. Returns
    the run's local files directory."""
    config = {**record["config"], "code_version": record.get("code_version"),
              **({"overrides": record["overrides"]} if record.get("overrides") else {}), **identity}
    rows = replayed_rows(record)
    run = WandbRun(True, project, record["experiment"], display_name(identity), tags, config, directory)
    logger = run.fabric_logger()
    for row in rows:
        logger.log_metrics(row, step=row["round"])
    run.summary({**run_summary(record), **rule_summary(record, identity["round_rule"])})
    run_dir = run.run.dir if run.run is not None else None
    run.finish()
    return run_dir
