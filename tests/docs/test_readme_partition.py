"""The README's "Adding a partition scheme" example runs as written: registered from its own file, it
partitions a real run (every class dealt evenly over the clients), `fedbench list` names it and a
typo of its name gets it suggested."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import readme_module, run_in_process

from bench.assembly.validation import validate_config
from bench.commands.listing import listing
from bench.core.errors import PartitionError
from bench.core.registry import UnknownNameError
from datamodules.partitions import PARTITION_SCHEMES


@pytest.fixture
def registered(monkeypatch, tmp_path):
    PARTITION_SCHEMES.names()  # load the built-in schemes, then register the example in a copy
    monkeypatch.setattr(PARTITION_SCHEMES, "_items", dict(PARTITION_SCHEMES._items))
    return readme_module("Adding a partition scheme", tmp_path, "class_round_robin")


def test_the_readme_scheme_partitions_a_run(registered, tiny_cfg):
    assert PARTITION_SCHEMES.get("class-round-robin") is registered.class_round_robin
    cfg = tiny_cfg(**{"partition.scheme": "class-round-robin", "partition.num_clients": 4, "fed.rounds": 1})
    assert cfg.partition.args == {}  # the tiny config's Dirichlet options are not this scheme's
    record, _ = run_in_process(cfg)
    counts = np.array(record["partition"]["counts"])  # [clients, classes]
    assert counts.shape == (4, 10) and counts.sum() == record["splits"]["train"]
    assert (counts.max(0) - counts.min(0)).max() <= 1  # every class dealt evenly
    shifted, _ = run_in_process(tiny_cfg(**{"partition.scheme": "class-round-robin", "partition.num_clients": 4,
                                            "fed.rounds": 1, "partition.args.first": 1, "experiment": "shifted"}))
    # its option: each class's first sample goes to client 1, so client 0's extra samples move one client on
    assert np.array_equal(np.array(shifted["partition"]["counts"]), np.roll(counts, 1, axis=0))
    assert record["partition"]["scheme"] == "class-round-robin"
    assert record["final"]["test/accuracy"] > 15.0  # it trained on those clients


def test_the_readme_scheme_is_listed_and_suggested(registered, tiny_cfg):
    shown = listing()
    assert "class-round-robin" in shown and "Each class shuffled, then dealt to the clients in turn" in shown
    assert "first=0" in shown  # its option, with its default
    cfg = tiny_cfg(**{"partition.scheme": "class-round-robn"})
    with pytest.raises(UnknownNameError, match="Did you mean 'class-round-robin'"):
        validate_config(cfg)
    cfg = tiny_cfg(**{"partition.scheme": "class-round-robin", "partition.args.frist": 1})
    with pytest.raises(PartitionError, match=r"unknown option\(s\) \['frist'\]; 'class-round-robin' takes: first \(int\)"):
        validate_config(cfg)
