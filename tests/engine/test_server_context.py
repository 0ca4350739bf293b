"""The server side of a method is a part its module holds (issue 40, "a narrower method contract"): a
ServerPart (lightning_modules/server_part.py) with the upload shapes, the server step, per-round scalars and
the checkpointed state, always given the run's ServerContext (issue 29, item 2: never injected into the
module after construction)."""
from __future__ import annotations

import inspect

import pytest
import torch
from conftest import run_in_process

from bench.engine.federation import Federation
from lightning_modules.base import METHODS, FederatedModule, ServerContext
from lightning_modules.fedproto import FedProtoServer
from lightning_modules.scaffold import Scaffold, ScaffoldServer
from lightning_modules.server_part import ServerPart

OLD_HOOKS = ("upload_shapes", "server_step", "round_scalars", "server_state", "load_server_state")


def test_no_module_carries_injected_server_state(tiny_cfg, captured):
    run_in_process(tiny_cfg(**{"method.name": "scaffold", "fed.rounds": 1}))
    fed: Federation = captured["fed"]
    assert not hasattr(fed.module, "server_comm")
    assert fed.server == ServerContext(num_clients=6, is_server=True, broadcast=fed.server.broadcast)
    assert fed.server.broadcast({"x": 1}) == {"x": 1}  # one rank: rank 0's object as it is
    assert type(fed.module.server_side) is ScaffoldServer and fed.module.server_side.module is fed.module


def test_the_server_step_divides_by_the_contexts_clients(tiny_cfg, captured):
    run_in_process(tiny_cfg(**{"method.name": "scaffold", "fed.rounds": 1}))
    module: Scaffold = captured["fed"].module
    server = module.server_side
    extras = {f"dc.{n}": p.detach().clone() for n, p in module.controlled_parameters()}
    with pytest.raises(TypeError):  # the context is a required argument, never optional
        server.step({}, extras, 0)
    before = {n: t.clone() for n, t in server.c_sum.items()}
    server.step({}, extras, 0, ServerContext(num_clients=4))
    for name, p in module.controlled_parameters():  # c = (sum of client corrections) / the context's clients
        expected = ((before[name] + extras[f"dc.{name}"]) / 4).to(p.dtype)
        assert torch.equal(server.c[name], expected)
    assert not hasattr(module, "c_sum") and not hasattr(module, "c")  # the state is the part's


def test_no_method_defines_the_old_server_hooks_and_the_part_has_five():
    assert not any(hasattr(FederatedModule, name) for name in OLD_HOOKS)
    for name in METHODS.names():
        cls = METHODS.get(name)
        assert not any(hasattr(cls, hook) for hook in OLD_HOOKS), f"{name} still defines a server hook"
    hooks = {n for n, _ in inspect.getmembers(ServerPart, inspect.isfunction) if not n.startswith("_")}
    assert hooks == {"upload_shapes", "step", "scalars", "state", "load_state"}
    assert list(inspect.signature(ServerPart.step).parameters) == ["self", "global_state", "extras", "round_idx",
                                                                   "server"]
    assert inspect.signature(ServerPart.step).parameters["server"].default is inspect.Parameter.empty


def test_a_parts_state_round_trips_through_a_checkpoint(tiny_cfg, captured):
    run_in_process(tiny_cfg(**{"method.name": "fedproto", "fed.rounds": 2}))
    module = captured["fed"].module
    part: FedProtoServer = module.server_side
    assert part.prototypes_ready and bool(part.has_prototype.all())
    fresh = FedProtoServer(module)
    assert not fresh.prototypes_ready
    fresh.load_state(part.state(), ServerContext(num_clients=6))
    assert torch.equal(fresh.global_prototypes, part.global_prototypes) and fresh.prototypes_ready
