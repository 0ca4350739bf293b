"""A table config (configs/tables/*.yaml) parsed and checked once into a TableSpec.

``load_table_config`` reads the YAML, checks every key and value, and returns the frozen TableSpec that
planning (table_runner.py), rendering (tables.py, plots.py), paper matching (paper_compare.py), coverage,
W&B and the dashboard all read: nothing after it reads the YAML mapping, and each default (the metrics,
the baseline, the title) is decided here once. The command line's --seeds / --rows / --folds make a
narrower copy (``dataclasses.replace``, table_overrides.TableOverrides.select).

The keys are documented in bench/scheduling/table_runner.py's module docstring.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.core.errors import FedbenchError
from bench.core.paths import plain_name, shipped
from bench.tables.flags import config_kind
from bench.tables.spec import RUN_KEYS, check_keys, check_overrides, load_spec, plain_copy
from bench.tables.table_row import TableRow

TABLE_KEYS = {"table", "dataset", "title", "base", "betas", "columns", "seeds", "metrics", "rows", "devices", "paper",
              "notes", "wandb", "round_rule", "paper_dataset", "uncovered", "baseline", "stand_in",
              "cannot_show", "folds"}
UNCOVERED_KEYS = {"paper", "table", "dataset", "partition", "method", "metric", "setting", "reason"}
DEFAULT_METRICS = ("accuracy", "f1")
TEXT_KEYS = ("title", "notes", "round_rule", "paper_dataset", "stand_in", "cannot_show")


@dataclass(frozen=True)
class TableSpec:
    """A table config as every command reads it: typed, with every default filled in (its rows are TableRows:
    bench/tables/table_row.py)."""

    table: str
    dataset: str
    seeds: tuple[int, ...]
    rows: tuple[TableRow, ...]
    base: dict[str, Any]  # RunConfig overrides of every run
    columns: tuple[Any, ...] | None = None  # partition settings (columns.py), or
    betas: tuple[float, ...] | None = None  # sugar for Dirichlet columns
    metrics: tuple[str, ...] = DEFAULT_METRICS
    title: str | None = None
    folds: int | None = None  # K-fold cross-validation: the runs repeat over data.fold 0..K-1 with the one seed
    run_folds: tuple[int, ...] | None = None  # --folds: these of the K only
    round_rule: str | None = None
    baseline: str | None = None  # the row every other row is paired with ...
    baseline_given: bool = False  # ... as the config names it (null: none); else FedAvg (tables.baseline_label)
    papers: tuple[str, ...] = ()  # the papers' numbers it is compared with (results/paper/<paper>.yaml)
    paper_dataset: str | None = None
    stand_in: str | None = None  # why it stands in for a paper's data: never compared with a paper's number
    cannot_show: str | None = None
    notes: str | None = None
    uncovered: tuple[dict[str, Any], ...] = ()
    devices: int | str | None = None
    wandb: bool = False

    @property
    def name(self) -> str:
        """``<table>_<dataset>``: the table's files and its runs' record folder."""
        return f"{self.table}_{self.dataset}"

    @property
    def heading(self) -> str:
        """``<table> <dataset>``: how progress lines name the table."""
        return f"{self.table} {self.dataset}"

    @property
    def shown_title(self) -> str:
        return self.title or self.name

    @property
    def labels(self) -> list[str]:
        """The row labels, in order, once each (rows restricted to some columns share a label)."""
        return list(dict.fromkeys(r.label for r in self.rows))

    @property
    def base_partition(self) -> dict[str, Any]:
        return self.base.get("partition") or {}

    @classmethod
    def parse(cls, raw: dict[str, Any], where: str) -> TableSpec:
        """The TableSpec of a table config mapping (``where``: its path, for the errors); every key and value
        checked, one FedbenchError naming the first that is wrong."""
        if not isinstance(raw, dict):
            raise FedbenchError(f"{where}: a table config is a mapping of keys ({sorted(TABLE_KEYS)}).")
        check_keys(raw, TABLE_KEYS, where)
        for key in ("table", "dataset"):  # <table>_<dataset> names the table's files and its runs' record folder
            plain_name(raw.get(key), f"{where}: {key}", "the tables and records folders")
        base = raw.get("base") or {}
        check_overrides(base, f"{where}: base")
        folds = raw.get("folds")
        return cls(
            table=raw["table"], dataset=raw["dataset"], seeds=parse_seeds(raw.get("seeds"), folds, where),
            rows=parse_rows(raw.get("rows"), where), base=plain_copy(base),
            columns=_tuple_or_none(raw.get("columns"), "columns", where),
            betas=_tuple_or_none(raw.get("betas"), "betas", where),
            metrics=parse_metrics(raw.get("metrics"), where), folds=folds,
            baseline=raw.get("baseline"), baseline_given="baseline" in raw, papers=parse_papers(raw.get("paper"), where),
            uncovered=parse_uncovered(raw.get("uncovered"), where),
            devices=raw.get("devices"), wandb=bool(raw.get("wandb")),
            **{key: _text(raw.get(key), key, where) for key in TEXT_KEYS})


def load_table_config(path: str) -> TableSpec:
    """The table config at ``path`` (a relative path not in the working directory: the checkout's or the installed
    one), parsed once; a run or regression config given instead is named as such."""
    tables = shipped("configs/tables")
    avail = sorted(x.name for x in tables.glob("*.yaml")) if tables.exists() else []
    kind, keys = config_kind(path)
    if kind == "regression" or kind == "run" and keys <= RUN_KEYS:
        command = "run --config" if kind == "run" else "regression --config"
        raise FedbenchError(f"{path} is a {kind} config, not a table's: use `fedbench {command} {path}`.")
    return TableSpec.parse(load_spec(path, "Table config", TABLE_KEYS, f" Available: {', '.join(avail) or 'none'}."),
                           path)


def parse_seeds(seeds: Any, folds: Any, where: str) -> tuple[int, ...]:
    if (not isinstance(seeds, list) or not seeds or len(set(map(str, seeds))) != len(seeds)
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
        raise FedbenchError(f"{where}: seeds must list at least one seed, whole numbers >= 0 without repeats "
                            f"(e.g. seeds: [0, 1, 2]), got {seeds!r}.")
    if folds is None:
        return tuple(seeds)
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise FedbenchError(f"{where}: folds must be a whole number >= 2 (K-fold cross-validation), got {folds!r}.")
    if len(seeds) != 1:
        raise FedbenchError(f"{where}: with folds: {folds} the runs repeat over the folds; seeds must name the one "
                            f"seed every fold trains with, got {seeds}.")
    return tuple(seeds)


def parse_rows(rows: Any, where: str) -> tuple[TableRow, ...]:
    if not isinstance(rows, list) or not rows:
        raise FedbenchError(f"{where}: rows must list the table's rows ({{label: ..., method: {{name: ...}}}}), "
                            f"got {rows!r}.")
    return tuple(TableRow.parse(row, where) for row in rows)


def parse_metrics(metrics: Any, where: str) -> tuple[str, ...]:
    if metrics is None:
        return DEFAULT_METRICS
    if not isinstance(metrics, list) or not metrics or not all(isinstance(m, str) and m for m in metrics):
        raise FedbenchError(f"{where}: metrics must list metric names (e.g. metrics: [accuracy, f1]), got {metrics!r}.")
    return tuple(metrics)


def parse_papers(paper: Any, where: str) -> tuple[str, ...]:
    papers = [] if paper is None else [paper] if isinstance(paper, str) else paper
    if not isinstance(papers, list) or not all(isinstance(p, str) and p for p in papers):
        raise FedbenchError(f"{where}: paper names the papers compared with (paper: fedbm, or paper: [fedbm, fedcb]), "
                            f"got {paper!r}.")
    return tuple(papers)


def parse_uncovered(entries: Any, where: str) -> tuple[dict[str, Any], ...]:
    for entry in entries or []:
        bad = set(entry) - UNCOVERED_KEYS if isinstance(entry, dict) else {"(not a mapping)"}
        if bad or not {"paper", "table", "reason"} <= set(entry):
            raise FedbenchError(f"{where}: uncovered entry {entry!r} needs paper, table and reason (and may name "
                                f"{sorted(UNCOVERED_KEYS - {'paper', 'table', 'reason'})}).")
    return tuple(plain_copy(e) for e in entries or [])


def _tuple_or_none(value: Any, key: str, where: str) -> tuple | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise FedbenchError(f"{where}: {key} must be a list, got {value!r}.")
    return tuple(plain_copy(value))


def _text(value: Any, key: str, where: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise FedbenchError(f"{where}: {key} must be text, got {value!r}.")
    return value
