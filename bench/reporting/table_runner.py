"""`fedbench table`: expand a table config into runs (method x beta x seed), run the missing ones,
then render the table from the run records only.

A table config (configs/tables/*.yaml) holds ``base`` (RunConfig overrides shared by every run),
``betas``, ``seeds``, ``metrics`` and ``rows`` (label + overrides; ``partition_independent: true``
for rows such as Central that do not depend on the partition: run once per seed, shown in every
beta column; ``betas: [...]`` for rows whose options differ per beta: the row runs in those
beta columns only, and rows sharing a label fill one table row).
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from bench.code_version import code_version
from bench.config import OPTION_GROUPS, RunConfig, result_config
from bench.core.errors import FedbenchError
from bench.records import load_record, record_path
from bench.reporting.spec import canonical, check_overrides, load_spec, run_config

TABLE_KEYS = {"table", "dataset", "title", "base", "betas", "seeds", "metrics", "rows", "devices", "paper", "notes",
              "wandb"}
# a row's own keys; its other keys override RunConfig's option groups
ROW_OWN_KEYS = {"label", "partition_independent", "paper_method", "betas", "paper_table", "paper_setting"}


@dataclass
class PlannedRun:
    label: str
    beta: float
    seed: int
    cfg: RunConfig
    columns: list[float]  # beta columns this run fills


def load_table_config(path: str) -> dict[str, Any]:
    tables = Path("configs/tables")
    avail = sorted(x.name for x in tables.glob("*.yaml")) if tables.exists() else []
    spec = load_spec(path, "Table config", TABLE_KEYS, f" Available: {', '.join(avail) or 'none'}.")
    for row in spec.get("rows", []):
        check_overrides(row, f"{path}: row {row.get('label')!r}", ROW_OWN_KEYS | set(OPTION_GROUPS))
    return spec


def plan_runs(spec: dict[str, Any], output_dir: str | None = None) -> list[PlannedRun]:
    experiment = f"{spec['table']}_{spec['dataset']}"
    runs = []
    for row in spec["rows"]:
        overrides = {k: v for k, v in row.items() if k in OPTION_GROUPS}
        betas = row.get("betas", spec["betas"])
        if not set(betas) <= set(spec["betas"]):
            raise FedbenchError(f"Table {experiment}, row {row['label']!r}: betas {betas} not all in the table's {spec['betas']}.")
        betas = spec["betas"][:1] if row.get("partition_independent") else betas
        for beta in betas:
            for seed in spec["seeds"]:
                run = {"partition": {"beta": beta}, "seed": seed, "experiment": experiment}
                if output_dir:
                    run["output_dir"] = output_dir
                cfg = run_config(spec.get("base") or {}, overrides, run,
                                 where=f"Table {experiment}, row {row['label']!r}")
                cols = spec["betas"] if row.get("partition_independent") else [beta]
                runs.append(PlannedRun(row["label"], beta, seed, cfg, cols))
    for label in dict.fromkeys(r.label for r in runs):
        missing = set(spec["betas"]) - {b for r in runs if r.label == label for b in r.columns}
        if missing:
            raise FedbenchError(f"Table {experiment}: row {label!r} has no run for beta(s) {sorted(missing)}; "
                                "rows restricted with 'betas' need a row with the same label for the other betas.")
    return runs


def record_status(cfg: RunConfig) -> tuple[dict | None, str]:
    """(the record to reuse, or None; why): a record is reused when its result-config and code
    version (bench/code_version.py) match the current ones."""
    path = record_path(cfg.output_dir, cfg.experiment, cfg.run_name())
    if not path.exists():
        return None, "no record"
    rec = load_record(path)
    same = canonical(result_config(rec.get("config", {}))) == canonical(result_config(cfg.to_dict()))
    if not same:
        return None, "config changed"
    if rec.get("code_version") != code_version():
        return None, f"code changed ({rec.get('code_version') or 'unversioned'} -> {code_version()})"
    return rec, "up to date"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fedbench table", description=__doc__)
    parser.add_argument("--config", required=True, help="configs/tables/<table>_<dataset>.yaml")
    parser.add_argument("--force", action="store_true", help="rerun even when a record with the same config exists")
    parser.add_argument("--render-only", action="store_true", help="only render the table from existing records")
    parser.add_argument("--devices", type=int, default=None, help="Fabric ranks (default: the config's, else 1)")
    parser.add_argument("--output-dir", default=None, help="where run records go (default results/runs)")
    parser.add_argument("--tables-dir", default="results/tables")
    parser.add_argument("--wandb", action="store_true",
                        help="log the runs and the rendered table to W&B (also: 'wandb: true' in the table config)")
    parser.add_argument("--wandb-dir", default=None, help="W&B files (default $WANDB_DIR, else results/wandb)")
    args = parser.parse_args(argv)

    from bench.reporting.tables import render_table

    spec = load_table_config(args.config)
    args.wandb = args.wandb or bool(spec.get("wandb"))
    runs = plan_runs(spec, args.output_dir)
    if not args.render_only and execute(runs, spec, args) != 0:
        return 0  # other ranks: rank 0 renders
    paths = render_table(spec, runs, args.tables_dir)
    print(Path(paths["md"]).read_text())
    print("written: " + ", ".join(str(p) for p in paths.values()))
    if args.wandb:
        from bench.reporting.wandb_logger import log_table

        figures = {k: v for k, v in paths.items() if k not in ("md", "csv", "json")}
        table = json.loads(Path(paths["json"]).read_text())
        print(f"W&B table run: {log_table(table, figures, runs[0].cfg.wandb_project, args.wandb_dir)}")
    return 0


def execute(runs: list[PlannedRun], spec: dict, args) -> int:
    """Run the runs without a matching record; returns this process's global rank."""
    from bench.experiment import build_datamodule, make_fabric, run_experiment
    from bench.reporting.wandb_logger import wandb_observer

    reasons = Counter()
    todo = []
    for r in runs:
        reason = "--force" if args.force else record_status(r.cfg)[1]
        if reason != "up to date":
            todo.append(r)
            reasons[reason] += 1
    why = "; ".join(f"{n} {reason}" for reason, n in reasons.items())
    print(f"{spec['table']} {spec['dataset']}: {len(runs)} runs, {len(runs) - len(todo)} up to date, "
          f"{len(todo)} to run" + (f" ({why})" if why else ""))
    if not todo:
        return 0
    build_datamodule(todo[0].cfg).setup()  # fail at once (missing data) before any run starts
    devices = args.devices or spec.get("devices", 1)
    for r in todo:
        r.cfg.devices = devices
        r.cfg.progress = False
        r.cfg.wandb = r.cfg.wandb or args.wandb
    fabric = make_fabric(todo[0].cfg)
    fabric.launch()
    bar = tqdm(todo, desc=f"{spec['table']} {spec['dataset']}", unit="run", disable=fabric.global_rank != 0)
    for r in bar:
        bar.set_postfix_str(f"{r.label} beta={r.beta:g} seed={r.seed}")
        run_experiment(r.cfg, fabric, observer=wandb_observer(r.cfg, args.wandb_dir))
    return fabric.global_rank
