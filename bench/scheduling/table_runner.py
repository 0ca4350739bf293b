"""`fedbench table`: expand a table config into runs (method x column x seed), run the missing ones,
then render the table from the run records only.

A table config (configs/tables/*.yaml) holds ``base`` (RunConfig overrides shared by every run),
``columns`` (partition settings, bench/tables/columns.py; ``betas: [...]`` is sugar for
Dirichlet columns), ``seeds`` (or ``folds: K`` with one seed: K-fold cross-validation, the runs repeat over
data.fold 0..K-1 instead of over seeds, and the table's mean ± std and paired differences are over the folds),
``metrics``, ``round_rule`` (how global-model rows pick their round,
bench/tables/protocols.py) and ``rows`` (label + overrides; ``partition_independent: true`` for
rows such as Central that do not depend on the partition: run once per seed, shown in every column;
``columns`` / ``betas`` for rows whose options differ per column: the row runs in those columns
only, and rows sharing a label fill one table row). A run's partition is the base one, then the column's settings, then the row's
own ``partition``. ``uncovered: [{paper, table, ..., reason}]`` says why published cells that no
row can reproduce are left out (reported by ``fedbench coverage``); ``baseline`` names the row every other
row is paired with over seeds (default: the row labelled FedAvg; bench/reporting/tables.py); ``stand_in: <why>``
marks an offline stand-in for a paper's data, never compared with a paper's number; ``cannot_show: <what>`` says,
under the table's title, which effect the stand-in cannot show (a random-weight CLIP: no zero-shot to refine). Identical runs of different
rows (one FedBM run shown under several ablation tables) run once and share their record.

Command-line changes without editing the YAML (bench/tables/table_overrides.py): ``--set KEY=VALUE``
on every run, ``--seeds`` / ``--rows`` subsets; ``--data-home`` (or $FEDBENCH_DATA) is the folder the
datasets are found in by their archive names (datamodules/data_home.py). The overridden runs are
checked like the config's own (bench/assembly/validation.py), every one before the first starts.

Two row keys serve ablations:
  record_tag   rows that differ only in options the run name does not show (FACMIC Table 4's batch
               sizes) keep their records apart: the row's runs go to experiment ``<table>_<dataset>-<tag>``.
  average_of   a derived row, never run: per seed and column, the mean of the listed rows (FACMIC
               Table 4's "Avg" over batch sizes); it is measured as its first listed row.
"""
from __future__ import annotations

import dataclasses
import json
import warnings
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path

from tqdm.auto import tqdm

from bench.assembly.config import OPTION_GROUPS, RunConfig, result_config
from bench.assembly.records import (
    RecordError,
    bare_record_path,
    find_record,
    load_record,
    run_record_path,
    same_result_config,
)
from bench.core.code_version import code_version, same_code
from bench.core.errors import FedbenchError, FedbenchWarning
from bench.core.import_gc import stack_import
from bench.core.lifetime import first_process
from bench.scheduling.table_jobs import JOB_MEMORY_GIB, mps_on
from bench.tables.columns import columns_from, table_columns
from bench.tables.flags import CommandParser, options_yaml, spellings
from bench.tables.spec import deep_merge, run_config
from bench.tables.table_overrides import TableOverrides
from bench.tables.table_row import TableRow
from bench.tables.table_spec import TableSpec, load_table_config
from datamodules.data_home import DATA_HOME_ENV, set_data_home

# a table's runs score the test set at every evaluated round (its curves and test-based round rules
# need them), unless its config says otherwise
TABLE_DEFAULTS = {"fed": {"test_rounds": "all"}}


@dataclass
class PlannedRun:
    label: str
    beta: float | None  # the Dirichlet concentration of its column, when it has one
    seed: int  # the table's repeat axis (rows are paired on it): the run's seed, or with ``folds`` its fold
    cfg: RunConfig
    columns: list[str]  # ids of the columns this run fills
    row: TableRow = field(default_factory=lambda: TableRow("run"))  # the row of the table config it comes from
    # command-line (--set) changes to its budget (bench/tables/table_overrides.py): never comparable with a paper
    overrides: dict = field(default_factory=dict)
    fold: int | None = None  # its fold (data.fold) in a table with ``folds``


def plan_runs(spec: TableSpec, output_dir: str | None = None, check_records: bool = True) -> list[PlannedRun]:
    """The runs of a table config. ``check_records=False`` leaves check_shared_records to the caller
    (``fedbench table`` checks every run's options first: a typo'd option is named as such, not as
    two rows sharing a record)."""
    experiment = spec.name
    columns = table_columns(spec)
    by_id = {c.id: c for c in columns}
    ran = [c for c in columns if not c.derived]
    if not ran:
        raise FedbenchError(f"Table {experiment}: every column is derived ({[c.id for c in columns]}); add partitions to run.")
    base_partition = deep_merge(RunConfig().to_dict()["partition"], spec.base_partition)
    base = {k: v for k, v in spec.base.items() if k != "partition"}  # the partition: run_partition, per run
    runs = []
    for row in spec.rows:
        if row.derived:
            continue  # derived rows take their runs from their sources, below
        where = f"Table {experiment}, row {row.label!r}"
        if row.columns is not None or row.betas is not None:
            row_base = deep_merge(base_partition, row.partition)
            mine = [c.id for c in columns_from(row.columns, row.betas, where, row_base)]
            if not set(mine) <= set(by_id) or any(by_id[c].derived for c in mine):
                raise FedbenchError(f"{where}: columns {mine} not all in the table's run columns "
                                    f"{[c.id for c in ran]}.")
        else:
            mine = [c.id for c in ran]
        if row.partition_independent:
            mine = mine[:1]
        for col_id in mine:
            column = by_id[col_id]
            partition = run_partition(spec.base_partition, column.partition, row.partition)  # the same every seed
            for axis, fold, repeat in table_repeats(spec):
                run = {**repeat, "experiment": experiment + (f"-{row.record_tag}" if row.record_tag else "")}
                if output_dir:
                    run["output_dir"] = output_dir
                cfg = run_config(TABLE_DEFAULTS, base, row.overrides, {"partition": partition}, run, where=where)
                if column.client_split_file and (cfg.data.client_split_file is None
                                                 or cfg.fed.client_test != "site"):
                    raise FedbenchError(f"{where}: column {column.id} is a published client split: set "
                                        "data.client_split_file (FedNPR's ich_datasplit_10cl.npy) and "
                                        "fed.client_test site.")
                cols = [c.id for c in ran] if row.partition_independent else [col_id]
                runs.append(PlannedRun(row.label, column.beta, axis, cfg, cols, row, fold=fold))
    check_base_args(spec, runs)
    runs += derived_runs(spec, runs)
    for label in dict.fromkeys(r.label for r in runs):
        covered = {c for r in runs if r.label == label for c in r.columns}
        missing = [c for c in ran if c.id not in covered]
        if missing:
            what = (f"beta(s) {[c.beta for c in missing]}" if all(c.beta is not None for c in missing)
                    else f"column(s) {[c.id for c in missing]}")
            raise FedbenchError(f"Table {experiment}: row {label!r} has no run for {what}; rows restricted with "
                                "'columns' or 'betas' need a row with the same label for the other columns.")
    if check_records:
        check_shared_records(runs)
    return runs


def table_repeats(spec: TableSpec) -> list[tuple[int, int | None, dict]]:
    """(axis value, fold, run overrides) of each repeat of a run: one per seed, or with ``folds: K`` one per
    fold k = 0..K-1 (data.fold k of K, every fold with the table's one seed; rows are paired fold by fold)."""
    if spec.folds is None:
        return [(seed, None, {"seed": seed}) for seed in spec.seeds]
    run = spec.run_folds if spec.run_folds is not None else range(spec.folds)  # --folds: some of them
    return [(k, k, {"seed": spec.seeds[0], "data": {"fold": k, "folds": spec.folds}}) for k in run]


def fold_legend(spec: TableSpec) -> TableSpec:
    """The table config as rendered: with ``folds``, its title and legend say the mean ± std and the paired
    differences are over the K folds (the render's "seeds" axis is the fold)."""
    if spec.folds is None:
        return spec
    from bench.reporting.tables import folds_run

    folds, seed = spec.folds, spec.seeds[0]
    notes = (f"Cross-validation: every mean ± std is over {folds_run(spec)} of {folds}-fold cross-validation (fold k "
             f"tests on the k-th of {folds} folds of the pooled data, stratified by class and by site, and trains on "
             f"the other folds; seed {seed} in every fold); rows are paired fold by fold.")
    return dataclasses.replace(
        spec, title=f"{spec.shown_title} — mean ± std over {folds_run(spec, article='')} ({folds}-fold "
                    f"cross-validation, seed {seed})", notes=f"{notes}\n{spec.notes or ''}")


def run_partition(base: dict, column: dict, row: dict) -> dict:
    """The partition of one run: the table's base partition, then its column's, then its row's own. The scheme
    is the last one given; ``args`` merge option by option, and the base's and the column's apply only where the
    run's scheme takes them (a base ``min_size`` reaches the Dirichlet columns, not iid; ``shard_mode`` the
    shards columns); the row's own are its own (an option its scheme does not take is an error)."""
    from bench.tables.catalog import scheme_option_names

    merged = {**base, **column, **row}
    scheme = merged.get("scheme", "dirichlet")
    takes = scheme_option_names(scheme)
    inherited = {**(base.get("args") or {}), **(column.get("args") or {})}
    return {**merged, "args": {**{k: v for k, v in inherited.items() if k in takes}, **(row.get("args") or {})}}


def check_base_args(spec: TableSpec, runs: list[PlannedRun]) -> None:
    """Every option of the base partition's args is taken by the scheme of at least one run (a typo is named)."""
    from bench.tables.catalog import scheme_option_names

    given = set(spec.base_partition.get("args") or {})
    taken = set().union(*(scheme_option_names(r.cfg.partition.scheme) for r in runs)) if runs else set()
    if given - taken:
        schemes = sorted({r.cfg.partition.scheme for r in runs})
        raise FedbenchError(f"Table {spec.name}: base partition.args {sorted(given - taken)} is taken by none of "
                            f"the table's partition schemes ({', '.join(schemes)}); "
                            f"they take {sorted(taken) or 'no options'}.")


def derived_runs(spec: TableSpec, runs: list[PlannedRun]) -> list[PlannedRun]:
    """The runs behind ``average_of`` rows: their first source row's (so they run nothing new and are
    measured as it is); the averaging happens when the table is rendered (tables.collect)."""
    out = []
    labels = {r.label for r in runs}
    for row in spec.rows:
        if not row.derived:
            continue
        sources = row.average_of
        if not set(sources) <= labels:
            raise FedbenchError(f"Table {spec.name}, row {row.label!r}: average_of must list at least two distinct "
                                f"labels of rows that run (got {list(sources)!r}; rows: {sorted(labels)}).")
        first = next(r.row for r in runs if r.label == sources[0])
        # measured as its first source: that row's round rule, partition independence and own partition
        derived = dataclasses.replace(row, round_rule=first.round_rule, partition_independent=first.partition_independent,
                                      overrides={"partition": first.partition} if first.partition else {})
        out += [PlannedRun(row.label, r.beta, r.seed, r.cfg, r.columns, derived, fold=r.fold)
                for r in runs if r.label == sources[0]]
    return out


def check_shared_records(runs: list[PlannedRun]) -> None:
    """Rows whose runs would write one record must be the same run (same result-config)."""
    by_path: dict[Path, PlannedRun] = {}
    for r in runs:
        other = by_path.setdefault(run_record_path(r.cfg), r)
        if other is not r and result_config(other.cfg.to_dict()) != result_config(r.cfg.to_dict()):
            raise FedbenchError(f"Table {r.cfg.experiment}: rows {other.label!r} and {r.label!r} would write the same "
                                f"run record ({r.cfg.record_name()}) with different options; give one of them different "
                                "method options or put it in another table.")


def distinct_runs(runs: list[PlannedRun]) -> list[PlannedRun]:
    """One run per record: rows that repeat a run (the same method, options and partition under
    several ablation tables) share it."""
    seen: set[Path] = set()
    out = []
    for r in runs:
        path = run_record_path(r.cfg)
        if path not in seen:
            seen.add(path)
            out.append(r)
    return out


def record_status(cfg: RunConfig) -> tuple[dict | None, str]:
    """(the record to reuse, or None; why): a record is reused when its result-config and the code
    version of its run (bench/core/code_version.py: engine, method, data module, partition scheme) match."""
    path = find_record(cfg)
    if path is None:  # a record of this run name under other options: say so
        return None, "config changed" if bare_record_path(cfg).exists() else "no record"
    try:
        rec = load_record(path)
    except RecordError as err:  # a broken record is an unfinished run: rerun it (and say so)
        warnings.warn(FedbenchWarning(f"{err} It is rerun now."), stacklevel=2)
        return None, "unreadable record"
    if not same_result_config(rec, cfg):  # edited by hand (the identity in its name no longer holds)
        return None, "config changed"
    if not same_code(rec.get("code_version"), cfg):  # a legacy version: by its tree's parts
        return None, f"code changed ({rec.get('code_version') or 'unversioned'} -> {code_version(cfg)})"
    if prompts_file_changed(cfg, rec):
        return None, "prompts file changed"
    return rec, "up to date"


def prompts_file_changed(cfg: RunConfig, rec: dict) -> bool:
    """Whether the run's prompts file (method.args.prompts) now says something else than when the
    record was written (the config names the file, the record keeps what it said)."""
    path = cfg.method.args.get("prompts")
    if not isinstance(path, str):
        return False
    from lightning_modules.components.prompts import load_prompt_file

    kept = (rec.get("prompts") or {}).get("file") or {}
    return {k: kept.get(k) for k in ("concepts", "templates")} != load_prompt_file(path).content()


def run_option_hint(flag: str, value: str | None) -> str | None:
    """A `run` option given to `table` (``--fed.rounds 3``): the ``--set`` that does it."""
    key = spellings(flag)[0][2:]
    group, _, field_name = key.partition(".")
    if group in OPTION_GROUPS and field_name in {f.name for f in fields(OPTION_GROUPS[group])} \
            or key in {f.name for f in fields(RunConfig)} and key not in OPTION_GROUPS:
        return f"a run option goes through --set: --set {key}={value if value is not None else 'VALUE'}"
    return None


def build_parser() -> CommandParser:
    parser = CommandParser(prog="fedbench table", description=__doc__, hint=run_option_hint, own_print_config=True,
                           epilog="Flags take either spelling (--output-dir or --output_dir); a boolean flag may be "
                                  "bare (true); a list flag takes [a,b] (also a,b, a b, or the flag repeated).")
    parser._option_string_actions["--print_config"].help = "print the options as YAML, then the plan (--dry-run), and exit"
    parser.add_argument("--config", required=True, help="configs/tables/<table>_<dataset>.yaml")
    parser.add_argument("--dry-run", type=bool, default=False,
                        help="print the table's plan (its runs, which have a record, an estimated time) and exit: "
                             "nothing runs, nothing is written (--print_config: the options, then the plan)")
    parser.add_argument("--force", type=bool, default=False, help="rerun even when a record with the same config exists")
    parser.add_argument("--render-only", type=bool, default=False, help="only render the table from existing records")
    parser.add_argument("--replace-table", type=bool, default=False,
                        help="overwrite the rendered table even when it would lose values (records missing here); "
                             "by default a table is never replaced by a less complete one")
    parser.add_argument("--devices", type=int | None, default=None,
                        help="Fabric ranks (default: the config's, else auto: one 1-thread rank per core)")
    parser.add_argument("--jobs", type=str | None, default=None,
                        help="runs at once, each on one rank with cores/jobs threads, longest first; on GPUs worker "
                             "i uses GPU i mod (GPU count), so several may share one (bench/scheduling/table_jobs.py). "
                             "auto: one per core on GPUs (as many as their memory holds), one on a CPU (default: 1)")
    parser.add_argument("--job-memory", type=float, default=JOB_MEMORY_GIB,
                        help="GiB of GPU memory a --jobs run needs free before it starts (it waits for them; more "
                             "workers per GPU than its memory holds is refused). Peaks at 128 px, batch 8: FedAvg 1.8, "
                             "FedRep 1.2, FedBM 3.6")
    parser.add_argument("--output-dir", type=str | None, default=None, help="where run records go (default results/runs)")
    parser.add_argument("--tables-dir", type=str, default="results/tables")
    parser.add_argument("--wandb", type=bool | None, default=None,
                        help="log the runs and the rendered table to W&B (default: the table config's 'wandb', "
                             "else false)")
    parser.add_argument("--tensorboard", type=bool, default=False,
                        help="also log each run's per-round scalars to TensorBoard, under <output-dir>/<table>/"
                             "tensorboard (every run logs them to CSV under .../csv)")
    parser.add_argument("--wandb-dir", type=str | None, default=None, help="W&B files (default $WANDB_DIR, else results/wandb)")
    parser.add_argument("--data-home", type=str | None, default=None,
                        help=f"folder holding the datasets under their archive names (default ${DATA_HOME_ENV}, else ./data)")
    parser.add_argument("--set", type=list[str], default=[], keep_commas=True,
                        help="override run options in every run, e.g. --set [fed.rounds=2,data.image_size=64] or "
                             "--set fed.rounds=2 --set data.image_size=64 (the table is then labelled and filed as a "
                             "reduced run)")
    parser.add_argument("--seeds", type=list[int] | None, default=None,
                        help="run only these of the config's seeds, e.g. --seeds [0,1] (or 0,1)")
    parser.add_argument("--folds", type=list[int] | None, default=None,
                        help="in a table with folds: K, run only these folds, e.g. --folds [0,2] (a reduced run)")
    parser.add_argument("--rows", type=list[str] | None, default=None, keep_commas=True,
                        help="run only these rows, by label: --rows [FedAvg,FedBM] (or FedAvg,FedBM; a label with a "
                             "comma: quote it, --rows '[\"FedCB, tau 10\"]', or give it alone: --rows 'FedCB, tau 10')")
    parser.add_argument("--shard", type=str | None, default=None,
                        help="I/N: run only shard I of N (1 <= I <= N) of the table's runs, e.g. one per machine or "
                             "SLURM array task (--shard $((SLURM_ARRAY_TASK_ID + 1))/N); records go to the shared "
                             "--output-dir, and the table is rendered once every run of it has a record")
    return parser


def planned_table(config: str, sets: list[str] | None = None, seeds: str | None = None, rows: list[str] | None = None,
                  folds: str | None = None, output_dir: str | None = None
                  ) -> tuple[TableSpec, TableSpec, TableOverrides, list[PlannedRun]]:
    """(the table config, the config as selected by --seeds/--rows/--folds, the command-line overrides, the
    planned runs with the overrides applied: their experiments are their records' folders and W&B groups).
    `fedbench table` and `fedbench dashboard` both plan a table through this, so that they agree."""
    full_spec = load_table_config(config)
    overrides = TableOverrides.parse(full_spec, sets, seeds, rows, folds)
    spec = overrides.select(full_spec)
    runs = plan_runs(spec, output_dir, check_records=False)
    overrides.apply(runs)
    return full_spec, spec, overrides, runs


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.jobs = parse_jobs(args.jobs)  # first: --print_config shows the number (or auto)
    options = options_yaml(args) if args.print_config else None
    args.shard = parse_shard(args.shard)
    check_flag_combinations(args)
    if args.data_home:
        set_data_home(args.data_home)
    full_spec, spec, overrides, runs = planned_table(args.config, args.set, args.seeds, args.rows, args.folds,
                                                     args.output_dir)
    args.wandb = full_spec.wandb if args.wandb is None else args.wandb
    if args.dry_run or args.print_config:
        return show_plan(runs, spec, args, overrides, options)
    if first_process():  # what it is about to do, before the training stack is imported (the checks import it)
        what = "rendering the table from their records" if args.render_only else "checking every run before any starts"
        print(f"{spec.heading}: {len(distinct_runs(runs))} runs planned from {args.config}; {what}"
              + ("; CUDA MPS: on" if args.jobs != 1 and mps_on() else ""), flush=True)
    from bench.reporting.tables import render_table

    in_wandb = wandb_logged(runs, args.wandb_dir) if args.wandb else set()  # before anything is logged
    trained: list[PlannedRun] = []
    if args.render_only:
        check_render_plan(runs)
    else:
        check_plan(runs, spec, args, overrides)
        rank, trained = execute(runs, spec, args, overrides.record())
        if rank != 0:
            return 0  # other ranks: rank 0 renders
        if args.shard is not None:
            waiting = [r for r in distinct_runs(runs) if record_status(r.cfg)[1] != "up to date"]
            if waiting:
                i, n = args.shard
                print(f"shard {i}/{n} done; the table waits for {len(waiting)} of {len(distinct_runs(runs))} runs "
                      "from the other shards (the shard that completes the set renders it, or run the same command "
                      "with --render-only).")
                return 0
    name = overrides.table_name(spec.name)
    paths = render_table(fold_legend(spec), runs, overrides.tables_dir(args.tables_dir), name=name,
                         changes=overrides.describe(full_spec), reduced=overrides.reduced,
                         title_note=overrides.title_note(),
                         replace=args.replace_table)
    print(Path(paths["md"]).read_text())
    print("written: " + ", ".join(str(p) for p in paths.values()))
    if args.wandb:
        log_to_wandb(runs, spec, paths, args, in_wandb, trained)
    return 0


def wandb_ids(r: PlannedRun) -> tuple[str, ...]:
    """The W&B ids (wandb_logger.wandb_run_id) ``r`` is logged under: the current code's, and its record's
    when that was written by other code (rendered, not rerun, with --render-only)."""
    from bench.tracking.wandb_logger import wandb_run_id

    path = find_record(r.cfg)
    try:
        kept = load_record(path).get("code_version") if path is not None else None
    except RecordError:
        kept = None
    codes = [code_version(r.cfg)] if kept is None else [kept, code_version(r.cfg)]
    return tuple(dict.fromkeys(wandb_run_id(r.cfg, code) for code in codes))


def wandb_logged(runs: list[PlannedRun], directory: str | None) -> set[str]:
    """The ids of the table's train runs that W&B's files under ``directory`` already hold, finished."""
    from bench.tracking.wandb_logger import logged

    return {i for r in distinct_runs(runs) for i in wandb_ids(r) if logged(directory, i)}


def show_plan(runs: list[PlannedRun], spec: TableSpec, args, overrides: TableOverrides, options: str | None) -> int:
    """--dry-run / --print_config: the runs checked as a real table run checks them, then the plan (the
    command's options first with --print_config); nothing runs and nothing is written (table_plan.py)."""
    from bench.scheduling.table_plan import plan_text

    if args.render_only:
        check_render_plan(runs)
    else:
        check_plan(runs, spec, args, overrides)
    if options is not None:
        print(options)
    title = spec.heading + (f" (shard {args.shard[0]}/{args.shard[1]})" if args.shard else "")
    print(plan_text(shard_runs(distinct_runs(runs), args.shard), title, args.force, args.jobs, args.render_only))
    return 0


def log_to_wandb(runs: list[PlannedRun], spec: TableSpec, paths: dict[str, str], args, in_wandb: set[str],
                 trained: list[PlannedRun]) -> None:
    """Every record of the table as a W&B train run, once: a run W&B held before this command
    (``in_wandb``) is skipped, one this command ran (``trained``) was logged live, any other is replayed from its
    record (bench/tracking/wandb_logger.py log_record: what a live run would have logged, under the same
    id; nothing is rerun). Then the rendered table (a wandb.Table equal to its CSV, and its figures)."""
    from bench.tracking.wandb_logger import log_record, log_table, replayed_rows, run_tags, wandb_run_id

    project = runs[0].cfg.wandb_project
    found = [(r, load_record(path)) for r in distinct_runs(runs) if (path := find_record(r.cfg)) is not None]
    live = {run_record_path(r.cfg) for r in trained}
    counts = Counter()
    replay = []
    for r, rec in found:
        run_id = wandb_run_id(r.cfg, rec.get("code_version"))
        state = ("skipped" if run_id in in_wandb else "logged" if run_record_path(r.cfg) in live else "replayed")
        counts[state] += 1
        if state == "replayed":
            replay.append((r, rec, run_id))
    for _, rec, _ in replay:  # every record checked before the first is logged
        replayed_rows(rec)
    for r, rec, run_id in tqdm(replay, desc="W&B: records", unit="run", disable=not replay):
        log_record(rec, wandb_identity(r, spec, rec.get("overrides")), run_tags(r.cfg), project, args.wandb_dir, run_id)
    missing = len(distinct_runs(runs)) - len(found)
    print(f"W&B: {counts['logged']} train runs logged, {counts['replayed']} replayed from their records, "
          f"{counts['skipped']} skipped (already in W&B under their ids)"
          + (f", {missing} without a record" if missing else ""))
    figures = {k: v for k, v in paths.items() if k not in ("md", "csv", "json")}
    table = json.loads(Path(paths["json"]).read_text())
    print(f"W&B table run: {log_table(table, paths['csv'], figures, project, args.wandb_dir)}")


# flags that run something, so --render-only (which runs nothing) contradicts them: flag -> its value when not given
RUN_ONLY_FLAGS = {"--force": False, "--jobs": 1, "--job-memory": JOB_MEMORY_GIB, "--shard": None, "--devices": None, "--tensorboard": False}


def check_flag_combinations(args) -> None:
    """One error for flags that contradict --render-only (it runs nothing, so nothing to force, spread
    over jobs or shards, place on devices or log to TensorBoard)."""
    if not args.render_only:
        return
    given = [flag for flag, unset in RUN_ONLY_FLAGS.items() if getattr(args, flag[2:].replace("-", "_")) != unset]
    if given:
        raise FedbenchError(f"--render-only runs nothing, so {' and '.join(given)} contradict{'s' if len(given) == 1 else ''} "
                            "it: render with --render-only alone (plus --output-dir, --tables-dir, --wandb, --set, "
                            "--seeds, --rows, --folds), or drop --render-only to run the table.")


def check_render_plan(runs: list[PlannedRun]) -> None:
    """--render-only: every run's experiment and record names are plain names (bench/core/paths.py; a run
    checks them in validate_config) and rows sharing a record are the same run."""
    from bench.assembly.validation import check_output_names

    for r in runs:
        check_output_names(r.cfg)
    check_shared_records(runs)


def parse_jobs(text: str | None) -> int | str:
    """``--jobs K`` -> K >= 1, ``--jobs auto`` -> "auto" (resolved in check_plan, where the GPUs are known); 1
    without the option."""
    if text is None:
        return 1
    if str(text).strip() == "auto":
        return "auto"
    try:
        jobs = int(str(text).strip())
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise FedbenchError(f"--jobs takes a whole number >= 1 (runs at once) or auto, got {text!r}.")
    return jobs


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``--shard I/N`` -> (I, N) with 1 <= I <= N; None without the option."""
    if text is None:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise FedbenchError(f"--shard must be I/N with whole numbers (e.g. --shard 1/4), got {text!r}.") from None
    if not 1 <= i <= n:
        raise FedbenchError(f"--shard {text}: I must be between 1 and N (shards are numbered 1..{max(n, 1)}).")
    return i, n


def shard_runs(runs: list[PlannedRun], shard: tuple[int, int] | None) -> list[PlannedRun]:
    """Shard I of N of the table's distinct runs: every N-th run in plan order (rows x columns x seeds),
    starting at the I-th, so each shard gets a mix of rows and seeds. The shards of one table are
    disjoint and together are every run, whatever the number of machines."""
    if shard is None:
        return runs
    i, n = shard
    return [r for k, r in enumerate(runs) if k % n == i - 1]


def run_label(r: PlannedRun) -> str:
    """Which run of a row an error is about: "(beta 0.5, seed 0)", or the column when it has no beta."""
    column = f"beta {r.beta:g}" if r.beta is not None else f"column {r.columns[0]}"
    repeat = f"seed {r.seed}" if r.fold is None else f"fold {r.fold}/{r.cfg.data.folds}, seed {r.cfg.seed}"
    return f"({column}, {repeat})"


def check_plan(runs: list[PlannedRun], spec: TableSpec, args, overrides: TableOverrides | None = None) -> None:
    """Every planned run's options (bench/assembly/validation.py; with the command-line overrides applied),
    rows sharing a record, and the output folders, before any run starts. An invalid value given with
    --set is named as such: it is the same error in every row."""
    with stack_import():  # the table's first import of torch: the collector off meanwhile (bench/core/import_gc.py)
        from bench.assembly.validation import check_writable, validate_config
        from bench.assembly.workers import cpu_cores, rank_threads, visible_gpus
        from bench.scheduling.table_jobs import auto_jobs, check_jobs, table_devices
        from lightning_modules.base import METHODS

    job_memory = getattr(args, "job_memory", JOB_MEMORY_GIB)
    args.jobs = parse_jobs(args.jobs)  # as main reads it (a parser's args given directly: None, "2", "auto")
    # read once, and only where a worker count needs them (--jobs auto, or more than one job)
    gpus = visible_gpus(runs[0].cfg.accelerator) if runs and (args.jobs == "auto" or args.jobs > 1) else []
    if args.jobs == "auto":
        args.jobs, why = auto_jobs(cpu_cores(), gpus, job_memory, len(distinct_runs(runs)))
        print(f"--jobs auto: {args.jobs} ({why})", flush=True)
    check_jobs(args.jobs, job_memory, gpus if args.jobs > 1 else [])
    devices, threads = table_devices(runs, args.devices, spec.devices, args.jobs)
    for r in runs:
        r.cfg.devices = devices
        r.cfg.tensorboard = r.cfg.tensorboard or bool(getattr(args, "tensorboard", False))
        try:
            validate_config(r.cfg)
        except FedbenchError as err:
            given = overrides.blamed(str(err)) if overrides is not None else None
            if given is not None:
                raise FedbenchError(f"Table {spec.name}: --set {given}: {err}") from err
            raise FedbenchError(f"Table {r.cfg.experiment}, row {r.label!r} {run_label(r)}: {err}") from err
        # several clients on a CPU: 1 thread per rank (bench/assembly/workers.py rank_threads); a one-client run keeps
        # the layout's threads, or under --jobs the worker's share of the cores (unset: not in its identity)
        r.cfg.threads = rank_threads(r.cfg, METHODS.get(r.cfg.method.name).runs_centrally) or (
            threads if args.jobs == 1 else None)
    check_shared_records(runs)
    for folder, option in {(r.cfg.output_dir, "--output-dir") for r in runs} | {(args.tables_dir, "--tables-dir")}:
        check_writable(folder, option)


def check_data(todo: list[PlannedRun]) -> None:
    """Load every distinct dataset the runs need (missing, corrupt or single-class data fails now)."""
    from bench.assembly.run_data import setup_datamodule

    seen = set()
    for r in todo:
        key = json.dumps(r.cfg.to_dict()["data"], sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            setup_datamodule(r.cfg)


def wandb_identity(r: PlannedRun, spec: TableSpec, annotations: dict | None) -> dict:
    """The W&B identity of a planned run: its table, row label, round rule, and whether --set changed it."""
    from bench.tables.protocols import row_protocol
    from bench.tracking.wandb_logger import run_identity

    rule = row_protocol(r.cfg, r.row, spec, f"row {r.label!r}").round
    return run_identity(r.cfg, table=spec.table, row=r.label, round_rule=rule, overridden=bool(annotations))


def execute(runs: list[PlannedRun], spec: TableSpec, args, annotations: dict | None = None
            ) -> tuple[int, list[PlannedRun]]:
    """Run the runs without a matching record; returns this process's global rank and the runs it ran.
    ``annotations`` (the command-line overrides) are stored in every record and W&B run."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    from bench.assembly.experiment import launch, make_fabric, run_experiment, wait_for_launched_ranks
    from bench.tracking.wandb_logger import wandb_observer

    reasons = Counter()
    todo = []
    runs = shard_runs(distinct_runs(runs), getattr(args, "shard", None))
    if getattr(args, "shard", None) is not None and rank_zero_only.rank == 0:
        print(f"{spec.heading}: shard {args.shard[0]}/{args.shard[1]}")
    for r in runs:
        reason = "--force" if args.force else record_status(r.cfg)[1]
        if reason != "up to date":
            todo.append(r)
            reasons[reason] += 1
    why = "; ".join(f"{n} {reason}" for reason, n in reasons.items())
    if rank_zero_only.rank == 0:  # the plan once, not once more from each rank Fabric starts
        print(f"{spec.heading}: {len(runs)} runs, {len(runs) - len(todo)} up to date, "
              f"{len(todo)} to run" + (f" ({why})" if why else ""))
    if not todo:
        return 0, todo
    check_data(todo)  # fail at once (missing or bad data) before any run starts
    for r in todo:  # devices were set by check_plan
        # one process: the run's round bar nests under the table's bar (rank 0); --jobs workers stay quiet
        r.cfg.progress = r.cfg.progress and args.jobs <= 1
        r.cfg.wandb = r.cfg.wandb or args.wandb
    if args.jobs > 1:
        from bench.scheduling.table_jobs import run_jobs

        run_jobs(todo, args.jobs, args.wandb_dir, f"{spec.heading} ({args.jobs} jobs)",
                 lambda r: f"row {r.label!r} {run_label(r)}", annotations, lambda r: wandb_identity(r, spec, annotations),
                 job_memory=args.job_memory)
        return 0, todo
    fabric = launch(make_fabric(todo[0].cfg))
    bar = tqdm(todo, desc=spec.heading, unit="run", disable=fabric.global_rank != 0)
    for r in bar:
        bar.set_postfix_str(f"{r.label} {r.columns[0]} seed={r.seed}")
        run_experiment(r.cfg, fabric, observer=wandb_observer(r.cfg, args.wandb_dir, annotations,
                                                              wandb_identity(r, spec, annotations)),
                       annotations=annotations)
    wait_for_launched_ranks(fabric)
    return fabric.global_rank, todo
