"""Baselines, part A (issue 6): each method's distinctive mechanism on digits with the small CNN.

FedDyn, Scaffold, MOON, FedRep, FedRoD, FedBABU, FedNH, FedProto. Runs go through the real
orchestrator (``run_in_process``) with the Federation object captured, so client states and
server states can be compared with what the papers' update rules say they must be.
"""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from conftest import kill_and_resume, run_in_process

from bench.core.batches import DeviceData
from bench.engine.federation import Federation
from lightning_modules.base import ClientContext
from lightning_modules.components.state import substate
from lightning_modules.fedbabu import FedBABU
from lightning_modules.feddyn import FedDyn
from lightning_modules.fednh import FedNHServer
from lightning_modules.fedproto import FedProto, FedProtoServer
from lightning_modules.fedrep import FedRep
from lightning_modules.fedrod import FedRoD
from lightning_modules.moon import Moon
from lightning_modules.scaffold import Scaffold
from lightning_modules.server_part import ServerContext

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

SMALL = {"method.backbone": "simple-cnn", "partition.num_clients": 4, "fed.rounds": 2, "fed.sample_ratio": 1.0}


def run(tiny_cfg, captured, **overrides) -> Federation:
    run_in_process(tiny_cfg(**{**SMALL, **overrides}))
    return captured["fed"]


def clone(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in state.items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def params(module, prefix: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters() if n.startswith(prefix + ".")}


def hand_context(module, labels: list[int], round_idx: int = 0, client: int = 0) -> ClientContext:
    """A client context on random 8x8 images, as the orchestrator would build it."""
    gen = torch.Generator().manual_seed(1)
    y = torch.tensor(labels)
    data = DeviceData(torch.randint(0, 256, (len(y), 1, 8, 8), generator=gen, dtype=torch.uint8), y,
                      torch.tensor([0.3]).view(1, 1, 1, 1), torch.tensor([0.37]).view(1, 1, 1, 1))
    glob = {k: module.state_dict()[k].clone() for k in module.shared_keys()}
    return ClientContext(client_id=client, round_idx=round_idx, seed=0, data=data, indices=torch.arange(len(y)),
                         num_classes=module.num_classes, global_state=glob, generator=torch.Generator().manual_seed(2))


# ---- Scaffold ------------------------------------------------------------------------------
@pytest.mark.parametrize("ratio,rounds", [(1.0, 3), (0.5, 1)])
def test_scaffold_server_control_variate_is_the_mean_over_all_clients(tiny_cfg, captured, ratio, rounds):
    """c = (1/N) sum_i c_i over all N clients (c moves by (|S|/N) mean_S(delta c_i) each round): after
    one round with half of the clients, c is half the mean of the two clients' c_i."""
    fed = run(tiny_cfg, captured, **{"method.name": "scaffold", "fed.sample_ratio": ratio, "fed.rounds": rounds})
    module: Scaffold = fed.module
    seen = [c for c, s in fed.client_states.items() if "c_local" in s]
    assert len(seen) == len({c for h in fed.history for c in h["clients"]}) == (4 if ratio == 1.0 else 2)
    for name, _ in module.controlled_parameters():
        total = torch.stack([fed.client_states[c]["c_local"][name] for c in seen]).sum(0)
        torch.testing.assert_close(module.server_side.c[name], total / 4, atol=1e-6, rtol=1e-5)  # N = 4, not len(seen)
    assert sum(float(t.abs().sum()) for t in module.server_side.c.values()) > 0  # the variates did move


def constant_gradient_objective(g: dict[str, torch.Tensor], params: dict[str, torch.nn.Parameter]):
    """A client_objective whose loss has the constant gradient g: sum_n <g_n, p_n>."""
    return lambda ctx: lambda batch: sum((g[n] * p).sum() for n, p in params.items())


def test_scaffold_option_two_recovers_a_constant_gradient_under_momentum():
    """c_i+ = c_i - c + (x - y)/(K lr): with a constant gradient g and c = c_i = 0 it must equal g,
    for plain and heavy-ball SGD alike (K lr generalised to the momentum displacement)."""
    for momentum in (0.0, 0.9):
        module = Scaffold(num_classes=3, in_channels=1, backbone="simple-cnn", momentum=momentum, weight_decay=0.0)
        ctx = hand_context(module, [0, 1, 2, 0] * 5)
        ctx.lr, ctx.batch_size, ctx.local_epochs = 0.05, 4, 1  # K = 5 local steps
        g = {n: torch.randn_like(p) for n, p in module.controlled_parameters()}
        module.client_objective = constant_gradient_objective(g, dict(module.controlled_parameters()))
        module.train()
        batches = module.client_batches(ctx)
        assert len(batches) == 5
        module.local_update(ctx, batches)
        for n, _ in module.controlled_parameters():
            torch.testing.assert_close(ctx.state["c_local"][n], g[n], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(ctx.uploads[f"dc.{n}"], g[n], atol=1e-5, rtol=1e-4)


# ---- FedDyn --------------------------------------------------------------------------------
def test_feddyn_server_h_and_model_follow_the_update_rule():
    alpha = 0.5
    module = FedDyn(num_classes=3, in_channels=1, backbone="simple-cnn", alpha=alpha)
    names = [n for n, _ in module.dynamic_parameters()]
    state = {k: v.clone() for k, v in module.state_dict().items() if k in module.shared_keys()}
    theta0 = {n: state[n].clone() for n in names}
    bn = next(k for k in state if k.endswith("running_mean"))
    gen = torch.Generator().manual_seed(0)
    d0 = {n: torch.randn(state[n].shape, generator=gen) for n in names}
    d1 = {n: torch.randn(state[n].shape, generator=gen) for n in names}

    glob = {k: v.clone() for k, v in state.items()}
    for n in names:
        glob[n] = theta0[n] + d0[n]  # the round's average
    running_mean = glob[bn].clone()
    module.server_side.step(glob, {}, 0, ServerContext(1))
    for n in names:  # h = -alpha d0;  theta1 = avg - h / alpha = theta0 + 2 d0
        torch.testing.assert_close(module.server_side.h[n], -alpha * d0[n])
        torch.testing.assert_close(glob[n], theta0[n] + 2 * d0[n])
    assert torch.equal(glob[bn], running_mean)  # buffers are only averaged

    theta1 = {n: glob[n].clone() for n in names}
    for n in names:
        glob[n] = theta1[n] + d1[n]
    module.server_side.step(glob, {}, 1, ServerContext(1))
    for n in names:  # h = -alpha (d0 + d1);  theta2 = avg + d0 + d1
        torch.testing.assert_close(module.server_side.h[n], -alpha * (d0[n] + d1[n]))
        torch.testing.assert_close(glob[n], theta1[n] + d1[n] + d0[n] + d1[n])

    restored = FedDyn(num_classes=3, in_channels=1, backbone="simple-cnn", alpha=alpha)
    restored.server_side.load_state(module.server_side.state(), ServerContext(1))
    assert same(restored.server_side.h, module.server_side.h) and same(restored.server_side.previous_global, module.server_side.previous_global)


def test_feddyn_client_linear_term_and_gradient_correction(tiny_cfg, captured, monkeypatch):
    trained: dict[int, dict[str, torch.Tensor]] = {}
    original_end = FedDyn.on_client_end

    def end(self, ctx):
        trained[ctx.client_id] = params(self, "backbone") | params(self, "head")
        return original_end(self, ctx)

    monkeypatch.setattr(FedDyn, "on_client_end", end)
    fed = run(tiny_cfg, captured, **{"method.name": "feddyn", "fed.rounds": 1, "method.args": {"alpha": 0.1}})
    theta0 = captured["initial_state"]
    for c, state in fed.client_states.items():  # after one participation: g_k = -alpha (theta_k - theta0)
        for n, memory in state["grad_memory"].items():
            torch.testing.assert_close(memory, -0.1 * (trained[c][n] - theta0[n]))

    # the local gradient is corrected by -g_k + alpha (theta - theta^{t-1})
    module: FedDyn = fed.module
    ctx = hand_context(module, [0, 1, 2, 3])
    ctx.state["grad_memory"] = {n: torch.randn_like(p) for n, p in module.dynamic_parameters()}
    correct, _ = module.dynamic_regulariser(ctx)
    with torch.no_grad():
        for _, p in module.dynamic_parameters():
            p.add_(0.01)
    for _, p in module.dynamic_parameters():
        p.grad = torch.zeros_like(p)
    correct()
    for n, p in module.dynamic_parameters():
        expected = 0.1 * (p.detach() - ctx.global_state[n]) - ctx.state["grad_memory"][n]
        torch.testing.assert_close(p.grad, expected)


# ---- MOON ----------------------------------------------------------------------------------
def test_moon_negative_is_the_clients_previous_local_model(tiny_cfg, captured, monkeypatch):
    negatives, positives, ends = {}, {}, {}
    original_refs, original_end = Moon.reference_models, Moon.on_client_end

    def refs(self, ctx):
        positive, negative = original_refs(self, ctx)
        key = (ctx.client_id, ctx.round_idx)
        negatives[key] = None if negative is None else clone(substate(negative.state, "backbone"))
        positives[key] = clone(substate(positive.state, "backbone"))
        return positive, negative

    def end(self, ctx):
        ends[(ctx.client_id, ctx.round_idx)] = clone(self.backbone.state_dict())
        return original_end(self, ctx)

    monkeypatch.setattr(Moon, "reference_models", refs)
    monkeypatch.setattr(Moon, "on_client_end", end)
    fed = run(tiny_cfg, captured, **{"method.name": "moon", "fed.sample_ratio": 0.5, "fed.rounds": 4})
    checked = 0
    for c in range(4):
        rounds = sorted(r for (cc, r) in ends if cc == c)
        if not rounds:
            continue
        assert negatives[(c, rounds[0])] is None  # first participation: no previous model yet
        for before, now in itertools.pairwise(rounds):
            assert same(negatives[(c, now)], ends[(c, before)])  # its own model at the end of its last round
            assert not same(negatives[(c, now)], positives[(c, now)])  # not the received global model
            checked += 1
        assert same(substate(fed.client_states[c]["previous"], "backbone"), ends[(c, rounds[-1])])
    assert checked >= 1


def test_moon_contrastive_loss_matches_the_formula():
    module = Moon(num_classes=3, in_channels=1, backbone="simple-cnn", temperature=0.5)
    gen = torch.Generator().manual_seed(0)
    z, zg, zp = (torch.randn(5, 8, generator=gen) for _ in range(3))
    pos = torch.exp(F.cosine_similarity(z, zg) / 0.5)
    neg = torch.exp(F.cosine_similarity(z, zp) / 0.5)
    torch.testing.assert_close(module.contrastive_loss(z, zg, zp), (-torch.log(pos / (pos + neg))).mean())


# ---- FedRep --------------------------------------------------------------------------------
def test_fedrep_trains_the_head_then_the_body(tiny_cfg, captured, monkeypatch):
    phases: list[dict] = []
    original_head, original_end = FedRep.train_head, FedRep.on_client_end

    def train_head(self, ctx):
        before_head, before_body = params(self, "head"), params(self, "backbone")
        steps = original_head(self, ctx)
        phases.append({"client": ctx.client_id, "round": ctx.round_idx, "steps": steps,
                       "received_body": clone(substate(ctx.global_state, "backbone")),
                       "before_head": before_head, "before_body": before_body,
                       "after_head": params(self, "head"), "after_body": params(self, "backbone")})
        return steps

    def end(self, ctx):
        phases[-1].update(end_head=params(self, "head"), end_body=params(self, "backbone"))
        return original_end(self, ctx)

    monkeypatch.setattr(FedRep, "train_head", train_head)
    monkeypatch.setattr(FedRep, "on_client_end", end)
    fed = run(tiny_cfg, captured, **{"method.name": "fedrep", "method.args": {"head_epochs": 2}})
    assert not any(k.startswith("head.") for k in fed.global_state)  # the head is never aggregated
    assert len(phases) == 8
    for ph in phases:
        received = {f"backbone.{k}": v for k, v in ph["received_body"].items() if f"backbone.{k}" in ph["before_body"]}
        assert same(ph["before_body"], received)  # head phase first: no body step before it
        assert ph["steps"] > 0 and not same(ph["after_head"], ph["before_head"])  # phase 1 moves the head...
        assert same(ph["after_body"], ph["before_body"])  # ...and not the body
        assert same(ph["end_head"], ph["after_head"])  # phase 2 leaves the head...
        assert not same(ph["end_body"], ph["after_body"])  # ...and trains the body
    for c in range(4):  # the personal head carries over to the client's next round
        first, second = [ph for ph in phases if ph["client"] == c]
        assert same(second["before_head"], first["end_head"])
        stored = {k: v for k, v in fed.client_states[c]["personal"].items()}
        assert same(stored, second["end_head"])


# ---- FedBABU -------------------------------------------------------------------------------
def test_fedbabu_head_stays_at_init_and_finetuning_never_leaks(tiny_cfg, captured, monkeypatch):
    checks: list[tuple[bool, bool]] = []
    original_eval, original_finetune = FedBABU.evaluate_client, FedBABU.finetune
    tuned: list[bool] = []

    def finetune(self, ctx):
        head = params(self, "head")
        steps = original_finetune(self, ctx)
        tuned.append(steps > 0 and not same(params(self, "head"), head))
        return steps

    def evaluate_client(self, ctx, evaluate):
        before = clone(self.state_dict())
        scores = original_eval(self, ctx, evaluate)
        checks.append((same(before, clone(self.state_dict())), "test/accuracy" in scores))
        return scores

    monkeypatch.setattr(FedBABU, "finetune", finetune)
    monkeypatch.setattr(FedBABU, "evaluate_client", evaluate_client)
    fed = run(tiny_cfg, captured, **{"method.name": "fedbabu", "method.args": {"finetune_epochs": 1}})
    initial = captured["initial_state"]
    assert not any(k.startswith("head.") for k in fed.global_state)  # never aggregated
    final = fed.module.state_dict()
    assert torch.equal(final["head.weight"], initial["head.weight"]) and torch.equal(final["head.bias"], initial["head.bias"])
    assert not torch.equal(fed.global_state["backbone.body.0.weight"], initial["backbone.body.0.weight"])  # body trains
    assert len(tuned) == 8 and all(tuned)  # evaluation fine-tuned the head of every client...
    assert all(restored and scored for restored, scored in checks)  # ...and the uploaded state is the untuned one
    assert fed.history[-1]["metrics"]["test/accuracy"] >= 0  # per-client scores are tabulated


# ---- FedRoD --------------------------------------------------------------------------------
def test_fedrod_generic_head_balanced_softmax_and_detached_personal_head():
    torch.manual_seed(0)
    module = FedRoD(num_classes=4, in_channels=1, backbone="simple-cnn", gamma=2.0)
    assert "p_head.weight" in module.personal_keys() and "p_head.weight" not in module.shared_keys()
    assert "head.weight" in module.shared_keys()
    labels = [0] * 6 + [1] * 3 + [2]  # class 3 absent on this client
    ctx = hand_context(module, labels)
    objective = module.client_objective(ctx)
    x, y = ctx.data.to_float(ctx.indices)
    module.zero_grad()
    objective((x, y)).backward()
    got = {n: p.grad.clone() for n, p in module.named_parameters()}

    freq = torch.bincount(torch.tensor(labels), minlength=4).double() / len(labels)
    log_prior = 2.0 * torch.log(freq + 1e-9).float()  # gamma-th power of the class counts
    module.zero_grad()
    f = module.features(x)
    F.cross_entropy(module.head(f) + log_prior, y).backward()
    for n, p in module.named_parameters():
        if not n.startswith("p_head."):  # body and generic head: the balanced softmax alone
            torch.testing.assert_close(got[n], p.grad, atol=1e-6, rtol=1e-5)
    module.zero_grad()
    f = module.features(x).detach()
    F.cross_entropy(module.head(f).detach() + module.p_head(f), y).backward()
    for n, p in module.p_head.named_parameters():  # personal head: CE on generic + personal logits
        torch.testing.assert_close(got[f"p_head.{n}"], p.grad, atol=1e-6, rtol=1e-5)

    module.eval()
    with torch.no_grad():
        f = module.features(x)
        torch.testing.assert_close(module.eval_logits(x), module.head(f) + module.p_head(f))


# ---- FedNH ---------------------------------------------------------------------------------
def test_fednh_prototypes_unit_norm_and_rho_smoothing(tiny_cfg, captured, monkeypatch):
    steps: list[dict] = []
    original = FedNHServer.step

    def server_step(self, global_state, extras, round_idx, server):
        before = self.module.head.prototypes.clone()
        original(self, global_state, extras, round_idx, server)
        steps.append({"before": before, "after": self.module.head.prototypes.clone(),
                      "sum": extras["proto_sum"].clone(), "count": extras["proto_count"].clone()})

    monkeypatch.setattr(FedNHServer, "step", server_step)
    fed = run(tiny_cfg, captured, **{"method.name": "fednh", "fed.sample_ratio": 0.5, "fed.rounds": 3})
    w0 = captured["initial_state"]["head.prototypes"]
    torch.testing.assert_close(w0 @ w0.T, torch.eye(10), atol=1e-5, rtol=0)  # spread: orthonormal rows
    assert "head.prototypes" not in fed.global_state  # computed by the server, never averaged
    for r, st in enumerate(steps):
        sampled = fed.history[r]["clients"]
        labels = fed.data.labels
        expected_counts = sum(torch.bincount(labels[fed.clients[c].train], minlength=10) for c in sampled)
        assert torch.equal(st["count"].long(), expected_counts)
        seen = st["count"] > 0
        mu = F.normalize(st["sum"][seen] / st["count"][seen, None], dim=1).float()
        expected = F.normalize(0.9 * st["before"][seen] + 0.1 * mu, dim=1)
        torch.testing.assert_close(st["after"][seen], expected, atol=1e-6, rtol=1e-5)
        assert torch.equal(st["after"][~seen], st["before"][~seen])
        torch.testing.assert_close(st["after"].norm(dim=1), torch.ones(10), atol=1e-6, rtol=0)
        assert not torch.equal(st["after"], st["before"])
    assert torch.equal(fed.module.state_dict()["head.prototypes"], steps[-1]["after"])


# ---- FedProto ------------------------------------------------------------------------------
def test_fedproto_uploads_class_means_and_averages_them(tiny_cfg, captured, monkeypatch):
    uploads: dict[int, list[dict]] = {}
    original_end, original_step = FedProto.on_client_end, FedProtoServer.step
    globals_after: list[torch.Tensor] = []

    def end(self, ctx):
        original_end(self, ctx)
        extras = ctx.uploads
        self.eval()
        with torch.no_grad():
            x, y = ctx.data.to_float(ctx.indices)
            f = self.features(x)
        self.train()
        for k in range(self.num_classes):  # by hand: the mean feature of each class of the client
            if (y == k).any():
                torch.testing.assert_close(extras["proto_sum"][k] / extras["proto_count"][k], f[y == k].mean(0),
                                           atol=1e-5, rtol=1e-4)
                assert extras["proto_count"][k] == (y == k).sum()
            else:
                assert extras["proto_count"][k] == 0
        uploads.setdefault(ctx.round_idx, []).append(clone(extras))

    def server_step(self, global_state, extras, round_idx, server):
        original_step(self, global_state, extras, round_idx, server)
        globals_after.append(self.global_prototypes.clone())

    monkeypatch.setattr(FedProto, "on_client_end", end)
    monkeypatch.setattr(FedProtoServer, "step", server_step)
    fed = run(tiny_cfg, captured, **{"method.name": "fedproto"})
    assert fed.shared == []  # no weights travel, only prototypes
    for r, ups in uploads.items():  # global prototype = sample-weighted mean of the local class means
        total = sum(u["proto_sum"].double() for u in ups)
        count = sum(u["proto_count"].double() for u in ups)
        seen = count > 0
        torch.testing.assert_close(globals_after[r][seen].double(), total[seen] / count[seen, None], atol=1e-5, rtol=1e-5)
    assert bool(fed.module.server_side.has_prototype.all())
    assert fed.history[-1]["metrics"]["test/accuracy"] > 0


# ---- server state survives a kill ----------------------------------------------------------
@pytest.mark.parametrize("method", ["feddyn", "scaffold", "fednh", "fedproto"])
def test_server_state_resumes_exactly(tiny_cfg, method):
    """FedDyn's h, Scaffold's c, FedNH's and FedProto's prototypes are checkpointed: a run killed
    after round 2 of 3 and resumed ends exactly where an uninterrupted run does."""
    base = {**SMALL, "method.name": method, "fed.rounds": 3, "fed.sample_ratio": 0.5, "checkpoint_every": 1}
    kill_and_resume(tiny_cfg, base)
