"""The departures of docs/departures.md by id, and which table rows each can move (docs/departures.yaml).

docs/departures.md says what each departure is and why, one line each, opening with its id (``FBM-3``);
docs/departures.yaml holds, per id, the rows it can move and a one-line text for the tables' legends (its
header documents the keys). A table prints beside every row the ids of the departures that can move it
(bench/reporting/tables.py): a run carries an id when every key of the id's entry holds for it, and a row the
ids of its runs. Loading checks the file: an unknown key, section or config path, a malformed id or an empty
text is one FedbenchError naming the file. ``doc_ids`` reads the ids of the Markdown file (tests check that the
two files list the same ids, each once).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.assembly.config import RunConfig
from bench.core.errors import FedbenchError
from bench.core.paths import REPO_ROOT

DEPARTURES_FILE = REPO_ROOT / "docs" / "departures.yaml"
DOC_FILE = REPO_ROOT / "docs" / "departures.md"
ID = re.compile(r"^([A-Z]+)-([1-9][0-9]*)$")
LIST_KEYS = ("tables", "methods", "not_methods", "datasets", "partitions", "evals", "round_rules")
KEYS = {*LIST_KEYS, "when", "text"}
DOC_LINE = re.compile(r"^- \*\*([A-Z]+-[0-9]+)\*\* ")


@dataclass(frozen=True)
class Departure:
    """One departure: its id, its legend text, and the rows it can move (None: any)."""

    id: str
    text: str
    tables: tuple[str, ...]
    methods: tuple[str, ...] | None = None
    not_methods: tuple[str, ...] = ()
    datasets: tuple[str, ...] | None = None
    partitions: tuple[str, ...] | None = None
    evals: tuple[str, ...] | None = None
    round_rules: tuple[str, ...] | None = None
    when: tuple[tuple[str, tuple[Any, ...]], ...] = ()


def id_key(ident: str) -> tuple[str, int]:
    """Ids sort by section, then number (FBM-2 before FBM-10)."""
    prefix, number = ID.match(ident).groups()
    return prefix, int(number)


def check_path(path: str, where: str) -> None:
    """A ``when`` path names a field of the run config (``method.args.<name>``: any method argument)."""
    node: Any = RunConfig
    parts = path.split(".")
    for i, part in enumerate(parts):
        names = {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else {}
        if part not in names:
            raise FedbenchError(f"{where}: 'when' names {path!r}, not a run config field (e.g. method.optimizer, "
                                "method.args.<argument>, fed.lr_decay).")
        if parts[:i + 1] == ["method", "args"]:
            if len(parts) != 3:
                raise FedbenchError(f"{where}: 'when' path {path!r}: name one method argument, method.args.<name>.")
            return
        factory = names[part].default_factory  # a group (data, fed, method, ...) is built by its class
        node = factory if dataclasses.is_dataclass(factory) else None


def _values(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, list) else (value,)


def parse_entry(ident: str, entry: Any, sections: dict[str, list[str]], where: str) -> Departure:
    """One line of docs/departures.yaml, checked."""
    at = f"{where}: {ident}"
    match = ID.match(ident)
    if match is None or match.group(1) not in sections:
        raise FedbenchError(f"{at}: an id is <section>-<number> with a section among {', '.join(sections)}.")
    if not isinstance(entry, dict) or set(entry) - KEYS:
        extra = sorted(set(entry) - KEYS) if isinstance(entry, dict) else entry
        raise FedbenchError(f"{at}: unknown keys {extra!r}; an entry has {', '.join(sorted(KEYS))}.")
    text = entry.get("text")
    if not isinstance(text, str) or not text.strip() or "\n" in text:
        raise FedbenchError(f"{at}: 'text' must be one non-empty line (the legend prints it beside the id).")
    lists = {}
    for key in LIST_KEYS:
        if key in entry:
            value = entry[key]
            if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
                raise FedbenchError(f"{at}: {key!r} must be a non-empty list of names, got {value!r}.")
            lists[key] = tuple(value)
    when = entry.get("when") or {}
    if not isinstance(when, dict):
        raise FedbenchError(f"{at}: 'when' maps config paths to values, got {when!r}.")
    for path in when:
        check_path(path, at)
    lists.setdefault("tables", tuple(sections[match.group(1)]))
    return Departure(ident, text.strip(), when=tuple((p, _values(v)) for p, v in when.items()), **lists)


def load_departures(path: str | Path | None = None) -> dict[str, Departure]:
    """id -> Departure, from docs/departures.yaml (or ``path``), in id order."""
    path = Path(path) if path is not None else DEPARTURES_FILE
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise FedbenchError(f"{path}: cannot read the departures ({err}).") from err
    if not isinstance(doc, dict) or set(doc) != {"sections", "departures"}:
        raise FedbenchError(f"{path}: the file has 'sections' (prefix -> table names) and 'departures' (id -> entry).")
    sections = doc["sections"]
    if not isinstance(sections, dict) or not all(isinstance(v, list) and v for v in sections.values()):
        raise FedbenchError(f"{path}: 'sections' maps each id prefix to the table names it covers.")
    entries = doc["departures"] or {}
    deps = [parse_entry(str(k), v, sections, str(path)) for k, v in entries.items()]
    return {d.id: d for d in sorted(deps, key=lambda d: id_key(d.id))}


def config_value(cfg: RunConfig, path: str) -> Any:
    """The run config's value at a dotted path; None for a method argument left unset."""
    node: Any = cfg
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else getattr(node, part)
    return node


def moves(dep: Departure, table: str, cfg: RunConfig, protocol: Any) -> bool:
    """Whether ``dep`` can move a run of ``table`` with config ``cfg`` scored as ``protocol`` (a RowProtocol)."""
    method = cfg.method.name
    checks = [(dep.tables, table), (dep.methods, method), (dep.datasets, cfg.data.name),
              (dep.partitions, cfg.partition.scheme), (dep.evals, protocol.eval), (dep.round_rules, protocol.round)]
    if any(allowed is not None and value not in allowed for allowed, value in checks):
        return False
    if method in dep.not_methods:
        return False
    return all(config_value(cfg, path) in allowed for path, allowed in dep.when)


def table_departures(table: str, runs: list, protocols: dict, deps: dict[str, Departure] | None = None
                     ) -> dict[tuple[str, str], list[str]]:
    """(row label, column id) -> the ids of the departures that can move that row's runs in that column.
    A row averaging others (``average_of``) carries the ids of the rows it averages."""
    deps = load_departures() if deps is None else deps
    found: dict[tuple[str, str], set[str]] = {}
    for r in runs:
        if not r.row.derived:
            ids = {d.id for d in deps.values() if moves(d, table, r.cfg, protocols[r.label])}
            for col in r.columns:
                found.setdefault((r.label, col), set()).update(ids)
    for r in runs:
        for source in r.row.average_of or ():
            for col in r.columns:
                found.setdefault((r.label, col), set()).update(found.get((source, col), set()))
    return {key: sorted(ids, key=id_key) for key, ids in found.items()}


def doc_ids(text: str) -> tuple[list[str], list[str]]:
    """(the ids opening the departure lines of docs/departures.md in order, the departure lines without one).
    A departure line is a bullet ("- ") under a "## " section."""
    ids, bare = [], []
    in_section = False
    for line in text.splitlines():
        if line.startswith("## "):
            in_section = True
        elif in_section and line.startswith("- "):
            match = DOC_LINE.match(line)
            if match:
                ids.append(match.group(1))
            else:
                bare.append(line)
    return ids, bare


def cell_departures(found: dict[tuple[str, str], list[str]], label: str, col_id: str) -> list[str]:
    """The ids of one cell: its runs', or, in a derived column (run by no run), every id of its row."""
    if (label, col_id) in found:
        return found[(label, col_id)]
    return sorted({i for (lab, _), ids in found.items() if lab == label for i in ids}, key=id_key)


def row_mark(label: str, ids: list[str]) -> str:
    """A row's label in the Markdown table, with the ids of the departures that can move it as a footnote mark."""
    return f"{label} <sup>{', '.join(ids)}</sup>" if ids else label


def departure_legend(texts: dict[str, str]) -> list[str]:
    """The legend's list of the departures a table prints (id -> text): each id with its one-line text."""
    if not texts:
        return []
    head = ("- Departures from the papers or their public code that can move a row's numbers, printed beside the "
            "row (each one's reason: docs/departures.md):")
    return [head, *(f"  - {i}: {text}" for i, text in texts.items())]
