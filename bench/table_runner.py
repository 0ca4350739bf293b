"""`fedbench table`: expand a table config into runs (method x beta x seed), run the missing ones,
then render the table from the run records only.

A table config (configs/tables/*.yaml) holds ``base`` (RunConfig overrides shared by every run),
``betas``, ``seeds``, ``metrics`` and ``rows`` (label + overrides; ``partition_independent: true``
for rows such as Central that do not depend on the partition: run once per seed, shown in every
beta column; ``betas: [...]`` for rows whose options differ per beta: the row runs in those
beta columns only, and rows sharing a label fill one table row).

Command-line changes without editing the YAML (bench/table_overrides.py): ``--set KEY=VALUE`` on
every run, ``--seeds`` / ``--rows`` subsets; ``--data-home`` (or $FEDBENCH_DATA) is the folder the
datasets are found in by their archive names (datamodules/data_home.py).
"""
from __future__ import annotations

import argparse
import copy
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from tqdm.auto import tqdm

from bench.code_version import code_version
from bench.config import RunConfig, from_dict, result_config
from bench.records import load_record, record_path
from bench.table_overrides import TableOverrides
from datamodules.data_home import DATA_HOME_ENV, set_data_home
from datamodules.errors import FedbenchError

TABLE_KEYS = {"table", "dataset", "title", "base", "betas", "seeds", "metrics", "rows", "devices", "paper", "notes",
              "wandb"}
ROW_KEYS = {"label", "partition_independent", "data", "partition", "fed", "method", "paper_method", "betas",
            "paper_table", "paper_setting"}


@dataclass
class PlannedRun:
    label: str
    beta: float
    seed: int
    cfg: RunConfig
    columns: list[float]  # beta columns this run fills


def deep_merge(a: dict, b: dict) -> dict:
    out = copy.deepcopy(a)
    for k, v in b.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "args" else copy.deepcopy(v)
    return out


def load_table_config(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        avail = sorted(x.name for x in Path("configs/tables").glob("*.yaml")) if Path("configs/tables").exists() else []
        raise FedbenchError(f"Table config {path!r} not found. Available: {', '.join(avail) or 'none'}.")
    spec = yaml.safe_load(p.read_text()) or {}
    unknown = set(spec) - TABLE_KEYS
    if unknown:
        raise FedbenchError(f"{path}: unknown key(s) {sorted(unknown)}; allowed: {sorted(TABLE_KEYS)}.")
    for row in spec.get("rows", []):
        bad = set(row) - ROW_KEYS
        if bad:
            raise FedbenchError(f"{path}: row {row.get('label')!r} has unknown key(s) {sorted(bad)}; allowed: {sorted(ROW_KEYS)}.")
    return spec


def plan_runs(spec: dict[str, Any], output_dir: str | None = None) -> list[PlannedRun]:
    base = RunConfig().to_dict()
    base = deep_merge(base, spec.get("base", {}))
    experiment = f"{spec['table']}_{spec['dataset']}"
    runs = []
    for row in spec["rows"]:
        overrides = {k: v for k, v in row.items() if k in ("data", "partition", "fed", "method")}
        betas = row.get("betas", spec["betas"])
        if not set(betas) <= set(spec["betas"]):
            raise FedbenchError(f"Table {experiment}, row {row['label']!r}: betas {betas} not all in the table's {spec['betas']}.")
        betas = spec["betas"][:1] if row.get("partition_independent") else betas
        for beta in betas:
            for seed in spec["seeds"]:
                d = deep_merge(base, overrides)
                d["partition"]["beta"] = beta
                d["seed"] = seed
                d["experiment"] = experiment
                if output_dir:
                    d["output_dir"] = output_dir
                try:
                    cfg = from_dict(d)
                except TypeError as err:
                    raise FedbenchError(f"Table {experiment}, row {row['label']!r}: {err}") from err
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
    same = json.loads(json.dumps(result_config(rec.get("config", {})))) == json.loads(json.dumps(result_config(cfg.to_dict())))
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
    parser.add_argument("--data-home", default=None,
                        help=f"folder holding the datasets under their archive names (default ${DATA_HOME_ENV}, else ./data)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a run option in every run, e.g. --set fed.rounds=2 --set data.image_size=64 "
                             "(repeatable; the table is then labelled and filed as a reduced run)")
    parser.add_argument("--seeds", default=None, help="run only these of the config's seeds, e.g. --seeds 0 or 0,1")
    parser.add_argument("--rows", action="append", default=None,
                        help="run only these rows, by label: --rows FedAvg,FedBM (repeat --rows for labels with commas)")
    args = parser.parse_args(argv)

    from bench.tables import render_table

    if args.data_home:
        set_data_home(args.data_home)
    full_spec = load_table_config(args.config)
    args.wandb = args.wandb or bool(full_spec.get("wandb"))
    overrides = TableOverrides.parse(full_spec, args.set, args.seeds, args.rows)
    spec = overrides.select(full_spec)
    runs = plan_runs(spec, args.output_dir)
    overrides.apply(runs)
    if not args.render_only and execute(runs, spec, args, overrides.record()) != 0:
        return 0  # other ranks: rank 0 renders
    paths = render_table(spec, runs, args.tables_dir, name=overrides.table_name(f"{spec['table']}_{spec['dataset']}"),
                         changes=overrides.describe(full_spec), reduced=not overrides.full_budget)
    print(Path(paths["md"]).read_text())
    print("written: " + ", ".join(str(p) for p in paths.values()))
    if args.wandb:
        from bench.wandb_logger import log_table

        figures = {k: v for k, v in paths.items() if k not in ("md", "csv", "json")}
        table = json.loads(Path(paths["json"]).read_text())
        print(f"W&B table run: {log_table(table, figures, runs[0].cfg.wandb_project, args.wandb_dir)}")
    return 0


def execute(runs: list[PlannedRun], spec: dict, args, annotations: dict | None = None) -> int:
    """Run the runs without a matching record; returns this process's global rank. ``annotations``
    (the command-line overrides) are stored in every record."""
    from bench.experiment import build_datamodule, make_fabric, run_experiment, validate

    reasons = Counter()
    todo, seen, same = [], set(), 0
    for r in runs:
        reason = "--force" if args.force else record_status(r.cfg)[1]
        key = json.dumps(r.cfg.to_dict(), sort_keys=True)
        if reason == "up to date":
            continue
        if key in seen:  # rows made identical (e.g. by --set) share one run and its record
            same += 1
            continue
        seen.add(key)
        todo.append(r)
        reasons[reason] += 1
    why = "; ".join(f"{n} {reason}" for reason, n in reasons.items())
    shared = f", {same} identical to another run" if same else ""
    print(f"{spec['table']} {spec['dataset']}: {len(runs)} runs, {len(runs) - len(todo) - same} up to date{shared}, "
          f"{len(todo)} to run" + (f" ({why})" if why else ""))
    if not todo:
        return 0
    for r in todo:  # fail at once (bad option, missing data) before any run starts
        validate(r.cfg)
    for cfg in {json.dumps(r.cfg.to_dict()["data"], sort_keys=True): r.cfg for r in todo}.values():
        build_datamodule(cfg).setup()
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
        run_experiment(r.cfg, fabric, wandb_dir=args.wandb_dir, annotations=annotations)
    return fabric.global_rank
