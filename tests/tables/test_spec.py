"""The one spec loader of table and regression configs: keys checked against the config dataclasses,
one clear error per typo, before anything runs."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from bench.assembly.config import OPTION_GROUPS, RunConfig, execution_keys, result_config
from bench.commands.regression import ENTRY_KEYS, load_config
from bench.core.errors import FedbenchError
from bench.scheduling.table_runner import load_table_config
from bench.tables.spec import canonical, run_config, with_defaults

TABLE = {"table": "t", "dataset": "digits", "betas": [0.5], "seeds": [0],
         "rows": [{"label": "A", "method": {"name": "fedavg"}}]}
REGRESSION = {"tolerance": {"test/accuracy": 1.0}, "runs": [{"name": "a", "method": {"name": "fedavg"}}]}


def write(tmp_path, spec: dict) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rowz": []}, "has unknown key(s) ['rowz']; allowed: ['base', 'baseline', 'betas', 'cannot_show', 'columns', 'dataset',"),
        ({"base": {"fedd": {"rounds": 2}}}, "base has unknown key(s) ['fedd']; allowed: ['accelerator', "),
        ({"base": {"fed": {"roundz": 2}}},
         "base has unknown key(s) ['roundz'] in fed; allowed: ['batch_size', "),
        ({"rows": [{"label": "A", "method": {"nmae": "fedavg"}}]},
         "row 'A' has unknown key(s) ['nmae'] in method; allowed: ['args', 'backbone', "),
        ({"rows": [{"label": "A", "seed": 3}]},
         "row 'A' has unknown key(s) ['seed']; allowed: ['average_of', 'betas', 'columns', 'data', "),
    ],
    ids=["table-key", "base-group", "base-group-key", "row-group-key", "row-key"],
)
def test_table_config_typos(tmp_path, change, message):
    with pytest.raises(FedbenchError) as err:
        load_table_config(write(tmp_path, {**TABLE, **change}))
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"runz": []}, "has unknown key(s) ['runz']; allowed: ['base', 'runs', 'tolerance']."),
        ({"base": {"data": {"nmae": "digits"}}},
         "base has unknown key(s) ['nmae'] in data; allowed: ['augment', "),
        ({"runs": [{"name": "a", "threads": 2}]},
         "run 'a' has unknown key(s) ['threads']; allowed: ['channels_last', 'compile', 'data', 'fed', "),
        ({"runs": [{"name": "a", "fed": {"round": 2}}]},
         "run 'a' has unknown key(s) ['round'] in fed; allowed:"),
        ({"tolerance": {"test/accuracy": -0.5}},
         "spec.yaml: tolerance: a tolerance is a number of percentage points >= 0, got {'test/accuracy': -0.5}."),
        ({"runs": [{"name": "a", "tolerance": {"test/accuracy": "1"}}]},
         "run 'a': tolerance: a tolerance is a number of percentage points >= 0, got {'test/accuracy': '1'}."),
    ],
    ids=["config-key", "base-group-key", "execution-key", "entry-group-key", "negative-tolerance", "text-tolerance"],
)
def test_regression_config_typos(tmp_path, change, message):
    with pytest.raises(FedbenchError) as err:
        load_config(write(tmp_path, {**REGRESSION, **change}))
    assert message in str(err.value)


def test_the_regression_set_is_parsed_once_into_typed_entries(tmp_path):
    spec = load_config(write(tmp_path, {**REGRESSION, "base": {"fed": {"rounds": 2}},
                                        "runs": [{"name": "a", "method": {"name": "fedavg"}},
                                                 {"name": "b", "seed": 1, "tolerance": {"test/accuracy": 0.2}}]}))
    assert spec.names == ["a", "b"] and spec.base == {"fed": {"rounds": 2}}
    assert (spec.entry("b").overrides, spec.tolerance_of("a"), spec.tolerance_of("b")) == (
        {"seed": 1}, {"test/accuracy": 1.0}, {"test/accuracy": 0.2})
    with pytest.raises(FedbenchError, match="No regression run named 'c'; known: a, b."):
        spec.entry("c")


def test_missing_spec_and_not_a_mapping(tmp_path):
    with pytest.raises(FedbenchError, match="Regression config '.*nope.yaml' not found."):
        load_config(str(tmp_path / "nope.yaml"))
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(FedbenchError, match="is a mapping of keys"):
        load_table_config(str(path))


def test_keys_come_from_the_dataclasses():
    assert set(OPTION_GROUPS) == {"data", "partition", "fed", "method"}
    assert execution_keys(RunConfig) == {"devices", "num_nodes", "accelerator", "threads", "output_dir", "checkpoint_dir",
                                         "checkpoint_every", "resume", "timeout", "save_final_state", "wandb",
                                         "wandb_project", "tensorboard", "progress"}
    # channels_last and compile can change a result's bits (issue 42): part of its identity, settable per entry
    assert ENTRY_KEYS == {"name", "tolerance", "data", "partition", "fed", "method", "seed", "precision", "gpu_math",
                          "channels_last", "compile"}
    d = RunConfig().to_dict()
    kept = result_config(d)
    assert set(kept) == {f.name for f in dataclasses.fields(RunConfig)} - execution_keys(RunConfig)
    assert "cache_dir" not in kept["data"] and kept["data"]["name"] == d["data"]["name"]


def test_run_config_merges_in_order_and_args_whole():
    cfg = run_config({"fed": {"rounds": 2}, "method": {"args": {"mu": 0.1, "x": 1}}},
                     {"fed": {"batch_size": 8}, "method": {"args": {"mu": 0.2}}}, {"seed": 3}, where="test")
    assert (cfg.fed.rounds, cfg.fed.batch_size, cfg.seed) == (2, 8, 3)
    assert cfg.method.args == {"mu": 0.2}  # a method's options are replaced, not merged
    assert canonical({"b": (1, 2), "a": {1: None}}) == {"a": {"1": None}, "b": [1, 2]}


def test_with_defaults_fills_only_options_added_since():
    """A stored result-config without a newer option (fed.protocol) equals today's; its own values,
    method.args and keys RunConfig no longer has are kept, so those still differ."""
    today = result_config(RunConfig().to_dict())
    old = {**today, "fed": {k: v for k, v in today["fed"].items() if k != "protocol"},
           "method": {**today["method"], "args": {"mu": 0.1}}}
    filled = with_defaults(old)
    assert canonical(filled) == canonical({**today, "method": {**today["method"], "args": {"mu": 0.1}}})
    assert with_defaults({**old, "seed": 7})["seed"] == 7
    assert with_defaults({**old, "gone": 1})["gone"] == 1
    assert with_defaults(None) is None
