"""Records made before ``partition.args`` (when the scheme options were PartitionConfig's own fields: beta,
shards_per_client, min_size, missing_prob, shard_mode, proportions) keep working.

The golden names are the record names that d199b7f (the last commit with the flat layout) gave these planned runs:
``plan_runs(load_table_config(path))`` and ``entry_config(load_config(), name, ...)``, ``cfg.record_name()``
(the regression entry at the 4 rounds the set ran then: 2 since issue 41).
"""
from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import REPO

from bench.assembly.config import result_config
from bench.assembly.records import bare_record_path, find_record, run_record_path, same_result_config
from bench.commands.regression import entry_config, load_config
from bench.scheduling.table_runner import load_table_config, plan_runs

# (table config, row, column, seed) -> the record name d199b7f gave the run
BEFORE = {
    ("table2_kvasir", "FedAvg", "dirichlet-0.05", 0): "fedavg_kvasir_dir0.05_c10_s0_31cfb84f",
    ("fednpr_fashion-mnist", "FedNPR", "dirichlet-classwise-0.5", 0):
        "fednpr-d323c5d7_fashion-mnist_dirmiss0.5_c10_s0_90d0404b",
    ("fstcbdg_fashion-mnist", "FedAvg (CLIP-FC, supervised)", "shards-2", 0):
        "clip-fc_fashion-mnist_shards2pc_c100_s0_bf9bc4e4",
}
REGRESSION_BEFORE = {"fedbm": "fedbm-33db9e94_fashion-mnist_dir0.5_c4_s0_f6a1ae0f"}
# FST-CBDG's LDA run carried the table's base shard_mode (read by its shards columns only) in the flat layout
LDA_RUN = ("fstcbdg_fashion-mnist", "FedAvg (CLIP-FC, supervised)", "lda-0.1", 0)
LDA_RUN_BEFORE = "clip-fc_fashion-mnist_lda0.1_c100_s0_6ef7ba14"
LDA_FLAT_PARTITION = {"scheme": "lda", "num_clients": 100, "beta": 0.1, "shards_per_client": 2, "min_size": 10,
                      "missing_prob": 0.5, "shard_mode": "per_class", "proportions": None}


def planned(table: str, label: str, column: str, seed: int, output_dir: str):
    runs = plan_runs(load_table_config(str(REPO / "configs" / "tables" / f"{table}.yaml")), output_dir)
    return next(r for r in runs if (r.label, r.columns, r.seed) == (label, [column], seed))


@pytest.mark.parametrize("key", sorted(BEFORE))
def test_a_table_run_keeps_its_record_name(key, tmp_path):
    assert planned(*key, str(tmp_path)).cfg.record_name() == BEFORE[key]


@pytest.mark.parametrize("name", sorted(REGRESSION_BEFORE))
def test_a_regression_entry_keeps_its_record_name(name, tmp_path):
    spec = load_config()
    then = dataclasses.replace(spec, base={**spec.base, "fed": {**spec.base["fed"], "rounds": 4}})
    assert entry_config(then, name, str(tmp_path)).record_name() == REGRESSION_BEFORE[name]


def test_an_old_record_whose_run_carried_an_unread_option_is_still_found(tmp_path):
    run = planned(*LDA_RUN, str(tmp_path))
    cfg = run.cfg
    assert cfg.partition.args == {"beta": 0.1, "min_size": 10}  # the base's shard_mode is not an LDA option
    # its identity moved (the carried option counted in it), its name did not
    assert cfg.run_name() == LDA_RUN_BEFORE.rsplit("_", 1)[0] and cfg.record_name() != LDA_RUN_BEFORE
    old = {**cfg.to_dict(), "partition": LDA_FLAT_PARTITION}  # the config as d199b7f recorded it
    assert same_result_config({"config": old}, cfg)
    assert result_config(old)["partition"] == result_config(cfg.to_dict())["partition"]
    bare = bare_record_path(cfg)
    bare.parent.mkdir(parents=True)
    bare.write_text(json.dumps({"config": old, "final": {"test/accuracy": 50.0}}))
    assert find_record(cfg) == bare and not run_record_path(cfg).exists()  # found under the bare run name
    # a flat record of another run (another alpha) is not this run's
    other = {**old, "partition": {**LDA_FLAT_PARTITION, "beta": 0.5}}
    assert not same_result_config({"config": other}, cfg)
    bare.write_text(json.dumps({"config": other}))
    assert find_record(cfg) is None
