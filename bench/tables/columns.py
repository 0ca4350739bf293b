"""Table columns: partition settings, named exactly as results/paper/*.json names partitions.

A table config lists its columns (``columns: [...]``); each is one of

    dirichlet-<beta>             per-class Dirichlet(beta) over the clients (FedBM, FedCB, FACMIC)
    dirichlet-classwise[-<beta>] per-class Dirichlet with randomly missing classes (FedNPR's RSNA-ICH;
                                 scheme dirichlet_missing, args.missing_prob from the config); paper key
                                 ``dirichlet-classwise`` (the papers do not print the beta)
    dirichlet-classwise-file     the class-wise Dirichlet split as published in a file (FedNPR's
                                 ich_datasplit_10cl.npy as data.client_split_file): the file's clients as sites
                                 (scheme natural) tested on their own test lists (fed.client_test site);
                                 paper key ``dirichlet-classwise``
    lda-<alpha>                  FST-CBDG's "LDA": FedNTD's per-class Dirichlet(alpha) with a zero share for
                                 clients already holding 1/N of the data (scheme lda)
    shards-<s>                   s label shards per client (scheme shards; the base partition's args.shard_mode
                                 says whose: McMahan's sorted cut or FedNTD's per-class shards)
    iid                          an even random split
    natural                      one client per natural site / writer (scheme natural)
    none                         no partition: centralised / zero-shot rows (their runs use the base
                                 partition; a paper prints such rows once per dataset)
    average                      derived, not run: per seed, the mean of the row's other columns
                                 (FACMIC's "Average" over alpha 0.3/0.6/0.9 and iid)

``betas: [0.05, 0.1]`` is sugar for Dirichlet columns: it gives ``dirichlet-<beta>`` columns (or
``dirichlet-classwise-<beta>`` when the base partition is dirichlet_missing; a single beta over a
natural / iid / shards base partition gives that one column), each setting ``partition.args.beta``, as
before columns existed.

A column sets the scheme and its own option (``args.beta``, ``args.shards_per_client``); the table's base
partition ``args`` apply to every column whose scheme takes them (``min_size`` to the Dirichlet and LDA columns,
``shard_mode`` to the shards columns: bench/scheduling/table_runner.py run_partition).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bench.assembly.config import beta_text, flat_partition
from bench.core.errors import FedbenchError

if TYPE_CHECKING:
    from bench.tables.table_spec import TableSpec

_NUMBER = r"(\d+(?:\.\d+)?(?:e-?\d+)?)"
_PATTERNS = (
    (re.compile(r"^dirichlet-classwise-file$"), "dirichlet-classwise-file"),
    (re.compile(rf"^dirichlet-{_NUMBER}$"), "dirichlet"),
    (re.compile(rf"^dirichlet-classwise(?:-{_NUMBER})?$"), "dirichlet-classwise"),
    (re.compile(rf"^lda-{_NUMBER}$"), "lda"),
    (re.compile(r"^shards-(\d+)$"), "shards"),
    (re.compile(r"^(iid|natural|none|average)$"), "plain"),
)
# partition schemes drawn with a concentration (partition.args.beta) -> their column kind
CONCENTRATION_KINDS = {"dirichlet": "dirichlet", "dirichlet_missing": "dirichlet-classwise", "lda": "lda"}
KINDS = ("dirichlet-<beta>", "dirichlet-classwise[-<beta>]", "dirichlet-classwise-file", "lda-<alpha>",
         "shards-<s>", "iid", "natural", "none", "average")


@dataclass(frozen=True)
class Column:
    """One column of a table: what its runs override in the partition, and how it is named."""

    id: str  # as written in the config
    paper_partition: str  # the partition key of results/paper/*.json it is compared with
    label: str  # table header: "β=0.05", "α=0.1", "s=2", "iid", ...
    partition: dict[str, Any] = field(default_factory=dict)  # partition config overrides of its runs
    beta: float | None = None  # the Dirichlet concentration, when the column has one
    derived: bool = False  # computed from the other columns, never run
    # its runs read a published client split (data.client_split_file, fed.client_test site)
    client_split_file: bool = False

    @property
    def file_tag(self) -> str:
        """File-name part of this column's figures (``beta0.05`` as before for Dirichlet columns)."""
        return f"beta{self.beta:g}" if self.beta is not None else self.id


def parse_column(text: str) -> Column:
    """A column from its name (see the module docstring); FedbenchError on anything else."""
    if not isinstance(text, str):
        raise FedbenchError(f"Column {text!r} must be a string such as 'dirichlet-0.1'; kinds: {', '.join(KINDS)}.")
    for pattern, kind in _PATTERNS:
        m = pattern.match(text)
        if not m:
            continue
        if kind == "dirichlet":
            b = float(m.group(1))
            return Column(text, f"dirichlet-{b:g}", f"β={b:g}", {"scheme": "dirichlet", "args": {"beta": b}}, beta=b)
        if kind == "dirichlet-classwise-file":
            return Column(text, "dirichlet-classwise", "published split", {"scheme": "natural"},
                          client_split_file=True)
        if kind == "dirichlet-classwise":
            if m.group(1) is None:
                return Column(text, "dirichlet-classwise", "class-wise Dir.", {"scheme": "dirichlet_missing"})
            b = float(m.group(1))
            return Column(text, "dirichlet-classwise", f"β={b:g}", {"scheme": "dirichlet_missing", "args": {"beta": b}},
                          beta=b)
        if kind == "lda":
            a = float(m.group(1))
            return Column(text, f"lda-{a:g}", f"α={a:g}", {"scheme": "lda", "args": {"beta": a}}, beta=a)
        if kind == "shards":
            s = int(m.group(1))
            return Column(text, f"shards-{s}", f"s={s}", {"scheme": "shards", "args": {"shards_per_client": s}})
        name = m.group(1)
        if name == "none":
            return Column(text, "none", "centralised")
        if name == "average":
            return Column(text, "average", "average", derived=True)
        return Column(text, name, name, {"scheme": name})
    raise FedbenchError(f"Unknown column {text!r}; columns are partition settings: {', '.join(KINDS)}.")


def run_column(partition: Any, client_split_file: Any = None) -> str:
    """The column a run's partition belongs to, named as a table config names it (the one partition key:
    W&B's ``partition_key``, and through ``paper_partition`` the papers'): ``dirichlet-0.05``,
    ``dirichlet-classwise-0.3``, ``dirichlet-classwise-file`` (a published split read from a file),
    ``lda-0.1``, ``shards-2``, ``iid``, ``natural``; another scheme by its name. ``partition``: a
    PartitionConfig (its options at their defaults when not given) or a config's partition mapping (a missing
    beta: the scheme's column kind)."""
    if isinstance(partition, dict):
        args = partition.get("args") or {}
        scheme = partition.get("scheme")

        def get(key: str, default: Any = None) -> Any:
            return args.get(key, default)
    else:
        scheme, flat = partition.scheme, flat_partition({"args": partition.args})
        get = flat.get
    beta = get("beta")
    if client_split_file:
        return "dirichlet-classwise-file"
    if scheme == "shards":
        return f"shards-{get('shards_per_client', 2)}"
    kind = CONCENTRATION_KINDS.get(scheme)
    if kind is None:
        return scheme
    return kind if beta is None else f"{kind}-{beta_text(beta)}"


def column_of(column_id: str) -> Column | None:
    """The Column a run's column id names, or None for a partition no column kind names (proportions)."""
    try:
        return parse_column(column_id)
    except FedbenchError:
        return None


def paper_partition(column_id: str) -> str:
    """The papers' partition key of a run's column (``dirichlet-classwise-0.3`` -> ``dirichlet-classwise``:
    the papers do not print that beta); a partition no column names keeps its own name."""
    column = column_of(column_id)
    return column_id if column is None else column.paper_partition


def beta_column(beta: float, scheme: str, shards_per_client: int = 2) -> Column:
    """The column ``betas: [beta]`` stands for over a base partition ``scheme`` (sets partition.args.beta)."""
    b = float(beta)
    if scheme == "dirichlet":
        return Column(f"dirichlet-{b:g}", f"dirichlet-{b:g}", f"β={b:g}", {"args": {"beta": b}}, beta=b)
    if scheme == "dirichlet_missing":
        return Column(f"dirichlet-classwise-{b:g}", "dirichlet-classwise", f"β={b:g}", {"args": {"beta": b}}, beta=b)
    name = f"shards-{shards_per_client}" if scheme == "shards" else scheme
    return Column(name, name, name, {"args": {"beta": b}}, beta=b)


def columns_from(columns: Any, betas: Any, where: str, base_partition: dict[str, Any]) -> list[Column]:
    """The columns a table (or row) config names with ``columns`` or ``betas`` (None: not given)."""
    if columns is not None and betas is not None:
        raise FedbenchError(f"{where}: give either 'columns' or 'betas' (sugar for Dirichlet columns), not both.")
    if columns is not None:
        cols = [parse_column(c) for c in columns]
    elif betas is not None:
        scheme = base_partition.get("scheme", "dirichlet")
        shards = (base_partition.get("args") or {}).get("shards_per_client", 2)
        cols = [beta_column(b, scheme, shards) for b in betas]
        if scheme not in ("dirichlet", "dirichlet_missing") and len(cols) > 1:
            raise FedbenchError(f"{where}: 'betas' makes Dirichlet columns; the {scheme!r} partition has one "
                                "column (use columns: [...] for other settings).")
    else:
        raise FedbenchError(f"{where}: no columns; add columns: [dirichlet-0.1, iid, ...] or betas: [...].")
    ids = [c.id for c in cols]
    if not cols or len(set(ids)) != len(ids):
        raise FedbenchError(f"{where}: columns must be a non-empty list without repeats, got {ids}.")
    return cols


def table_columns(spec: TableSpec) -> list[Column]:
    """The columns of a table config (its base partition decides what ``betas`` stands for)."""
    return columns_from(spec.columns, spec.betas, f"Table {spec.name}", spec.base_partition)
