"""Command-line changes to a table without editing its YAML: ``--set KEY=VALUE``, ``--seeds``, ``--rows``.

``--set`` replaces one run option in every run of the table, after the config's base and rows:
``fed.rounds=2``, ``data.image_size=16``, ``data.root=/x``, ``method.backbone=resnet18``. KEY is a
dotted RunConfig option (``fedbench run --print_config`` lists them); VALUE is read as YAML
(``2`` an int, ``0.5`` a float, ``true``, ``null``, ``[1, 2]``, ``{mu: 0.1}``) and checked against the
option's type. ``method.args.<name>`` sets a method option in the runs whose method accepts it
(``--set method.args.text_encoder=minilm`` changes FedCB/FedBM rows and leaves FedAvg alone); it is an
error when no row's method accepts it. ``partition.args.<name>`` likewise sets a partition option in the runs
whose scheme takes it (``--set partition.args.min_size=2``: the Dirichlet and LDA columns). The table's own axes
are not options: ``seed`` is ``--seeds``, the partition's ``beta`` is the column, ``data.fold`` / ``data.folds``
are the table's ``folds:`` key, ``devices`` / ``output_dir`` / ``wandb`` are ``fedbench table`` flags.

``--seeds 0`` and ``--rows FedAvg,FedBM`` select a subset of the config's seeds and row labels.

A table run like this is not the config's budget, and nothing mistakes it for one:

- budget ``--set`` overrides (anything but where the data is and how the run executes:
  ``data.root``, ``data.cache_dir``, ``threads``, ...) send the runs to their own experiment,
  ``<table>_<dataset>__set-<hash>``, so they never reuse or overwrite the full-budget records;
  a seed/row subset alone reuses them (those runs are exactly the config's runs);
- every record of the table carries its overrides (``"overrides"``);
- every run changed by a budget override is never compared with a paper's number: its paper column says
  ``not comparable: its runs were changed on the command line (--set fed.rounds=2)``
  (bench/tables/protocols.py);
- the rendered table is written as ``reduced/<table>_<dataset>__<what was reduced>.{md,csv,json}`` under
  the tables folder (``set-fed.rounds=2_seeds-0_rows-FedAvg,FedBM``; other characters become ``-`` and a
  hash is added), and its title and notes say what was changed.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from bench.assembly.config import OPTION_GROUPS, RunConfig, execution_keys, from_dict
from bench.core.errors import FedbenchError
from bench.core.option_types import describe, matches

if TYPE_CHECKING:
    from bench.tables.table_spec import TableSpec

# the table's own axes and flags: not settable with --set (the message says what to use instead)
RESERVED = {
    "seed": "use --seeds", "experiment": "the table names its experiment", "partition.args.beta": "beta is the table's column",
    "partition.args": "set one option: partition.args.<option>=VALUE",
    "devices": "use --devices", "output_dir": "use --output-dir", "wandb": "use --wandb",
    "data.fold": "the folds are the table's `folds:` key", "data.folds": "the folds are the table's `folds:` key",
}
# the option groups with options of their own (``<group>.args``): what a --set of one applies to, and its name
OWN_ARGS = {"method": ("method", lambda cfg: cfg.method.name),
            "partition": ("partition scheme", lambda cfg: cfg.partition.scheme)}
# where the data is and how runs execute (bench/assembly/config.py's EXECUTION options): overriding these keeps the
# table at the config's budget
# Run options that change the arithmetic, not the budget: a table run with them is complete, but a result of
# its own (written beside the config's table, never over it)
NUMERIC_KEYS = frozenset({"gpu_math", "precision", "channels_last", "compile"})
REDUCED_TITLE = " — REDUCED RUN, not the config's budget"  # what a reduced table's title adds
LOCATION_KEYS = frozenset({"data.root", *execution_keys(RunConfig),
                           *(f"{group}.{key}" for group, cls in OPTION_GROUPS.items() for key in execution_keys(cls))})


def _fields() -> dict[str, Any]:
    """Every settable dotted key -> its type hint."""
    out = {}
    hints = typing.get_type_hints(RunConfig)
    for f in dataclasses.fields(RunConfig):
        if f.name in OPTION_GROUPS:
            for key, hint in typing.get_type_hints(hints[f.name]).items():
                out[f"{f.name}.{key}"] = hint
        else:
            out[f.name] = hints[f.name]
    return {k: v for k, v in out.items() if k not in RESERVED}


def coerce(key: str, hint: Any, value: Any, text: str) -> Any:
    """``value`` (parsed from ``text``) as the option's type, or one clear error (the type rules are
    bench/assembly/validation.py's, which checks every planned run again before any starts)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        if matches(value, hint):
            return value
        raise FedbenchError(f"--set {key}: {text!r} is not one of {', '.join(repr(a) for a in args)}.")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return coerce(key, inner[0], value, text)
    elif hint is str:
        return text  # data.root=2024 is the folder "2024", not a number
    elif origin is list and isinstance(value, list) and args:
        return [coerce(key, args[0], v, str(v)) for v in value]
    if not matches(value, hint):
        raise FedbenchError(f"--set {key}: expected {describe(hint)}, got {text!r}.")
    return float(value) if hint is float else value


def parse_set(item: str) -> tuple[str, Any, str]:
    """'fed.rounds=2' -> ('fed.rounds', 2, '2'): the key, the YAML value and its text."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise FedbenchError(f"--set expects KEY=VALUE (e.g. --set fed.rounds=2), got {item!r}.")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as err:
        raise FedbenchError(f"--set {key}: cannot read {text!r} as a value ({err}).") from err
    return key, value, text


def checked_sets(items: list[str]) -> dict[str, Any]:
    """--set items -> {key: typed value} (later wins), checking keys and types; method.args.* unchecked here."""
    fields = _fields()
    out: dict[str, Any] = {}
    for item in items:
        key, value, text = parse_set(item)
        if key in RESERVED:
            raise FedbenchError(f"--set {key}: not a run option of a table ({RESERVED[key]}).")
        group = next((g for g in OWN_ARGS if key.startswith(f"{g}.args.")), None)
        if group is not None:
            option = key[len(f"{group}.args."):]
            if not option or "." in option:
                raise FedbenchError(f"--set {key}: use {group}.args.<option>=VALUE (one option per --set).")
            out[key] = value
            continue
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=3, cutoff=0.6)
            hint = f" Did you mean {', '.join(close)}?" if close else " See `fedbench run --print_config`."
            raise FedbenchError(f"--set {key}: unknown option.{hint}")
        out[key] = coerce(key, fields[key], value, text)
    return out


def pick_rows(spec: TableSpec, wanted: list[str] | None) -> list[str] | None:
    """The row labels named by --rows (each value one label, or labels separated by commas)."""
    if not wanted:
        return None
    labels = spec.labels
    chosen: list[str] = []
    for item in wanted:
        for label in [item] if item in labels else [p.strip() for p in item.split(",") if p.strip()]:
            if label not in labels:
                close = difflib.get_close_matches(label, labels, n=3, cutoff=0.5)
                hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
                raise FedbenchError(f"--rows: no row {label!r} in this table.{hint} Rows: {', '.join(labels)}.")
            chosen.append(label)
    return list(dict.fromkeys(chosen))


def comma_ints(flag: str, what: str, wanted: str | list[int]) -> list[int]:
    """The whole numbers of ``--<flag> [0,2]`` (a list: the command's parser has read it) or of ``0,2``;
    one clear error otherwise."""
    if isinstance(wanted, list):
        return wanted
    try:
        return [int(s) for s in wanted.split(",") if s.strip()]
    except ValueError as err:
        raise FedbenchError(f"--{flag} expects {what} separated by commas (e.g. --{flag} 0,1), got {wanted!r}."
                            ) from err


def shown(wanted: str | list[int]) -> str:
    """A --seeds / --folds value as given: ``0,2`` (a list as jsonargparse writes it: ``[0,2]``)."""
    return wanted if isinstance(wanted, str) else f"[{','.join(map(str, wanted))}]"


def pick_seeds(spec: TableSpec, wanted: str | list[int] | None) -> list[int] | None:
    """The seeds named by --seeds ([0,2], or '0' or '0,2'), a subset of the config's."""
    if wanted is None:
        return None
    seeds = comma_ints("seeds", "seeds", wanted)
    outside = [s for s in seeds if s not in spec.seeds]
    if not seeds or outside:
        raise FedbenchError(f"--seeds {shown(wanted)}: choose among the config's seeds {list(spec.seeds)}.")
    return list(dict.fromkeys(seeds))


def pick_folds(spec: TableSpec, wanted: str | list[int] | None) -> list[int] | None:
    """The folds named by --folds ([0,2], or '0' or '0,2'), k of the config's ``folds: K`` (0 <= k < K)."""
    if wanted is None:
        return None
    if not spec.folds:
        raise FedbenchError(f"--folds {shown(wanted)}: this table has no folds (it repeats over seeds; use --seeds).")
    folds = comma_ints("folds", "fold numbers", wanted)
    if not folds or any(not 0 <= k < spec.folds for k in folds):
        raise FedbenchError(f"--folds {shown(wanted)}: choose among the config's folds 0..{spec.folds - 1}.")
    return sorted(set(folds))


REDUCED_DIR = "reduced"  # the folder of reduced tables, under the tables folder
_UNSAFE = re.compile(r"[^A-Za-z0-9._,=+-]+")  # what a reduced table's name keeps of the reduction, as is
_READABLE_MAX = 160  # with the longest figure suffix, under 255 bytes


def _digest(obj: Any) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:8]


@dataclass
class TableOverrides:
    """What the command line changed in a table config (see the module docstring)."""

    sets: dict[str, Any] = field(default_factory=dict)
    seeds: list[int] | None = None
    rows: list[str] | None = None
    folds: list[int] | None = None  # --folds: these of the config's K folds only
    applied_to: dict[str, list[str]] = field(default_factory=dict)  # <group>.args key -> row labels it changed

    @classmethod
    def parse(cls, spec: TableSpec, sets: list[str] | None, seeds: str | list[int] | None, rows: list[str] | None,
              folds: str | list[int] | None = None) -> TableOverrides:
        out = cls(checked_sets(sets or []), pick_seeds(spec, seeds), pick_rows(spec, rows), pick_folds(spec, folds))
        if out.seeds == list(spec.seeds):
            out.seeds = None
        if out.folds is not None and out.folds == list(range(spec.folds)):
            out.folds = None
        if out.rows is not None and out.rows == spec.labels:
            out.rows = None
        return out

    @property
    def budget_sets(self) -> dict[str, Any]:
        """The overrides that change what is computed (not only where the data is or how it runs)."""
        return {k: v for k, v in self.sets.items() if k not in LOCATION_KEYS}

    @property
    def full_budget(self) -> bool:
        return not self.budget_sets and self.seeds is None and self.rows is None and self.folds is None

    @property
    def reduced(self) -> bool:
        """Less than the config's budget: fewer rounds, seeds, rows ... (not only another numeric setting)."""
        return (any(k not in NUMERIC_KEYS for k in self.budget_sets) or self.seeds is not None
                or self.rows is not None or self.folds is not None)

    def title_note(self) -> str:
        """What the rendered table's title adds: a reduced run, or the numeric settings it ran under instead of
        the config's (``gpu_math=tf32``: the whole budget, but a result of its own)."""
        if self.reduced:
            return REDUCED_TITLE
        numeric = {k: v for k, v in self.budget_sets.items() if k in NUMERIC_KEYS}
        return (" — " + ", ".join(f"{k}={v}" for k, v in numeric.items()) + ", not the config's numeric settings"
                if numeric else "")

    def select(self, spec: TableSpec) -> TableSpec:
        """The table config restricted to the chosen seeds, rows and folds."""
        out = spec
        if self.seeds is not None:
            out = dataclasses.replace(out, seeds=tuple(self.seeds))
        if self.rows is not None:
            out = dataclasses.replace(out, rows=tuple(r for r in out.rows if r.label in self.rows))
        if self.folds is not None:
            out = dataclasses.replace(out, run_folds=tuple(self.folds))  # table_repeats runs these folds of the K
        return out

    def experiment(self, experiment: str) -> str:
        """Where the runs' records go: their own experiment when budget options changed."""
        return f"{experiment}__set-{_digest(self.budget_sets)}" if self.budget_sets else experiment

    def table_name(self, name: str) -> str:
        """The rendered table's file name stem: never the full table's when the budget is not the config's,
        but ``<name>__<what was reduced>`` (``table2_kvasir__set-fed.rounds=2_seeds-0_rows-FedAvg,FedBM``)."""
        if self.full_budget:
            return name
        parts = [f"set-{k}={v if isinstance(v, str) else json.dumps(v, separators=(',', ':'))}"
                 for k, v in self.budget_sets.items()]
        parts += [f"{what}-{','.join(str(x) for x in chosen)}"
                  for what, chosen in (("seeds", self.seeds), ("rows", self.rows), ("folds", self.folds))
                  if chosen is not None]
        readable = "_".join(parts)
        safe = _UNSAFE.sub("-", readable)
        ambiguous = any("," in str(x) for x in [*(self.rows or []), *(self.seeds or []), *(self.folds or [])])
        if ambiguous or safe != readable or len(safe) > _READABLE_MAX:  # not one-to-one: a digest keeps it unique
            chosen = [self.budget_sets, self.seeds, self.rows] + ([self.folds] if self.folds is not None else [])
            safe = f"{safe[:_READABLE_MAX]}_{_digest(chosen)}"
        return f"{name}__{safe}"

    def tables_dir(self, tables_dir: str) -> str:
        """Where the rendered table goes: ``<tables_dir>/reduced/`` when the budget is not the config's
        (gitignored, removed by ``make clean-results``), else ``tables_dir``."""
        return tables_dir if self.full_budget else str(Path(tables_dir) / REDUCED_DIR)

    @staticmethod
    def method_accepts(name: str) -> set[str]:
        """The keyword options of method ``name`` (imports it: only when ``--set method.args.*`` is given)."""
        from bench.assembly.experiment import method_arg_names
        from lightning_modules.base import METHODS

        return method_arg_names(METHODS.get(name))

    def accepts(self, d: dict[str, Any]) -> dict[str, set[str]]:
        """The own options of a run config's method and partition scheme (``d``: its to_dict()), as far as a
        ``--set <group>.args.*`` asks about them."""
        from bench.tables.catalog import scheme_option_names

        asked = {key.split(".")[0] for key in self.applied_to}
        return {"method": self.method_accepts(d["method"]["name"]) if "method" in asked else set(),
                "partition": scheme_option_names(d["partition"]["scheme"]) if "partition" in asked else set()}

    def apply(self, runs: list) -> None:
        """Set every override in every planned run (method.args.* where the method accepts it, partition.args.*
        where the scheme takes it)."""
        for key in (k for k in self.sets if k.split(".")[0] in OWN_ARGS and k.split(".")[1:2] == ["args"]):
            self.applied_to[key] = []
        budget = self.budget_sets
        for run in runs:
            d = run.cfg.to_dict()
            accepts = self.accepts(d) if self.applied_to else {}
            for key, value in self.sets.items():
                *path, last = key.split(".")
                if len(path) == 2 and path[0] in OWN_ARGS and path[1] == "args":
                    if last not in accepts[path[0]]:
                        continue
                    if run.label not in self.applied_to[key]:
                        self.applied_to[key].append(run.label)
                if key in budget:
                    run.overrides = {**getattr(run, "overrides", {}), key: copy.deepcopy(value)}
                target = d
                for part in path:
                    target = target[part]
                target[last] = copy.deepcopy(value)
            d["experiment"] = self.experiment(d["experiment"])
            run.cfg = from_dict(d)
        for key, labels in self.applied_to.items():
            if not labels:
                what, name = OWN_ARGS[key.split(".")[0]]
                names = sorted({name(r.cfg) for r in runs})
                raise FedbenchError(f"--set {key}: no row's {what} accepts {key.split('.')[-1]!r} "
                                    f"({what}s in this table: {', '.join(names)}).")

    def blamed(self, message: str) -> str | None:
        """``KEY=VALUE`` of the --set a validation message is about (it starts with the option's name),
        else None: an out-of-range override is the same error in every row, so it is named as an override."""
        for key, value in self.sets.items():
            if message.startswith(f"{key} "):
                return f"{key}={json.dumps(value)}"
        return None

    def record(self) -> dict[str, Any]:
        """What every run record of this table stores about the command-line changes."""
        return {"overrides": dict(self.sets)} if self.sets else {}

    def describe(self, spec: TableSpec) -> list[str]:
        """Lines for the rendered table: what differs from the config's budget (empty when nothing does)."""
        if self.full_budget and not self.sets:
            return []
        lines = []
        if self.reduced:
            lines.append("**Not run at the config's budget** (a reduced run: not comparable with the full table).")
        elif not self.full_budget:
            lines.append("**The config's budget under other numeric settings** (a result identity of its own, e.g. "
                         "TF32 instead of float32: compare with the config's table as such).")
        for key, value in self.sets.items():
            rows = self.applied_to.get(key)
            where = f" (rows: {', '.join(rows)})" if rows is not None else ""
            lines.append(f"- --set {key}={json.dumps(value)}{where}")
        if self.seeds is not None:
            lines.append(f"- seeds {self.seeds} of the config's {list(spec.seeds)}")
        if self.folds is not None:
            lines.append(f"- folds {self.folds} of the config's {spec.folds} (data.fold 0..{spec.folds - 1})")
        if self.rows is not None:
            total = len(spec.labels)
            lines.append(f"- {len(self.rows)} of the config's {total} rows: {', '.join(self.rows)}")
        return lines
