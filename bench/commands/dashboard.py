"""`fedbench dashboard --config configs/tables/<table>.yaml`: a W&B workspace and report for a table's runs,
built with the ``wandb-workspaces`` package from the table config alone (no record, no network).

The runs are the table's W&B runs (``--wandb``, live or ``--render-only`` after the fact): their group is
the table's experiment, their config holds ``row``, ``beta`` and ``partition_key`` (the column;
bench/tracking/wandb_logger.py), and every per-round chart has ``round`` as its x-axis. Both views hold:

  per metric   a section: test/<metric> over rounds, mean ± std over seeds grouped by row (the report: one
               panel per column), and a bar chart of each row's summary (the value at the table's round rule)
  training     train/loss, lr and clients trained over rounds, by row
  communication  bytes up and down per round, by row
  time         round, train and eval seconds per round, by row
  results      the logged results table (the table's CSV, paired Δ vs the baseline included; the report's)

The workspace holds the table's train runs (job type train; up to all of them), its runs table grouped by
config.partition_key (the column), then config.row, and its panels follow that grouping; the report has one
run set per column, grouped by config.row. With the --set/--seeds/--rows a table was run with, the dashboard
plans the table as `fedbench table` does (table_runner.planned_table): the same group, those rows. Offline
(wandb_logger.wandb_mode: the one rule for W&B runs and the dashboard) the two specs are written as JSON to
``--out`` with how to publish them; online both are saved and their URLs printed.
"""
from __future__ import annotations

import json
import os
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.core.errors import FedbenchError
from bench.core.paths import plain_name
from bench.tables.flags import CommandParser

TRAINING = ["train/loss", "lr", "clients_trained"]
COMMUNICATION = ["comm/bytes_up", "comm/bytes_down"]
TIME = ["time/round_seconds", "time/train_seconds", "time/eval_seconds"]
GROUP_KEYS = ("partition_key", "row")  # config keys the workspace's runs table groups by: column, then row
RESULTS_SECTION = "results"
NO_ENTITY = "YOUR-ENTITY"  # offline without --entity / $WANDB_ENTITY: replace before publishing


@dataclass
class TableView:
    """What the dashboard shows of a table config as `fedbench table` runs it with the same --set, --seeds
    and --rows: its name (<table>_<dataset>, or the reduced table's name), the W&B project and groups
    (experiments) of its runs, the logged metric keys, its rows and β values in table order, the rows and
    seeds chosen on the command line (None: all), and how many train runs it has."""

    name: str
    project: str
    groups: list[str]
    metrics: list[str]
    rows: list[str]
    columns: dict[str, str]  # the runs' config.partition_key (the table's columns) -> its title (β=0.05, iid, ...)
    chosen_rows: list[str] | None = None
    chosen_seeds: list[int] | None = None
    run_count: int = 0


def table_view(config: str, sets: list[str] | None = None, seeds: str | None = None,
               rows: list[str] | None = None) -> TableView:
    """The view of the table's runs, planned as `fedbench table` plans them (table_runner.planned_table)."""
    from bench.scheduling.table_runner import distinct_runs, planned_table
    from bench.tracking.wandb_logger import column_key

    _, spec, overrides, runs = planned_table(config, sets, seeds, rows)
    if not runs:
        raise FedbenchError(f"{config}: the table plans no run, so there is nothing to show.")
    return TableView(name=overrides.table_name(spec.name), project=runs[0].cfg.wandb_project,
                     groups=list(dict.fromkeys(r.cfg.experiment for r in runs)),
                     metrics=[f"test/{m}" for m in spec.metrics],
                     rows=list(dict.fromkeys(r.label for r in runs)),
                     columns={column_key(r.cfg): f"β={r.beta:g}" if r.beta is not None else column_key(r.cfg)
                              for r in runs},
                     chosen_rows=overrides.rows, chosen_seeds=overrides.seeds, run_count=len(distinct_runs(runs)))


def train_filters(view: TableView) -> list:
    """The table's train runs: its groups, job type train, and the rows and seeds chosen on the command line."""
    from wandb_workspaces import expr

    filters = [expr.Metric("Group").isin(view.groups), expr.Metric("JobType") == "train"]
    if view.chosen_rows is not None:
        filters.append(expr.Config("row").isin(view.chosen_rows))
    if view.chosen_seeds is not None:
        filters.append(expr.Config("seed").isin(view.chosen_seeds))
    return filters


def line(key: str, title: str | None = None, by_row: bool = True):
    """``key`` over rounds, a line per group with the mean over its runs (seeds) and a ± std band; the
    groups are config.row (``by_row``), else the runs table's (the workspace's: β, then row)."""
    import wandb_workspaces.reports.v2 as wr

    return wr.LinePlot(title=title or key, x="round", y=[key], title_x="round", title_y=key,
                       groupby=wr.Config("row") if by_row else None, groupby_aggfunc="mean", groupby_rangefunc="stddev")


def summary_bars(key: str, title: str | None = None, by_row: bool = True):
    """Each group's summary of ``key`` (the value at the table's round rule): mean ± std over seeds. The
    groups are config.row (``by_row``: the report, one panel per β), else the runs table's (the workspace's:
    column, then row, so that two columns of a row are two bars, never pooled)."""
    import wandb_workspaces.reports.v2 as wr

    return wr.BarPlot(title=title or f"{key} at the round rule", metrics=[key], orientation="v",
                      groupby=wr.Config("row") if by_row else None, aggregate=True, groupby_aggfunc="mean",
                      groupby_rangefunc="stddev")


def results_panel():
    import wandb_workspaces.reports.v2 as wr

    from bench.tracking.wandb_logger import RESULTS_KEY

    return wr.WeavePanelSummaryTable(table_name=RESULTS_KEY)


def workspace_title(name: str) -> str:
    """The workspace's title: ``fedbench <table name>``, where W&B refuses symbols (a reduced table's ``=`` and
    ``+``: unicode categories S*): ``=`` reads as ``:``, any other symbol as ``-``."""
    def plain(char: str) -> str:
        return char if not unicodedata.category(char).startswith("S") else ":" if char == "=" else "-"

    return "fedbench " + "".join(plain(c) for c in name)


def workspace(view: TableView, entity: str):
    """The workspace: a section per metric, training, communication and time; its runs table holds the
    table's train runs (train_filters; the results table is the report's, from the table run) grouped by
    config.partition_key (the column) then config.row, and panels follow that grouping. It shows up to
    every train run of the table."""
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces import expr

    def section(name: str, panels: list) -> Any:
        return ws.Section(name=name, panels=panels, is_open=True, panel_settings=ws.SectionPanelSettings(x_axis="round"))

    sections = [section(m, [line(m, by_row=False), summary_bars(m, by_row=False)]) for m in view.metrics]
    sections += [section("training", [line(k, by_row=False) for k in TRAINING]),
                 section("communication", [line(k, by_row=False) for k in COMMUNICATION]),
                 section("time", [line(k, by_row=False) for k in TIME])]
    runset = ws.RunsetSettings(filters=train_filters(view), groupby=[expr.Config(k) for k in GROUP_KEYS],
                               pinned_columns=["config:row.value", "config:partition_key.value", "config:seed.value",
                                               *(f"summary:{m}" for m in view.metrics)])
    return ws.Workspace(entity=entity, project=view.project, name=workspace_title(view.name), sections=sections,
                        settings=ws.WorkspaceSettings(x_axis="round", max_runs=max(view.run_count, 1)),
                        runset_settings=runset)


def runset(view: TableView, entity: str, name: str, column: str | None = None, job_type: str = "train"):
    """The table's runs of ``job_type`` (of one column, config.partition_key, when given), grouped by
    config.row. ``entity`` "" (the
    offline spec): the run set names no project, whose id only W&B can look up (the report names it)."""
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces import expr

    filters = train_filters(view) if job_type == "train" else [expr.Metric("Group").isin(view.groups),
                                                               expr.Metric("JobType") == job_type]
    if column is not None:
        filters.append(expr.Config("partition_key") == column)
    return wr.Runset(entity=entity, project=view.project if entity else "", name=name, filters=filters,
                     groupby=["config.row"] if job_type == "train" else [])


def report(view: TableView, entity: str, online: bool = True):
    """The report: per metric, one panel grid per column (its curves by row, and the summary bars), then the
    training, communication and time curves by row, then the results table. Offline (``online`` false)
    its run sets name no entity and project (see ``runset``)."""
    import wandb_workspaces.reports.v2 as wr

    sets_entity = entity if online else ""

    blocks: list = [wr.P(f"fedbench table {view.name}: runs grouped by config.row (mean ± std over seeds); "
                         "bars are each row's value at the table's round rule.")]
    for m in view.metrics:
        blocks.append(wr.H1(m))
        for column, title in view.columns.items():
            where = f" · {title}"
            blocks.append(wr.PanelGrid(runsets=[runset(view, sets_entity, f"{view.name}{where}", column)],
                                       panels=[line(m, f"{m}{where}"), summary_bars(m, f"{m}{where} at the round rule")]))
    for title, keys in (("training", TRAINING), ("communication", COMMUNICATION), ("time", TIME)):
        blocks += [wr.H1(title), wr.PanelGrid(runsets=[runset(view, sets_entity, view.name)], panels=[line(k) for k in keys])]
    blocks += [wr.H1(RESULTS_SECTION), wr.PanelGrid(runsets=[runset(view, sets_entity, "table", job_type="table")],
                                                    panels=[results_panel()])]
    return wr.Report(entity=entity, project=view.project, title=f"fedbench {view.name}", blocks=blocks, width="fluid")


def specs(view: TableView, entity: str) -> dict[str, dict]:
    """The workspace's and the report's specs as W&B stores them (JSON-ready; no network). ``_to_model``
    is the package's private serializer: requirements.lock pins the version, tests/tracking/test_dashboard.py
    covers it."""
    return {"workspace": json.loads(workspace(view, entity)._to_model().model_dump_json(by_alias=True)),
            "report": json.loads(report(view, entity, online=False)._to_model().model_dump_json(by_alias=True))}


def has_api_key() -> bool:
    """Whether the dashboard publishes: the rule every W&B run we log follows (wandb_logger.wandb_mode:
    $WANDB_MODE, else W&B's own key lookup, `wandb login` included) says online. No network call."""
    from bench.tracking.wandb_logger import wandb_mode

    return wandb_mode() == "online"


def build_parser() -> CommandParser:
    parser = CommandParser(prog="fedbench dashboard", description=__doc__)
    parser.add_argument("--config", required=True, help="configs/tables/<table>_<dataset>.yaml")
    parser.add_argument("--out", default="results/dashboards",
                        help="offline: the folder the workspace and report specs are written to, as JSON")
    parser.add_argument("--entity", default=None,
                        help="W&B entity (default $WANDB_ENTITY; with a key, else your default entity)")
    parser.add_argument("--preview", default=None, metavar="PNG",
                        help="also draw the dashboard's panels from the table's run records into this PNG (offline)")
    parser.add_argument("--output-dir", default=None, help="where the run records are, for --preview (default results/runs)")
    # the table's run selection, as `fedbench table` takes it: the dashboard follows that table run's W&B group
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="the --set overrides the table was run with (its runs' group is then <table>_<dataset>__set-<hash>)")
    parser.add_argument("--seeds", default=None, help="the --seeds the table was run with, e.g. 0 or 0,1")
    parser.add_argument("--rows", action="append", default=None, help="the --rows the table was run with, e.g. FedAvg,FedBM")
    return parser


def write_specs(view: TableView, entity: str, out: str) -> list[Path]:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind, spec in specs(view, entity).items():
        path = folder / f"{plain_name(view.name, 'the table name', out)}_{kind}.json"
        path.write_text(json.dumps(spec, indent=1, ensure_ascii=False) + "\n")
        paths.append(path)
    return paths


def publish(view: TableView, entity: str | None) -> list[str]:
    """Save the workspace and the report to W&B; their URLs."""
    if entity is None:
        import wandb

        entity = wandb.Api().default_entity
    saved_ws = workspace(view, entity).save()
    saved_report = report(view, entity).save()
    return [saved_ws.url, saved_report.url]


def selection(args) -> str:
    """``--config X`` and the table run's --set/--seeds/--rows, as the command line to repeat."""
    import shlex

    flags = [("--set", v) for v in args.set] + [("--seeds", args.seeds)] * (args.seeds is not None)
    return shlex.join(["--config", args.config, *(x for f, v in flags + [("--rows", r) for r in args.rows or []]
                                                  for x in (f, v))])


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    view = table_view(args.config, args.set, args.seeds, args.rows)
    if args.preview:
        from bench.commands.dashboard_preview import draw_preview, logged_runs
        from bench.scheduling.table_runner import planned_table

        _, spec, _, planned = planned_table(args.config, args.set, args.seeds, args.rows, output_dir=args.output_dir)
        runs = logged_runs(spec, planned)
        print(f"preview of {len(runs)} runs: {draw_preview(view.name, view.metrics, runs, args.preview)}")
    entity = args.entity or os.environ.get("WANDB_ENTITY")
    if has_api_key():
        for url in publish(view, entity):
            print(url)
        return 0
    paths = write_specs(view, entity or NO_ENTITY, args.out)
    print("written: " + ", ".join(str(p) for p in paths))
    print(f"Offline (no W&B API key): nothing was published. To publish: upload the table's runs "
          f"(`wandb sync {os.environ.get('WANDB_DIR') or 'results/wandb'}/wandb/offline-run-*`), then, with a key "
          f"(`wandb login` or WANDB_API_KEY), run `fedbench dashboard {selection(args)}"
          f"{'' if entity else ' --entity <your entity>'}`: it saves the workspace and the report and prints "
          "their URLs.")
    return 0
