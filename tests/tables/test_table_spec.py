"""A table config is parsed once into a typed, frozen TableSpec (issue 40, "a typed table spec parsed once"):
every key checked at load with one error naming the file, each default decided in one place, and no module
after the loader reading the YAML mapping."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from bench.assembly.config import OPTION_GROUPS
from bench.core.errors import FedbenchError
from bench.tables.table_overrides import TableOverrides
from bench.tables.table_row import ROW_OWN_KEYS
from bench.tables.table_spec import DEFAULT_METRICS, TableSpec, load_table_config

RAW = {"table": "t", "dataset": "digits", "betas": [0.1, 0.5], "seeds": [0, 1],
       "base": {"partition": {"num_clients": 4}},
       "rows": [{"label": "FedAvg", "method": {"name": "fedavg"}},
                {"label": "FedProx", "method": {"name": "fedprox"}, "betas": [0.1]},
                {"label": "FedProx", "method": {"name": "fedprox", "args": {"mu": 0.1}}, "betas": [0.5]}]}


def test_every_committed_table_config_parses_with_its_values_typed():
    for path in sorted((REPO / "configs" / "tables").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        spec = load_table_config(str(path))
        assert (spec.name, spec.heading) == (f"{raw['table']}_{raw['dataset']}", f"{raw['table']} {raw['dataset']}")
        assert spec.seeds == tuple(raw["seeds"]) and spec.metrics == tuple(raw.get("metrics", DEFAULT_METRICS))
        paper = raw.get("paper") or []
        assert spec.papers == ((paper,) if isinstance(paper, str) else tuple(paper))
        assert spec.base == (raw.get("base") or {}) and len(spec.rows) == len(raw["rows"])
        for row, given in zip(spec.rows, raw["rows"]):  # each row: its own keys typed, its RunConfig overrides apart
            assert row.label == given["label"]
            assert row.overrides == {k: v for k, v in given.items() if k in OPTION_GROUPS}, row.label
            for key in ROW_OWN_KEYS - {"label"}:
                value = given.get(key, False if key == "partition_independent" else None)
                assert getattr(row, key) == (tuple(value) if isinstance(value, list) else value), (row.label, key)
        assert spec.shown_title == raw.get("title", spec.name) and spec.folds == raw.get("folds")
        assert spec.baseline_given == ("baseline" in raw) and spec.wandb is bool(raw.get("wandb"))


def test_defaults_are_decided_once():
    spec = TableSpec.parse(RAW, "t.yaml")
    assert spec.metrics == ("accuracy", "f1")  # the table, its curves, the dashboard and coverage all read this
    assert (spec.title, spec.shown_title, spec.papers, spec.uncovered, spec.folds, spec.run_folds) == (
        None, "t_digits", (), (), None, None)
    assert (spec.baseline, spec.baseline_given) == (None, False)  # absent: FedAvg (tables.baseline_label)
    assert TableSpec.parse({**RAW, "baseline": None}, "t.yaml").baseline_given  # null: no baseline
    assert spec.labels == ["FedAvg", "FedProx"] and spec.base_partition == {"num_clients": 4}


def test_the_spec_is_frozen_and_owns_its_values():
    raw = yaml.safe_load(yaml.safe_dump(RAW))
    spec = TableSpec.parse(raw, "t.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seeds = (3,)
    raw["rows"][0]["method"]["name"] = "fedbm"  # the caller's mapping changes afterwards: the spec does not
    raw["base"]["partition"]["num_clients"] = 9
    assert spec.rows[0].overrides["method"]["name"] == "fedavg" and spec.base_partition["num_clients"] == 4


def test_a_command_line_selection_is_a_narrower_copy():
    spec = TableSpec.parse(RAW, "t.yaml")
    overrides = TableOverrides.parse(spec, [], "1", ["FedProx"])
    narrow = overrides.select(spec)
    assert narrow.seeds == (1,) and [r.label for r in narrow.rows] == ["FedProx", "FedProx"]
    assert spec.seeds == (0, 1) and len(spec.rows) == 3  # the config as loaded is untouched
    reduced = "**Not run at the config's budget** (a reduced run: not comparable with the full table)."
    assert overrides.describe(spec) == [reduced, "- seeds [1] of the config's [0, 1]", "- 1 of the config's 2 rows: FedProx"]


@pytest.mark.parametrize(("change", "message"), [
    ({"rows": [{"method": {"name": "fedavg"}}]}, "t.yaml: every row is a mapping with a label"),
    ({"rows": []}, "t.yaml: rows must list the table's rows"),
    ({"metrics": "accuracy"}, "t.yaml: metrics must list metric names"),
    ({"paper": [1]}, "t.yaml: paper names the papers compared with"),
    ({"title": 3}, "t.yaml: title must be text, got 3."),
    ({"betas": 0.1}, "t.yaml: betas must be a list, got 0.1."),
    ({"folds": 1, "seeds": [0]}, "t.yaml: folds must be a whole number >= 2"),
    ({"seeds": [0, 0]}, "t.yaml: seeds must list at least one seed"),
    ({"uncovered": [{"paper": "fedbm"}]}, "t.yaml: uncovered entry"),
    ({"colums": ["iid"]}, "t.yaml has unknown key(s) ['colums']"),
    # a row's own keys are checked when the config is read, not when its runs are planned or its cells looked up
    ({"rows": [{"label": "A", "partition_independent": "yes"}]}, "t.yaml: row 'A': partition_independent is true or"),
    ({"rows": [{"label": "A", "paper_method": ["FedAvg"]}]}, "t.yaml: row 'A': paper_method is a name, or a mapping"),
    ({"rows": [{"label": "A", "round_rule": 3}]}, "t.yaml: row 'A': round_rule must be text, got 3."),
    ({"rows": [{"label": "A", "columns": "iid"}]}, "t.yaml: row 'A': columns must be a list, got 'iid'."),
    ({"rows": [{"label": "A", "record_tag": "a b"}]}, "t.yaml: row 'A': record_tag must be a short name"),
    ({"rows": [{"label": "A", "average_of": ["B", "C"], "fed": {"rounds": 2}}]},
     "t.yaml: row 'A': a derived row (average_of) runs nothing, so it takes no ['fed']"),
    ({"rows": [{"label": "A", "metod": {"name": "fedavg"}}]}, "t.yaml: row 'A' has unknown key(s) ['metod']"),
])
def test_a_bad_value_is_one_error_naming_the_file(change, message):
    with pytest.raises(FedbenchError) as err:
        TableSpec.parse({**RAW, **change}, "t.yaml")
    assert str(err.value).startswith(message), str(err.value)


def test_a_bad_table_file_fails_at_load(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({**RAW, "metrics": []}))
    with pytest.raises(FedbenchError, match=f"{path}: metrics must list metric names"):
        load_table_config(str(path))


def spec_mapping_reads(path: Path) -> list[int]:
    """Lines where ``path`` reads a mapping named ``spec`` / ``full_spec``: ``spec[...]``, ``spec.get(...)``, ``{**spec}``."""
    def named_spec(node) -> bool:
        return isinstance(node, ast.Name) and node.id in ("spec", "full_spec")

    def reads(node) -> bool:
        if isinstance(node, ast.Subscript):
            return named_spec(node.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            return node.func.attr == "get" and named_spec(node.func.value)
        if isinstance(node, ast.Dict):
            return any(k is None and named_spec(v) for k, v in zip(node.keys, node.values))
        return False

    return [node.lineno for node in ast.walk(ast.parse(path.read_text())) if reads(node)]


def test_nothing_after_the_loader_reads_the_yaml_mapping():
    """Only the YAML loader (bench/tables/spec.py) reads a spec mapping: the tables read the TableSpec, the
    regression runner its RegressionSpec (each loader names the mapping ``raw``)."""
    readers = {str(p.relative_to(REPO)): lines for p in sorted((REPO / "bench").rglob("*.py"))
               if (lines := spec_mapping_reads(p))}
    assert set(readers) <= {"bench/tables/spec.py"}, readers
