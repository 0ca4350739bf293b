"""Issue 40, item 3: one partition key. A run's column (bench/tables/columns.py's ``run_column``) is what
W&B logs as ``partition_key`` and, through ``paper_partition``, the papers' key the table compares it with; the
protocol a run is scored on is one rule, ``RunConfig.scored_protocol``."""
from __future__ import annotations

import pytest
from conftest import REPO

from bench.assembly.config import RunConfig
from bench.reporting.paper_compare import own_partition_key
from bench.scheduling.table_runner import load_table_config, plan_runs
from bench.tables.columns import paper_partition, parse_column, run_column, table_columns
from bench.tables.protocols import partition_key
from bench.tracking.wandb_logger import column_key as wandb_key
from bench.tracking.wandb_logger import run_identity

TABLES = sorted((REPO / "configs" / "tables").glob("*.yaml"))


@pytest.mark.slow  # plans every table config: about 10 s
@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.stem)
def test_every_run_of_a_table_is_keyed_by_its_column(path):
    """W&B's key of a run names a column whose paper key is the run's paper key, and the table's column it
    fills has that same paper key (partition-independent rows aside: one run fills all their columns)."""
    spec = load_table_config(str(path))
    columns = {c.id: c for c in table_columns(spec)}
    runs = plan_runs(spec, check_records=False)
    assert runs
    for r in runs:
        key = wandb_key(r.cfg)
        assert paper_partition(key) == partition_key(r.cfg)
        for cid in ([] if r.row.partition_independent else r.columns):
            if columns[cid].paper_partition not in ("none", "average"):
                assert partition_key(r.cfg) == columns[cid].paper_partition, (path.stem, r.label, cid)
        column = parse_column(key) if key != "proportions" else None
        assert run_identity(r.cfg)["beta"] == (None if column is None else column.beta)


@pytest.mark.parametrize("partition,file,column,paper", [
    ({"scheme": "dirichlet", "args": {"beta": 0.05}}, None, "dirichlet-0.05", "dirichlet-0.05"),
    ({"scheme": "dirichlet_missing", "args": {"beta": 0.3}}, None, "dirichlet-classwise-0.3", "dirichlet-classwise"),
    ({"scheme": "natural"}, "ich_datasplit_10cl.npy", "dirichlet-classwise-file", "dirichlet-classwise"),
    ({"scheme": "lda", "args": {"beta": 0.1}}, None, "lda-0.1", "lda-0.1"),
    ({"scheme": "shards", "args": {"shards_per_client": 3}}, None, "shards-3", "shards-3"),
    ({"scheme": "iid"}, None, "iid", "iid"),
    ({"scheme": "proportions"}, None, "proportions", "proportions"),
])
def test_a_partition_names_its_column_and_paper_key(partition, file, column, paper):
    """Before, W&B keyed dirichlet_missing runs 'dirichlet_missing-0.3' and the published-split runs 'natural':
    names no table column has."""
    assert run_column(partition, file) == column and paper_partition(column) == paper
    cfg = RunConfig()
    for k, v in partition.items():
        setattr(cfg.partition, k, v)
    cfg.data.client_split_file = file
    assert wandb_key(cfg) == column and partition_key(cfg) == paper


@pytest.mark.parametrize("partition,key", [({"num_clients": 1, "scheme": "dirichlet", "args": {"beta": 0.1}}, "none"),
                                           ({"scheme": "shards"}, "shards-2"), ({"scheme": "natural"}, "natural"),
                                           ({"scheme": "dirichlet", "args": {"beta": 0.1}}, None),
                                           ({"scheme": "dirichlet_missing"}, None), ({"scheme": "proportions"}, None),
                                           ({}, None)])
def test_a_partition_independent_rows_own_partition_key(partition, key):
    assert own_partition_key(partition) == key


@pytest.mark.parametrize("fed,method,central,scored", [(None, "global", False, "global"),
                                                       (None, "per_client", False, "per_client"),
                                                       ("local_mean", "per_client", False, "local_mean"),
                                                       (None, "per_client", True, "global"),
                                                       ("global", "global", True, "global")])
def test_the_one_protocol_rule(fed, method, central, scored):
    cfg = RunConfig()
    cfg.fed.protocol = fed
    assert cfg.scored_protocol(method, central) == scored


def test_a_per_class_concentration_names_its_run_column_and_tags():
    """A Dirichlet beta given per class (FedNPR's ICH draws each class with its own, datamodules/partitions/
    dirichlet.py) is named by its values joined with '-', in the run name, its column and its W&B tag (no column
    kind names a per-class beta, so its papers' key is that column id too: it matches no published cell)."""
    from bench.tracking.wandb_logger import run_tags

    cfg = RunConfig()
    cfg.partition.scheme, cfg.partition.args = "dirichlet_missing", {"beta": [0.5, 0.3, 1.0]}
    assert "_dirmiss0.5-0.3-1_c10_" in cfg.run_name()
    assert wandb_key(cfg) == "dirichlet-classwise-0.5-0.3-1" and partition_key(cfg) == "dirichlet-classwise-0.5-0.3-1"
    cfg.partition.scheme = "dirichlet"
    assert "beta=0.5-0.3-1" in run_tags(cfg)
