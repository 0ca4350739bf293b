"""Which rank trains which client (bench/placement.py) and how `devices: auto` lays a run over the
cores (bench/workers.py), issue 19."""
from __future__ import annotations

import pytest

from bench.config import RunConfig
from bench.placement import assign_clients
from bench.workers import auto_layout, clients_per_round
from lightning_modules.base import METHODS, NoClientState, UndeclaredClientStateError


def test_stateful_clients_stay_on_their_rank():
    assert assign_clients([0, 2, 4, 6, 1], [10] * 8, 2, movable=False) == [[0, 2, 4, 6], [1]]  # 4:1, as c % N


def test_stateless_clients_are_spread_by_samples():
    sampled, sizes = [0, 2, 4, 6, 1], [10, 40, 30, 5, 20, 9, 25, 1]
    ranks = assign_clients(sampled, sizes, 2, movable=True)
    assert sorted(c for r in ranks for c in r) == sorted(sampled)  # each client exactly once
    loads = [sum(sizes[c] for c in r) for r in ranks]
    # largest first onto the lighter rank: 1 (40) -> 0, 2 (30) -> 1, 6 (25) -> 1, 4 (20) -> 0, 0 (10) -> 1
    assert ranks == [[4, 1], [0, 2, 6]] and loads == [60, 65]  # by c % N: [0, 2, 4, 6] (85) and [1] (40)
    # equal sizes: 5 clients on 2 ranks split 3:2 (not 4:1), each list in sampled order
    assert assign_clients([0, 2, 4, 6, 1], [10] * 8, 2, movable=True) == [[0, 2, 6], [4, 1]]
    assert assign_clients([3, 5], [10] * 8, 1, movable=True) == [[3, 5]]


def test_methods_that_keep_client_state_declare_it():
    declared = {name for name in METHODS.names() if METHODS.get(name).keeps_client_state}
    assert {"scaffold", "feddyn", "moon", "fst-cbdg", "fednpr", "fednpr-per", "fedavg-npr"} <= declared
    assert not {"fedavg", "fedprox", "fedcb", "fedbm"} & declared
    state = NoClientState("fedavg")
    assert state.get("anything") is None and len(state) == 0
    for write in (lambda: state.__setitem__("c_local", 1), lambda: state.setdefault("x", 1),
                  lambda: state.update(prev=1)):
        with pytest.raises(UndeclaredClientStateError, match="keeps_client_state"):
            write()


def cfg(clients: int = 10, ratio: float = 0.5, threads: int | None = None, accelerator: str = "cpu") -> RunConfig:
    c = RunConfig()
    c.partition.num_clients, c.fed.sample_ratio, c.threads, c.accelerator = clients, ratio, threads, accelerator
    c.devices = "auto"
    return c


def test_auto_layout_uses_cores_as_client_workers():
    assert clients_per_round(cfg()) == 5 and clients_per_round(cfg(ratio=0.01)) == 1
    assert auto_layout(cfg(), False, 5, cores=2, can_launch=True)[:2] == (2, 1)
    assert auto_layout(cfg(), False, 5, cores=8, can_launch=True)[:2] == (5, 1)  # no idle rank
    assert auto_layout(cfg(threads=2), False, 5, cores=8, can_launch=True)[:2] == (4, 2)
    # one rank with the threads left to Lightning: one client, one core, or no way to relaunch the ranks
    assert auto_layout(cfg(), True, 1, cores=8, can_launch=True)[:2] == (1, None)
    assert auto_layout(cfg(), False, 5, cores=1, can_launch=True)[:2] == (1, None)
    ranks, threads, why = auto_layout(cfg(), False, 5, cores=2, can_launch=False)
    assert (ranks, threads) == (1, None) and "relaunch" in why
