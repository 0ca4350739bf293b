"""One row of a table config, parsed and checked once into a TableRow: its own keys typed, and apart from them
the RunConfig overrides of its runs.

A row in YAML mixes the two (``{label: FedProx, method: {name: fedprox}, paper_method: FedProx}``); everything
after ``TableRow.parse`` reads fields (``row.label``, ``row.paper_method``, ``row.overrides``), never the mapping.
The keys are documented in bench/scheduling/table_runner.py's module docstring.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.assembly.config import OPTION_GROUPS
from bench.core.errors import FedbenchError
from bench.tables.spec import check_overrides, plain_copy

# a row's own keys; its other keys override RunConfig's option groups
ROW_OWN_KEYS = {"label", "partition_independent", "paper_method", "betas", "columns", "paper_table",
                "paper_setting", "paper_dataset", "round_rule", "record_tag", "average_of"}
# what a derived row (average_of) may name: it runs nothing, so it takes no options
DERIVED_ROW_KEYS = {"label", "average_of", "paper_method", "paper_table", "paper_setting", "paper_dataset"}
# a paper reference: one value, or a mapping paper -> value (the row is compared with several papers)
PAPER_REF_KEYS = ("paper_method", "paper_table", "paper_setting")
PaperRef = str | int | dict[str, Any] | None


@dataclass(frozen=True)
class TableRow:
    """A table row as every command reads it (the YAML mapping stays in the config file)."""

    label: str  # its name in the table; rows restricted to some columns share a label
    overrides: dict[str, Any] = field(default_factory=dict)  # RunConfig option groups (method, fed, data, ...)
    partition_independent: bool = False  # runs once per seed, shown in every column (Central, CLIP-ZS)
    columns: tuple[Any, ...] | None = None  # runs in these columns only
    betas: tuple[float, ...] | None = None  # ... given as Dirichlet concentrations
    paper_method: PaperRef = None  # the papers' name of its method (default: its label)
    paper_table: PaperRef = None
    paper_setting: PaperRef = None
    paper_dataset: str | None = None
    round_rule: str | None = None  # how its round is picked (bench/tables/protocols.py ROUND_RULES)
    record_tag: str | None = None  # its records go to the experiment folder <table>-<tag>
    average_of: tuple[str, ...] | None = None  # a derived row: per seed and column, the mean of these rows

    @property
    def derived(self) -> bool:
        """Whether it is computed from other rows (``average_of``) and runs nothing."""
        return self.average_of is not None

    @property
    def partition(self) -> dict[str, Any]:
        """Its own partition overrides ({} when it has none)."""
        return self.overrides.get("partition") or {}

    @classmethod
    def parse(cls, raw: Any, where: str) -> TableRow:
        """The TableRow of one entry of a table config's ``rows`` (``where``: the config, for the errors)."""
        if not isinstance(raw, dict) or not isinstance(raw.get("label"), str) or not raw["label"]:
            raise FedbenchError(f"{where}: every row is a mapping with a label (its name in the table), got {raw!r}.")
        where = f"{where}: row {raw['label']!r}"
        check_overrides(raw, where, ROW_OWN_KEYS | set(OPTION_GROUPS))
        if "average_of" in raw:
            extra = set(raw) - DERIVED_ROW_KEYS
            if extra:
                raise FedbenchError(f"{where}: a derived row (average_of) runs nothing, so it takes no "
                                    f"{sorted(extra)}; it may name {sorted(DERIVED_ROW_KEYS - {'label', 'average_of'})}.")
        own = {key: plain_copy(raw[key]) for key in ROW_OWN_KEYS - {"label"} if key in raw}
        check_types(own, where)
        for key in ("columns", "betas", "average_of"):
            if own.get(key) is not None:
                own[key] = tuple(own[key])
        return cls(raw["label"], {k: plain_copy(v) for k, v in raw.items() if k in OPTION_GROUPS}, **own)


def check_types(own: dict[str, Any], where: str) -> None:
    """A row's own keys have values of their kind: one FedbenchError naming the first that has not."""
    if not isinstance(own.get("partition_independent", False), bool):
        raise FedbenchError(f"{where}: partition_independent is true or false, got {own['partition_independent']!r}.")
    for key in ("columns", "betas"):
        if own.get(key) is not None and not isinstance(own[key], list):
            raise FedbenchError(f"{where}: {key} must be a list, got {own[key]!r}.")
    for key in ("paper_dataset", "round_rule"):
        if own.get(key) is not None and not isinstance(own[key], str):
            raise FedbenchError(f"{where}: {key} must be text, got {own[key]!r}.")
    for key in PAPER_REF_KEYS:
        value = own.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, str | int | dict)):
            raise FedbenchError(f"{where}: {key} is a name, or a mapping paper -> name, got {value!r}.")
    tag = own.get("record_tag")
    if tag is not None and (not isinstance(tag, str) or not tag or not all(ch.isalnum() or ch in "-_." for ch in tag)):
        raise FedbenchError(f"{where}: record_tag must be a short name of letters, digits, '-', '_' or '.', "
                            f"got {tag!r}.")
    sources = own.get("average_of")
    if "average_of" in own and (not isinstance(sources, list) or len(sources) < 2 or len(set(map(str, sources))) != len(sources)
                                or not all(isinstance(s, str) for s in sources)):
        raise FedbenchError(f"{where}: average_of must list at least two distinct labels of rows that run "
                            f"(got {sources!r}).")
