"""Torch threads per rank do not depend on the rank count (issue 31, item 8).

The last session measured FedBM (generator every round, 7 clients, sampling 0.43, 3 rounds): --devices 2
and 3 agreed exactly, --devices 1 differed (one rank had both cores' threads, and intra-op threading
sums the generator's floats in another order). A run that trains several clients on a CPU now has one
thread per rank unless --threads is set, and a thread count other than 1 is part of its result identity.
"""
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO, cli_args, load_final_state, max_state_diff

from bench.assembly.config import RunConfig, result_config
from bench.assembly.records import same_result_config
from bench.assembly.workers import rank_threads

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out


def cpu_cfg(**top) -> RunConfig:
    cfg = RunConfig()
    cfg.accelerator = "cpu"
    for key, value in top.items():
        setattr(cfg, key, value)
    return cfg


def test_several_clients_on_a_cpu_get_one_thread_per_rank_whatever_the_devices():
    for devices in (1, 2, 3, "auto"):
        assert rank_threads(cpu_cfg(devices=devices), one_client=False) == 1
    assert rank_threads(cpu_cfg(threads=2), one_client=False) == 2  # asked for: kept
    assert rank_threads(cpu_cfg(), one_client=True) is None  # one client: one rank, every core
    assert rank_threads(cpu_cfg(accelerator="cuda"), one_client=False) is None  # GPU: threads do not sum its floats


def test_a_thread_count_other_than_one_is_part_of_the_result_identity():
    unset, one, two = cpu_cfg(), cpu_cfg(threads=1), cpu_cfg(threads=2)
    assert unset.result_identity() == one.result_identity() != two.result_identity()
    assert "threads" not in result_config(one.to_dict()) and result_config(two.to_dict())["threads"] == 2
    # a record written with 2 threads is not this 1-thread run's (tables rerun it instead of reusing it)
    assert same_result_config({"config": one.to_dict()}, unset)
    assert not same_result_config({"config": two.to_dict()}, unset)


def test_a_one_rank_run_sets_one_thread(tiny_cfg):
    from bench.assembly.experiment import resolve_run

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        cfg, layout = resolve_run(tiny_cfg(threads=None, devices=1, accelerator="cpu"), None)
        assert (cfg.threads, torch.get_num_threads()) == (1, 1)
        assert "1 torch thread per rank" in layout
    finally:
        torch.set_num_threads(before)


def run_default_threads(cfg) -> dict:
    """`fedbench run` as a user types it: no --threads and no OMP_NUM_THREADS (so torch would take
    both cores in a one-rank process); the record."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | {"PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "bench.cli", "run", *cli_args(cfg)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from bench.assembly.records import find_record

    return json.loads(find_record(cfg).read_text())


@pytest.mark.ddp
def test_default_layouts_of_one_and_two_ranks_give_the_same_fedbm_run(tiny_cfg):
    """The issue's case: FedBM training its generator every round, 7 clients, 3 of them per round."""
    common = {"method.name": "fedbm", "method.backbone": "simple-cnn", "partition.num_clients": 7,
              "fed.sample_ratio": 0.43, "threads": None,
              "method.args": {"gen_start": 1, "gen_every": 1, "gen_steps": 3, "gen_batch": 8,
                              "gen_base_channels": 8, "g_batch": 4}}
    one = run_default_threads(tiny_cfg(**common, experiment="one", devices=1))
    two = run_default_threads(tiny_cfg(**common, experiment="two", devices=2))
    assert (one["execution"]["ranks"], one["execution"]["threads_per_rank"]) == (1, 1)
    assert (two["execution"]["ranks"], two["execution"]["threads_per_rank"]) == (2, 1)
    assert [h["metrics"] for h in one["history"]] == [h["metrics"] for h in two["history"]]
    diff = max_state_diff(load_final_state(tiny_cfg(**common, experiment="one", devices=1)),
                          load_final_state(tiny_cfg(**common, experiment="two", devices=2)))
    assert diff <= 1e-6, f"1 vs 2 ranks in their default layouts differ by {diff}"  # as tests/engine/test_rank_invariance.py
    assert len(one["history"]) == 3 and all(len(h["clients"]) == 3 for h in one["history"])
