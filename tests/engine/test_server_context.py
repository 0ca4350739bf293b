"""Issue 29, item 2: the server side is given what it needs (a ServerContext passed to the server hooks),
never injected into the module after construction."""
from __future__ import annotations

import pytest
import torch
from conftest import run_in_process

from bench.core.errors import FedbenchError
from bench.engine.federation import Federation
from lightning_modules.base import ServerContext
from lightning_modules.scaffold import Scaffold


def test_no_module_carries_injected_server_state(tiny_cfg, captured):
    run_in_process(tiny_cfg(**{"method.name": "scaffold", "fed.rounds": 1}))
    fed: Federation = captured["fed"]
    assert not hasattr(fed.module, "server_comm")
    assert fed.server == ServerContext(num_clients=6, is_server=True, broadcast=fed.server.broadcast)
    assert fed.server.broadcast({"x": 1}) == {"x": 1}  # one rank: rank 0's object as it is


def test_a_server_step_that_needs_the_context_says_so_without_it(tiny_cfg, captured):
    run_in_process(tiny_cfg(**{"method.name": "scaffold", "fed.rounds": 1}))
    module: Scaffold = captured["fed"].module
    extras = {f"dc.{n}": p.detach().clone() for n, p in module.controlled_parameters()}
    with pytest.raises(FedbenchError, match="Scaffold's server step needs its ServerContext"):
        module.server_step({}, extras, 0)
    before = {n: t.clone() for n, t in module.c_sum.items()}
    module.server_step({}, extras, 0, ServerContext(num_clients=4))
    for name, p in module.controlled_parameters():  # c = (sum of client corrections) / the context's clients
        expected = ((before[name] + extras[f"dc.{name}"]) / 4).to(p.dtype)
        assert torch.equal(module.c[name], expected)
