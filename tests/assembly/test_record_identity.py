"""Issue 27, part 1: no wrong comparison without a word. A record's name holds its whole result
configuration (runs of different budgets never replace each other; `fedbench run` says where its record
went and whether it replaced one), and options that never act in a run's rounds are warned about at the
start, in the record and in tables."""
from __future__ import annotations

import re

import pytest
from conftest import digits_run_argv, run_in_process

from bench.assembly.config import RunConfig
from bench.assembly.records import find_record, load_record, run_record_path, write_run_record
from bench.cli import main

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

CHEAP_GEN = {"gen_steps": 2, "gen_batch": 8, "gen_base_channels": 8, "g_batch": 5}


def test_every_result_option_is_part_of_the_record_name():
    base = RunConfig()
    names = {base.record_name()}
    for group, key, value in [("fed", "rounds", 2), ("fed", "local_epochs", 3), ("data", "max_train_samples", 500),
                              ("data", "image_size", 64), ("method", "lr", 0.5), ("fed", "lr_decay", 0.99),
                              ("precision", None, "64-true")]:
        cfg = RunConfig()
        if key is None:
            setattr(cfg, group, value)
        else:
            setattr(getattr(cfg, group), key, value)
        assert cfg.run_name() == base.run_name()  # the budget is not in the readable part
        names.add(cfg.record_name())
    assert len(names) == 8  # the default and 7 budgets/options: 8 distinct records
    assert re.fullmatch(r"fedavg_fashion-mnist_dir0\.5_c10_s0_[0-9a-f]{8}", base.record_name())


def test_execution_options_and_defaults_stated_explicitly_keep_the_name():
    base = RunConfig()
    other = RunConfig(devices=2, threads=1, progress=False, output_dir="/elsewhere", timeout=3.0, wandb=True)
    assert other.record_name() == base.record_name()
    explicit = RunConfig(gpu_math="strict")  # an option at its default (e.g. one added later) changes nothing
    explicit.fed.rounds = RunConfig().fed.rounds
    assert explicit.record_name() == base.record_name()


def test_a_short_try_does_not_replace_the_longer_runs_record(tmp_path, capsys):
    """`fedbench run` with 2 rounds and then 1 round of the same method, data and seed: two records, and
    each run prints its path; a rerun of the 1-round configuration says it replaced that record."""
    argv = digits_run_argv(tmp_path)
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main([*argv, "--fed.rounds", "1"]) == 0
    second = capsys.readouterr().out
    assert main([*argv, "--fed.rounds", "1"]) == 0
    third = capsys.readouterr().out
    folder = tmp_path / "runs" / "default"
    bare = folder / "fedavg_digits_dir0.5_c4_s0.json"  # the first run takes the bare run name
    assert len(load_record(bare)["history"]) == 2
    (other,) = [p for p in folder.glob("fedavg_digits_*.json") if p != bare]  # the second its identity name
    assert re.fullmatch(r"fedavg_digits_dir0\.5_c4_s0_[0-9a-f]{8}\.json", other.name)
    assert len(load_record(other)["history"]) == 1
    for out in (first, second):
        (line,) = [x for x in out.splitlines() if x.startswith("record: ")]
        assert line.endswith("(new)") and (tmp_path / "runs" / "default").as_posix() in line
    assert "(replaced the record of an earlier run of this configuration)" in third
    one_round = next(x for x in second.splitlines() if x.startswith("record: "))
    assert one_round.split()[1] in third


def test_fedbm_without_a_generator_round_warns_at_the_start_and_in_the_record(tiny_cfg, capsys, tmp_path):
    """FedBM with gen_start 5 in a 3-round run is FedCB: said on stdout before the rounds, stored in the
    record (tables show record warnings beside the cell); with gen_start 1 nothing is said."""
    text = str(tmp_path / "text")
    idle = tiny_cfg(**{"method.backbone": "simple-cnn", "partition.num_clients": 4, "fed.rounds": 3,
                       "fed.sample_ratio": 1.0, "method.name": "fedbm",
                       "method.args": {**CHEAP_GEN, "gen_start": 5, "text_cache_dir": text}})
    record, _ = run_in_process(idle)
    out = capsys.readouterr().out
    assert "FedBM's generator never acts" in out and "gen_start=5" in out and "fed.rounds=3" in out
    assert "at most 2" in out and "this run equals FedCB" in out
    assert any("FedBM's generator never acts" in w for w in record["warnings"])
    stored = load_record(find_record(idle))
    assert stored["warnings"] == record["warnings"]
    active = tiny_cfg(**{"method.backbone": "simple-cnn", "partition.num_clients": 4, "fed.rounds": 3,
                         "fed.sample_ratio": 1.0, "method.name": "fedbm",
                         "method.args": {**CHEAP_GEN, "gen_start": 2, "text_cache_dir": text}})
    record, _ = run_in_process(active)
    assert "never acts" not in capsys.readouterr().out and record["warnings"] == []


@pytest.mark.parametrize("milestones, warned", [([1, 5], [5]), ([1, 2], [])])
def test_lr_milestones_after_the_last_round_are_named(tiny_cfg, capsys, milestones, warned):
    record, _ = run_in_process(tiny_cfg(**{"fed.rounds": 3, "fed.lr_milestones": milestones}))
    late = [w for w in record["warnings"] if "lr_milestones" in w]
    if warned:
        assert late == [(f"fed.lr_milestones {warned} lie at or after the last round (fed.rounds=3): they never "
                         "change the lr. Drop them or run more rounds.")]
        assert late[0] in capsys.readouterr().out
    else:
        assert late == []


def test_records_of_two_configurations_never_replace_each_other(tmp_path):
    """write_run_record: the first configuration takes the bare run name, another the identity name;
    rewriting a configuration replaces only its own record; find_record finds each; a claimed bare name
    is never taken twice."""
    from bench.core.atomic_io import claim_json

    a, b = RunConfig(output_dir=str(tmp_path)), RunConfig(output_dir=str(tmp_path))
    b.fed.rounds = 2
    rec = lambda cfg, value: {"config": cfg.to_dict(), "value": value}
    assert write_run_record(a, rec(a, 1)) == (tmp_path / "default" / f"{a.run_name()}.json", False)
    assert write_run_record(b, rec(b, 2)) == (run_record_path(b), False)
    assert write_run_record(a, rec(a, 3))[1] is True and write_run_record(b, rec(b, 4))[1] is True
    assert load_record(find_record(a))["value"] == 3 and load_record(find_record(b))["value"] == 4
    assert sorted(p.name for p in (tmp_path / "default").iterdir()) == sorted([f"{a.run_name()}.json",
                                                                               f"{b.record_name()}.json"])
    assert not claim_json(tmp_path / "default" / f"{a.run_name()}.json", {"other": True})
    assert load_record(find_record(a))["value"] == 3
