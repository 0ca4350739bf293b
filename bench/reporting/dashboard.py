"""`fedbench dashboard --config configs/tables/<table>.yaml`: a W&B workspace and report for a table's runs,
built with the ``wandb-workspaces`` package from the table config alone (no record, no network).

The runs are the table's W&B runs (``--wandb``, live or ``--render-only`` after the fact): their group is
the table's experiment, their config holds ``row`` and ``beta`` (bench/reporting/wandb_logger.py), and
every per-round chart has ``round`` as its x-axis. Both views hold:

  per metric   a section: test/<metric> over rounds, mean ± std over seeds grouped by row (the report: one
               panel per β), and a bar chart of each row's summary (the value at the table's round rule)
  training     train/loss, lr and clients trained over rounds, by row
  communication  bytes up and down per round, by row
  time         round, train and eval seconds per round, by row
  results      the logged results table (the table's CSV, paired Δ vs the baseline included)

The workspace groups its runs table by config.beta, then config.row; the report has one run set per β,
grouped by config.row. Offline (no API key) the two specs are written as JSON to ``--out`` with how to
publish them; with a key both are saved and their URLs printed.
"""
from __future__ import annotations

import json
import netrc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.core.errors import FedbenchError
from bench.core.paths import plain_name
from bench.reporting.flags import CommandParser

TRAINING = ["train/loss", "lr", "clients_trained"]
COMMUNICATION = ["comm/bytes_up", "comm/bytes_down"]
TIME = ["time/round_seconds", "time/train_seconds", "time/eval_seconds"]
GROUP_KEYS = ("beta", "row")  # config keys the workspace's runs table groups by, outermost first
RESULTS_SECTION = "results"
NO_ENTITY = "YOUR-ENTITY"  # offline without --entity / $WANDB_ENTITY: replace before publishing


@dataclass
class TableView:
    """What the dashboard shows of a table config: its name (<table>_<dataset>), the W&B project and
    groups (experiments) of its runs, the logged metric keys, its rows and β values in table order."""

    name: str
    project: str
    groups: list[str]
    metrics: list[str]
    rows: list[str]
    betas: list[float]


def table_view(config: str) -> TableView:
    from bench.reporting.table_runner import load_table_config, plan_runs

    spec = load_table_config(config)
    runs = plan_runs(spec, None, check_records=False)
    if not runs:
        raise FedbenchError(f"{config}: the table plans no run, so there is nothing to show.")
    return TableView(name=f"{spec['table']}_{spec['dataset']}", project=runs[0].cfg.wandb_project,
                     groups=list(dict.fromkeys(r.cfg.experiment for r in runs)),
                     metrics=[f"test/{m}" for m in spec.get("metrics") or ["accuracy"]],
                     rows=list(dict.fromkeys(r.label for r in runs)),
                     betas=list(dict.fromkeys(r.beta for r in runs if r.beta is not None)))


def line(key: str, title: str | None = None, by_row: bool = True):
    """``key`` over rounds, a line per group with the mean over its runs (seeds) and a ± std band; the
    groups are config.row (``by_row``), else the runs table's (the workspace's: β, then row)."""
    import wandb_workspaces.reports.v2 as wr

    return wr.LinePlot(title=title or key, x="round", y=[key], title_x="round", title_y=key,
                       groupby=wr.Config("row") if by_row else None, groupby_aggfunc="mean", groupby_rangefunc="stddev")


def summary_bars(key: str, title: str | None = None):
    """Each row's summary of ``key`` (the value at the table's round rule): mean ± std over seeds."""
    import wandb_workspaces.reports.v2 as wr

    return wr.BarPlot(title=title or f"{key} at the round rule", metrics=[key], orientation="v",
                      groupby=wr.Config("row"), groupby_aggfunc="mean", groupby_rangefunc="stddev")


def results_panel():
    import wandb_workspaces.reports.v2 as wr

    from bench.reporting.wandb_logger import RESULTS_KEY

    return wr.WeavePanelSummaryTable(table_name=RESULTS_KEY)


def workspace(view: TableView, entity: str):
    """The workspace: a section per metric, training, communication, time and results; its runs table
    holds the table's runs grouped by config.beta then config.row, and panels follow that grouping."""
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces import expr

    def section(name: str, panels: list) -> Any:
        return ws.Section(name=name, panels=panels, is_open=True, panel_settings=ws.SectionPanelSettings(x_axis="round"))

    sections = [section(m, [line(m, by_row=False), summary_bars(m)]) for m in view.metrics]
    sections += [section("training", [line(k, by_row=False) for k in TRAINING]),
                 section("communication", [line(k, by_row=False) for k in COMMUNICATION]),
                 section("time", [line(k, by_row=False) for k in TIME]),
                 section(RESULTS_SECTION, [results_panel()])]
    runset = ws.RunsetSettings(filters=[expr.Metric("Group").isin(view.groups)],
                               groupby=[expr.Config(k) for k in GROUP_KEYS],
                               pinned_columns=["config:row.value", "config:beta.value", "config:seed.value",
                                               *(f"summary:{m}" for m in view.metrics)])
    return ws.Workspace(entity=entity, project=view.project, name=f"fedbench {view.name}", sections=sections,
                        settings=ws.WorkspaceSettings(x_axis="round", max_runs=100), runset_settings=runset)


def runset(view: TableView, entity: str, name: str, beta: float | None = None, job_type: str = "train"):
    """The table's runs of ``job_type`` (of one β when given), grouped by config.row. ``entity`` "" (the
    offline spec): the run set names no project, whose id only W&B can look up (the report names it)."""
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces import expr

    filters = [expr.Metric("Group").isin(view.groups), expr.Metric("JobType") == job_type]
    if beta is not None:
        filters.append(expr.Config("beta") == beta)
    return wr.Runset(entity=entity, project=view.project if entity else "", name=name, filters=filters,
                     groupby=["config.row"] if job_type == "train" else [])


def report(view: TableView, entity: str, online: bool = True):
    """The report: per metric, one panel grid per β (its curves by row, and the summary bars), then the
    training, communication and time curves by row, then the results table. Offline (``online`` false)
    its run sets name no entity and project (see ``runset``)."""
    import wandb_workspaces.reports.v2 as wr

    sets_entity = entity if online else ""

    blocks: list = [wr.P(f"fedbench table {view.name}: runs grouped by config.row (mean ± std over seeds); "
                         "bars are each row's value at the table's round rule.")]
    betas: list[float | None] = list(view.betas) or [None]
    for m in view.metrics:
        blocks.append(wr.H1(m))
        for b in betas:
            where = "" if b is None else f" · β={b:g}"
            blocks.append(wr.PanelGrid(runsets=[runset(view, sets_entity, f"{view.name}{where}", b)],
                                       panels=[line(m, f"{m}{where}"), summary_bars(m, f"{m}{where} at the round rule")]))
    for title, keys in (("training", TRAINING), ("communication", COMMUNICATION), ("time", TIME)):
        blocks += [wr.H1(title), wr.PanelGrid(runsets=[runset(view, sets_entity, view.name)], panels=[line(k) for k in keys])]
    blocks += [wr.H1(RESULTS_SECTION), wr.PanelGrid(runsets=[runset(view, sets_entity, "table", job_type="table")],
                                                    panels=[results_panel()])]
    return wr.Report(entity=entity, project=view.project, title=f"fedbench {view.name}", blocks=blocks, width="fluid")


def specs(view: TableView, entity: str) -> dict[str, dict]:
    """The workspace's and the report's specs as W&B stores them (JSON-ready; no network). ``_to_model``
    is the package's private serializer: requirements.lock pins the version, tests/test_dashboard.py
    covers it."""
    return {"workspace": json.loads(workspace(view, entity)._to_model().model_dump_json(by_alias=True)),
            "report": json.loads(report(view, entity, online=False)._to_model().model_dump_json(by_alias=True))}


def has_api_key() -> bool:
    """Whether W&B can be reached with a key: $WANDB_API_KEY or a `wandb login` entry in ~/.netrc (and
    WANDB_MODE not offline or disabled). Checked without any network call."""
    if os.environ.get("WANDB_MODE") in ("offline", "dryrun", "disabled"):
        return False
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        host = (os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").split("//")[-1].split("/")[0]
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


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


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    view = table_view(args.config)
    if args.preview:
        from bench.reporting.dashboard_preview import draw_preview, logged_runs
        from bench.reporting.table_runner import load_table_config, plan_runs

        spec = load_table_config(args.config)
        runs = logged_runs(spec, plan_runs(spec, args.output_dir, check_records=False))
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
          f"(`wandb login` or WANDB_API_KEY), run `fedbench dashboard --config {args.config}"
          f"{'' if entity else ' --entity <your entity>'}`: it saves the workspace and the report and prints "
          "their URLs.")
    return 0
