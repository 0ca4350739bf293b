"""W&B logging on rank 0: offline unless a key is configured.

Every experiment run is one W&B run (job_type "train") in the group of its table (``experiment``),
tagged by method, dataset, partition scheme, beta and seed, with the run config, the per-round
metrics and a final summary. A rendered table is logged as a ``wandb.Table`` (plus its figures) in
one more run of the group, job_type "table". Files go under ``directory`` (default: ``$WANDB_DIR``,
else results/wandb); offline runs land in ``<directory>/wandb/offline-run-*`` and can be uploaded
later with ``wandb sync``. A train run's W&B id is its record identity (wandb_run_id), so a replay or a
rerun of the same result is the same W&B run; whether to go online is one rule (wandb_mode).
"""
from __future__ import annotations

import csv
import hashlib
import os
from pathlib import Path
from typing import Any

from bench.assembly.config import RunConfig, beta_text, flat_partition
from bench.assembly.run_outputs import RunObserver, round_scalars
from bench.core.code_version import code_version
from bench.core.errors import FedbenchError
from bench.tables.columns import column_of, run_column

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


def api_key() -> str | None:
    """The API key W&B itself would use, by W&B's own lookup (what ``wandb.api.api_key`` returns, without
    its deprecation notice): the session's credentials, $WANDB_API_KEY, a `wandb login` entry in the netrc
    file for W&B's host, or the settings files' key. No network call."""
    try:  # wandb >= 0.22 (requirements.lock pins 0.31): the lookup behind wandb.api.api_key
        from wandb.sdk import wandb_setup
        from wandb.sdk.lib import wbauth
    except ImportError:  # another wandb: its public (deprecated) property
        import wandb

        return wandb.api.api_key
    settings = wandb_setup.singleton().settings
    auth = wbauth.session_credentials(host=settings.base_url)
    if isinstance(auth, wbauth.AuthApiKey):
        return auth.api_key
    return os.environ.get("WANDB_API_KEY") or wbauth.read_netrc_auth(host=settings.base_url) or settings.api_key


def wandb_mode() -> str:
    """The one rule for going online, used by every W&B run we log and by `fedbench dashboard`:
    $WANDB_MODE when set (``dryrun`` is ``offline``), else ``online`` when W&B has a key (api_key: the
    environment or `wandb login`), else ``offline``."""
    mode = os.environ.get("WANDB_MODE")
    if mode:
        return "offline" if mode == "dryrun" else mode
    return "online" if api_key() else "offline"


def wandb_run_id(cfg, code: str | None) -> str:
    """A train run's W&B id: its record identity (experiment, record name: run name and result identity)
    and the code version that made its numbers, hashed. A replay of its record, or the same run again,
    gets the same id, so W&B holds one run per result (never a seed twice in a group's mean)."""
    key = f"{cfg.experiment}/{cfg.record_name()}/{code}"
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def table_run_id(group: str, name: str) -> str:
    """A table run's W&B id: one run per rendered table (``name``, the table's file stem) in its group;
    rendering it again updates that run."""
    return hashlib.sha1(f"{group}/{name}/table".encode()).hexdigest()[:16]


def run_files(directory: str | None, run_id: str) -> list[Path]:
    """The run files (``run-<id>.wandb``) W&B wrote for ``run_id`` under ``directory``, offline or online."""
    root = Path(directory or default_dir()) / "wandb"
    return sorted(root.glob(f"*run-*-{run_id}/run-{run_id}.wandb"))


def logged(directory: str | None, run_id: str) -> bool:
    """Whether W&B's files under ``directory`` hold the run ``run_id`` finished (its exit record with
    exit code 0): logging it again would only repeat it."""
    return any(exit_code(path) == 0 for path in run_files(directory, run_id))


LOG_BLOCK, LOG_HEADER = 32768, 7  # wandb's run file: 32 KiB blocks of records (crc32, length, type)


def exit_code(path: Path) -> int | None:
    """The exit code in a W&B run file's exit record (None: the run never finished, e.g. killed). The file
    is a LevelDB-style log of wandb.proto ``Record`` messages; a torn last record ends the scan."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    pos, pending, code = LOG_HEADER, b"", None
    while pos + LOG_HEADER <= len(data):
        if LOG_BLOCK - pos % LOG_BLOCK < LOG_HEADER:  # block trailer padding
            pos += LOG_BLOCK - pos % LOG_BLOCK
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        pending = (b"" if kind in (0, 1, 2) else pending) + data[pos + LOG_HEADER:pos + LOG_HEADER + length]
        pos += LOG_HEADER + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            rec = pb.Record()
            try:
                rec.ParseFromString(pending)
            except Exception:  # noqa: BLE001 (a torn record: the run did not finish writing)
                return code
            if rec.WhichOneof("record_type") == "exit":
                code = rec.exit.exit_code
    return code


def column_key(cfg) -> str:
    """The run's column as a table names it, W&B's config.partition_key: dirichlet-0.05, dirichlet-classwise-0.3,
    shards-2, iid, ... (bench/tables/columns.py's run_column, the one partition key)."""
    return run_column(cfg.partition, cfg.data.client_split_file)


def run_identity(cfg, table: str | None = None, row: str | None = None, round_rule: str | None = None,
                 overridden: bool = False) -> dict[str, Any]:
    """What tells a train run apart in W&B (its config, for grouping and filtering): the table and
    row it fills (a single `fedbench run`: its experiment and method), dataset, partition key, beta,
    seed, protocol, the round rule its table reports, and whether command-line overrides (--set) changed
    it from its table config. (The method is the config's ``method.name``; these keys never shadow the
    config's option groups.)"""
    from bench.tables.protocols import default_round_rule
    from lightning_modules.base import METHODS

    cls = METHODS.get(cfg.method.name)
    protocol = cfg.scored_protocol(cls.protocol, cls.runs_centrally)
    key = column_key(cfg)
    column = column_of(key)
    return {"table": table or cfg.experiment, "row": row or cfg.method.name,
            "dataset": cfg.data.name, "partition_key": key,
            "beta": None if column is None else column.beta, "seed": cfg.seed,
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
        tags.append(f"beta={beta_text(flat_partition({'args': p.args})['beta'])}")
    return tags + [f"seed={cfg.seed}"]


class WandbRun:
    """A thin wrapper so that the orchestrator never imports wandb when it is disabled."""

    def __init__(self, enabled: bool, project: str, group: str, name: str, tags: list[str], config: dict,
                 directory: str | None = None, job_type: str = "train", run_id: str | None = None) -> None:
        """``run_id`` (wandb_run_id, table_run_id): the run W&B continues when it already has it (online:
        resumed; offline: ``wandb sync`` uploads every file of the id into that one run)."""
        self.run = None
        if not enabled:
            return
        import wandb

        directory = directory or default_dir()
        os.makedirs(directory, exist_ok=True)
        self.run = wandb.init(project=project, group=group, name=name, tags=tags, config=config, dir=directory,
                              mode=wandb_mode(), job_type=job_type, reinit="finish_previous", id=run_id,
                              resume="allow" if run_id else None)

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
        self.skipped = False  # W&B already holds this run, finished (``logged``): not logged again

    def start(self, cfg: RunConfig, rank: int) -> None:
        self.identity = self.identity or run_identity(cfg, overridden=bool(self.annotations))
        run_id = wandb_run_id(cfg, code_version(cfg))
        self.skipped = rank == 0 and logged(self.directory, run_id)
        self.run = WandbRun(rank == 0 and not self.skipped, cfg.wandb_project, cfg.experiment,
                            display_name(self.identity), run_tags(cfg),
                            {**cfg.to_dict(), "code_version": code_version(cfg), **self.annotations, **self.identity},
                            self.directory, run_id=run_id)
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
    from bench.tables.protocols import select_round

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
                   directory, job_type="table", run_id=table_run_id(group, name))
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
               directory: str | None = None, run_id: str | None = None) -> str | None:
    """One finished run's record as a W&B train run, after the fact: the same group, name, tags, config
    (the record's config, code version and command-line overrides, with ``identity``), id (``run_id``:
    wandb_run_id of the record's run and code version) and summary as a live run, and its per-round
    history through the same Fabric logger at the same steps. Returns the run's local files directory."""
    config = {**record["config"], "code_version": record.get("code_version"),
              **({"overrides": record["overrides"]} if record.get("overrides") else {}), **identity}
    rows = replayed_rows(record)
    run = WandbRun(True, project, record["experiment"], display_name(identity), tags, config, directory,
                   run_id=run_id)
    logger = run.fabric_logger()
    for row in rows:
        logger.log_metrics(row, step=row["round"])
    run.summary({**run_summary(record), **rule_summary(record, identity["round_rule"])})
    run_dir = run.run.dir if run.run is not None else None
    run.finish()
    return run_dir
