"""FedNPR's components and compositions (issue 17). Table 4: FedNPR(-Per) without the balanced softmax
(``balanced_softmax: false``) or without NPR (``lam: 0``). Table 6: NPR added to FedBABU, FedRep and
FedRoD as registered methods, each one file composed on the per-client contract (the NPRegulariser
term gives the options and is added to the host's feature loss)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import max_state_diff, run_in_process
from test_fednpr import make_federation, model_as_loaded, npr_cfg, toy_context, toy_module

from lightning_modules.base import METHODS
from lightning_modules.components.balanced_softmax import balanced_softmax_loss, class_log_prior
from lightning_modules.components.npr import npr_loss, update_prototypes
from lightning_modules.fednpr import PROTOTYPES_KEY

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

HOSTS = {"fedbabu-npr": "fedbabu", "fedrep-npr": "fedrep", "fedrod-npr": "fedrod"}
FAST = {"fedbabu": {"finetune_epochs": 1}, "fedrep": {"head_epochs": 1}, "fedrod": {}}


def host_loss(name: str, module, ctx, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The host method's own loss on pooled features, written out independently."""
    if name == "fedrod-npr":
        generic = module.head(f)
        return (balanced_softmax_loss(generic, y, class_log_prior(ctx.labels, 10))
                + F.cross_entropy(generic.detach() + module.p_head(f.detach()), y))
    return F.cross_entropy(module.head(f), y)  # FedBABU (frozen head), FedRep's body phase


@pytest.mark.parametrize("name", HOSTS)
def test_objective_is_the_host_loss_plus_weighted_npr(name):
    module = toy_module(name, lam=0.5, num_subclusters=2)
    assert isinstance(module, METHODS.get(HOSTS[name]))
    ctx = toy_context(module)
    module.train()
    objective = module.client_objective(ctx)
    prototypes = ctx.state[PROTOTYPES_KEY]
    assert prototypes.shape == (10, 2, module.feature_dim)
    x, y = ctx.data.to_float(ctx.indices[:40])
    loss = objective((x, y))
    f = module.features(x)
    npr = npr_loss(f, y, prototypes)
    assert float(npr.detach()) > 1e-3
    assert torch.allclose(loss, host_loss(name, module, ctx, f, y) + 0.5 * npr, atol=1e-6)
    assert not torch.allclose(loss, host_loss(name, module, ctx, f, y), atol=1e-3)


@pytest.mark.parametrize("name", HOSTS)
def test_federated_shape_is_the_host_methods(tiny_cfg, name):
    fed = make_federation(npr_cfg(tiny_cfg, name, **{"method.args": {**FAST[HOSTS[name]], "num_subclusters": 2}}))
    want_personal = {"fedbabu-npr": [], "fedrep-npr": ["head.weight", "head.bias"],
                     "fedrod-npr": ["p_head.weight", "p_head.bias"]}[name]
    assert fed.personal == want_personal
    assert ("head.weight" in fed.shared) == (name == "fedrod-npr")  # FedBABU's frozen head, FedRep's own
    head = fed.module.head.weight.detach().clone()
    fed.run_round(0)
    assert all(fed.client_states[c][PROTOTYPES_KEY].shape == (10, 2, fed.module.feature_dim) for c in range(4))
    assert len(fed.client_metrics) == 4  # per client, as the host method
    if name == "fedbabu-npr":
        assert torch.equal(fed.module.head.weight, head)


def test_fedrep_npr_prototypes_come_from_the_received_model_before_the_head_phase(tiny_cfg):
    """The body phase's objective is built before the head phase: the prototypes are the Sinkhorn
    update on the eval-mode features of the model the client received (its head phase then moves the
    BatchNorm statistics, which would change them)."""
    fed = make_federation(npr_cfg(tiny_cfg, "fedrep-npr", **{"method.args": {"head_epochs": 2, "num_subclusters": 2}}))
    fed.run_round(0)
    before = {c: fed.client_states[c][PROTOTYPES_KEY].clone() for c in range(4)}
    received = {c: model_as_loaded(fed, c) for c in range(4)}
    fed.run_round(1)
    for c in range(4):
        fed.module.load_state_dict(received[c])
        fed.module.eval()
        idx = fed.clients[c].train
        with torch.no_grad():
            feats = fed.module.features(fed.data.to_float(idx)[0])
        expected = update_prototypes(feats, fed.data.labels[idx], before[c], 0.05, 100, "paper")
        assert torch.allclose(fed.client_states[c][PROTOTYPES_KEY], expected, atol=1e-5)
        assert (fed.client_states[c][PROTOTYPES_KEY] - before[c]).abs().max() > 1e-3


@pytest.mark.parametrize("name", HOSTS)
def test_without_npr_weight_it_is_the_host_method_exactly(tiny_cfg, name):
    host = HOSTS[name]
    base = {"fed.rounds": 2}
    rec_h, state_h = run_in_process(npr_cfg(tiny_cfg, host, experiment="host", **base, **{"method.args": FAST[host]}))
    rec_n, state_n = run_in_process(npr_cfg(tiny_cfg, name, experiment="npr", **base,
                                            **{"method.args": {**FAST[host], "lam": 0.0}}))
    assert max_state_diff(state_h, state_n) == 0.0
    assert [h["metrics"] for h in rec_h["history"]] == [h["metrics"] for h in rec_n["history"]]


# ---- Table 4: the component switches -----------------------------------------------------------
@pytest.mark.parametrize("name", ["fednpr", "fednpr-per"])
def test_without_balanced_softmax_the_classifier_learns_by_plain_ce(name):
    """balanced_softmax false: CE + lambda * NPR (the same prototypes); FedNPR without BSM is FedAvg+NPR."""
    with_bsm = toy_module(name, lam=0.5, num_subclusters=2)
    without = toy_module(name, lam=0.5, num_subclusters=2, balanced_softmax=False)
    fedavg_npr = toy_module("fedavg-npr", lam=0.5, num_subclusters=2)
    ctxs = [toy_context(m) for m in (with_bsm, without, fedavg_npr)]
    objectives = []
    for m, ctx in zip((with_bsm, without, fedavg_npr), ctxs):
        m.train()
        objectives.append(m.client_objective(ctx))
    protos = ctxs[1].state[PROTOTYPES_KEY]
    assert torch.equal(protos, ctxs[0].state[PROTOTYPES_KEY]) and torch.equal(protos, ctxs[2].state[PROTOTYPES_KEY])
    x, y = ctxs[0].data.to_float(ctxs[0].indices[:40])
    losses = [objective((x, y)) for objective in objectives]
    f = without.features(x)
    logits = without.head(f)
    npr = 0.5 * npr_loss(f, y, protos)
    assert torch.allclose(losses[1], F.cross_entropy(logits, y) + npr, atol=1e-6)
    assert torch.allclose(losses[0], balanced_softmax_loss(logits, y, class_log_prior(ctxs[0].labels, 10)) + npr,
                          atol=1e-6)
    assert abs(float((losses[0] - losses[1]).detach())) > 1e-3
    assert torch.equal(losses[1], losses[2])


def test_without_npr_weight_fednpr_is_the_balanced_softmax_alone():
    module = toy_module("fednpr-per", lam=0.0)
    ctx = toy_context(module)
    module.train()
    objective = module.client_objective(ctx)
    assert PROTOTYPES_KEY not in ctx.state  # never computed
    x, y = ctx.data.to_float(ctx.indices[:32])
    assert torch.allclose(objective((x, y)), balanced_softmax_loss(module(x), y, class_log_prior(ctx.labels, 10)))
