"""Golden values of the baselines (issue 37): numbers recorded by running the baselines' public code (its own
functions, on tiny seeded inputs, outside this repository) and our implementation run on the same inputs.

tests/golden/<method>.json holds, per entry, the inputs, the reference outputs and the repository, commit,
file and function they came from. Every test runs OUR function (the method module's objective, head,
upload or server step) in float64. Where we depart from the reference on purpose (docs/departures.md),
the test shows which variant of ours reproduces the reference and that the default differs by the stated
amount, so a silent change either way fails.

The tiny model of the FedETF-framework entries mirrors that framework's model interface: a one-layer body
out = relu(body(x)) (our backbone), ``linear_head`` (our linear head), ``linear_proto`` + ``scaling_train``
(FedETF's projection and temperature).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench.core.batches import DeviceData
from bench.engine.aggregation import RoundBuffer
from lightning_modules.base import ClientContext
from lightning_modules.server_part import ServerContext

GOLDEN = Path(__file__).parents[1] / "golden"
T = torch.float64


def golden(method: str) -> dict[str, dict]:
    data = json.loads((GOLDEN / f"{method}.json").read_text())
    return {e["name"]: e for e in data["entries"]}


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=T)


def state_of(d: dict) -> dict[str, torch.Tensor]:
    return {k: t(v) for k, v in d.items()}


def batches_of(entry_batches: list[dict]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(t(b["x"]), torch.tensor(b["y"])) for b in entry_batches]


def close(a: torch.Tensor, b: torch.Tensor, tol: float) -> None:
    torch.testing.assert_close(a.to(T), b.to(T), atol=tol, rtol=0)


def build(cls, ref_state: dict[str, torch.Tensor], head: nn.Module | None = None, **kwargs):
    """Our method module in float64 with the reference model's body as backbone and (default) its
    ``linear_head`` as head."""
    body = ref_state["body.weight"]
    num_classes = ref_state["linear_head.weight"].shape[0]
    module = cls(num_classes=num_classes, in_channels=1, backbone="simple-cnn", **kwargs)
    module.backbone = nn.Sequential(nn.Linear(body.shape[1], body.shape[0]), nn.ReLU())
    module.feature_dim = body.shape[0]
    module.head = nn.Linear(body.shape[0], num_classes) if head is None else head
    module.to(T)  # before loading: the reference's float64 values are kept exactly
    if head is None:
        module.head.load_state_dict({"weight": ref_state["linear_head.weight"], "bias": ref_state["linear_head.bias"]})
    module.backbone[0].load_state_dict({"weight": body, "bias": ref_state["body.bias"]})
    return module


def context(module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> ClientContext:
    """The client of these batches (its class counts are those of the batches)."""
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    data = DeviceData(x, y, torch.zeros(1, dtype=T), torch.ones(1, dtype=T))
    glob = {k: v.detach().clone() for k, v in module.state_dict().items() if k in module.shared_keys()}
    return ClientContext(client_id=0, round_idx=0, seed=0, data=data, indices=torch.arange(len(y)),
                         num_classes=module.num_classes, global_state=glob, generator=torch.Generator().manual_seed(0))


def sgd_steps(objective, optimizer, batches, after_backward=None) -> float:
    """One optimizer step per batch, as the reference loops do; returns the mean loss."""
    total = 0.0
    for batch in batches:
        optimizer.zero_grad()
        loss = objective(batch)
        loss.backward()
        if after_backward is not None:
            after_backward()
        optimizer.step()
        total += loss.item()
    return total / len(batches)


def reference_sgd(params) -> torch.optim.Optimizer:
    """The FedETF framework's client optimizer (utils.py init_optimizer with the entries' lr)."""
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=5e-4)


def assert_body_and_head(module, ref: dict[str, torch.Tensor], tol: float, head: str = "linear_head") -> None:
    close(module.backbone[0].weight, ref["body.weight"], tol)
    close(module.backbone[0].bias, ref["body.bias"], tol)
    if head:
        close(module.head.weight, ref[f"{head}.weight"], tol)
        close(module.head.bias, ref[f"{head}.bias"], tol)


def ours_name(ref_name: str) -> str:
    """The reference tiny model's parameter names -> ours (body -> backbone.0, linear_head -> head)."""
    return ref_name.replace("body.", "backbone.0.").replace("linear_head.", "head.")


BODY_HEAD = ("body.weight", "body.bias", "linear_head.weight", "linear_head.bias")


# ---- FedAvg ----------------------------------------------------------------------------------
def test_fedavg_weighted_aggregation_matches_fedetf_framework():
    e = golden("fedavg")["weighted_aggregation"]
    clients = [state_of(c["state"]) for c in e["inputs"]["clients"]]
    buf = RoundBuffer({k: v.shape for k, v in clients[0].items()}, {}, "cpu")
    for state, weight in zip(clients, e["inputs"]["size_weights"]):
        buf.add_client(state, weight, {})
    avg = buf.averaged_state()
    for k, v in state_of(e["outputs"]["central"]).items():
        close(avg[k], v, e["tolerance"])


# ---- FedETF ----------------------------------------------------------------------------------
def test_fedetf_etf_matrix_matches_proto_classifier():
    from lightning_modules.fedetf import etf_from_basis

    e = golden("fedetf")["etf_matrix"]
    close(etf_from_basis(t(e["inputs"]["P"])), t(e["outputs"]["proto"]), e["tolerance"])


@pytest.mark.parametrize("case", ["client_step_absent_classes", "client_step_all_classes"])
def test_fedetf_balanced_feature_loss_step_matches_client_fedetf(case):
    from lightning_modules.fedetf import ETFHead, FedETF

    e = golden("fedetf")[case]
    ref, out = state_of(e["inputs"]["state"]), state_of(e["outputs"]["state"])
    head = ETFHead(ref["body.weight"].shape[0], ref["linear_proto.weight"].shape[0], ref["linear_proto.weight"].shape[0], 0)
    module = build(FedETF, ref, head=head)
    head.projection.load_state_dict({"weight": ref["linear_proto.weight"], "bias": ref["linear_proto.bias"]})
    with torch.no_grad():
        module.head.etf.copy_(t(e["inputs"]["proto"]))
        module.head.temperature.copy_(ref["scaling_train"])
    batches = batches_of(e["inputs"]["batches"])
    module.train()
    loss = sgd_steps(module.client_objective(context(module, batches)), reference_sgd(module.parameters()), batches)
    tol = 1e-7  # ours takes the log of the class counts in float32 (FedETF.client_objective)
    assert loss == pytest.approx(e["outputs"]["mean_loss"], abs=tol)
    assert_body_and_head(module, out, tol, head="")
    close(module.head.projection.weight, out["linear_proto.weight"], tol)
    close(module.head.projection.bias, out["linear_proto.bias"], tol)
    close(module.head.temperature, out["scaling_train"], tol)


# ---- FedRoD ----------------------------------------------------------------------------------
def fedrod_step(e: dict, **kwargs):
    from lightning_modules.fedrod import FedRoD

    module = build(FedRoD, state_of(e["inputs"]["state"]), **kwargs)
    module.p_head = nn.Linear(*module.head.weight.shape[::-1]).to(T)
    module.p_head.load_state_dict(state_of(e["inputs"]["p_head"]))
    batches = batches_of(e["inputs"]["batches"])
    shared = [p for n, p in module.named_parameters() if not n.startswith("p_head.")]
    # FedETF's code: the body and generic head with the client's SGD, the personal head with plain SGD
    optimizer = torch.optim.SGD([{"params": shared}, {"params": list(module.p_head.parameters()), "momentum": 0.0,
                                                       "weight_decay": 0.0}], lr=0.1, momentum=0.9, weight_decay=5e-4)
    module.train()
    loss = sgd_steps(module.client_objective(context(module, batches)), optimizer, batches)
    return module, loss


@pytest.mark.parametrize("case,prior", [("client_step_all_classes", "frequency"),
                                        ("client_step_absent_classes", "counts")])
def test_fedrod_generic_and_personal_heads_match_client_fedrod(case, prior):
    """All classes present: our default matches. Absent classes: FedETF's code counts them as 1
    (``prior: counts`` reproduces it); our default removes them from the softmax (FedRoD's N_k^gamma)."""
    e = golden("fedrod")[case]
    out = state_of(e["outputs"]["state"])
    module, loss = fedrod_step(e, prior=prior)
    tol = 1e-7  # our prior: log(frequency + 1e-9) in float32 (class_log_prior)
    assert_body_and_head(module, out, tol)
    for k, v in state_of(e["outputs"]["p_head"]).items():
        close(module.p_head.state_dict()[k], v, tol)
    # the reference's mean loss is the generic (balanced softmax) part; ours adds the personal CE
    assert loss > e["outputs"]["mean_loss"]


def test_fedrod_default_prior_departs_from_fedetf_code_only_with_absent_classes():
    e = golden("fedrod")["client_step_absent_classes"]
    module, _ = fedrod_step(e)
    gap = (module.head.weight - t(e["outputs"]["state"]["linear_head.weight"])).abs().max()
    assert gap > 1e-3  # docs/departures.md (FedBM): FedRoD's prior of absent classes


# ---- FedNH -----------------------------------------------------------------------------------
def fednh_module(ref: dict[str, torch.Tensor], prototype: torch.Tensor):
    from lightning_modules.fednh import FedNH, PrototypeHead

    module = build(FedNH, ref, head=PrototypeHead(prototype.clone(), 1.0, True))
    with torch.no_grad():
        module.head.scale.copy_(ref["scaling_train"])
    return module


def test_fednh_cosine_logits_step_matches_client_fednh():
    e = golden("fednh")["client_step"]
    ref, out = state_of(e["inputs"]["state"]), state_of(e["outputs"]["state"])
    module = fednh_module(ref, t(e["inputs"]["prototype"]))
    batches = batches_of(e["inputs"]["batches"])
    module.train()
    loss = sgd_steps(module.client_objective(context(module, batches)), reference_sgd(module.parameters()), batches)
    assert loss == pytest.approx(e["outputs"]["mean_loss"], abs=e["tolerance"])
    assert_body_and_head(module, out, e["tolerance"], head="")
    close(module.head.scale, out["scaling_train"], e["tolerance"])


def fednh_server(module, extras: dict[str, torch.Tensor]) -> torch.Tensor:
    module.server_side.step({}, extras, 0, ServerContext(1))
    return module.head.prototypes.clone()


def test_fednh_server_update_matches_fedetf_code_on_its_uploads():
    """The server rule (normalise the mean, 0.9 old + 0.1 new, normalise) matches FedETF's ``fednh``
    when our server step is given that code's uploads: each client's raw class mean, weight 1."""
    e = golden("fednh")["client_prototypes_and_server_update"]
    w0 = t(e["inputs"]["prototype"])
    clients = e["inputs"]["clients"]
    total, count = torch.zeros_like(w0), torch.zeros(len(w0), dtype=T)
    for c in clients:
        for k, mean in c["agg_protos"].items():
            total[int(k)] += t(mean)
            count[int(k)] += 1
    module = fednh_module(state_of(clients[0]["state"]), w0)
    close(fednh_server(module, {"proto_sum": total, "proto_count": count}), t(e["outputs"]["prototype"]), e["tolerance"])


def test_fednh_client_upload_departs_from_fedetf_code():
    """Our upload is FedNH's own code's (count-weighted means of unit features): on the same clients the
    server's prototypes differ from FedETF's code (raw means, clients weighted equally)."""
    e = golden("fednh")["client_prototypes_and_server_update"]
    w0 = t(e["inputs"]["prototype"])
    extras: dict[str, torch.Tensor] = {}
    for c in e["inputs"]["clients"]:
        module = fednh_module(state_of(c["state"]), w0)
        ctx = context(module, batches_of(c["batches"]))
        module.on_client_end(ctx)
        for k, v in ctx.uploads.items():
            extras[k] = extras.get(k, 0) + v
    assert (fednh_server(module, extras) - t(e["outputs"]["prototype"])).abs().max() > 1e-3


# ---- FedProto --------------------------------------------------------------------------------
def test_fedproto_prototype_regularised_step_matches_client_fedproto():
    from lightning_modules.fedproto import FedProto

    e = golden("fedproto")["client_step"]
    ref, out = state_of(e["inputs"]["state"]), state_of(e["outputs"]["state"])
    module = build(FedProto, ref, lam=e["inputs"]["lam"])
    module.server_side.global_prototypes = t(e["inputs"]["prototype"])
    module.server_side.has_prototype = torch.ones(len(module.server_side.global_prototypes), dtype=torch.bool)
    module.server_side.prototypes_ready = True
    batches = batches_of(e["inputs"]["batches"])
    module.train()
    loss = sgd_steps(module.client_objective(context(module, batches)), reference_sgd(module.parameters()), batches)
    assert loss == pytest.approx(e["outputs"]["mean_loss"], abs=e["tolerance"])
    assert_body_and_head(module, out, e["tolerance"])


@pytest.mark.parametrize("weighting", ["clients", "samples"])
def test_fedproto_server_aggregation_against_fedetf_code(weighting):
    """``weighting: clients`` is the code's unweighted mean over clients (matches); the default
    ``samples`` is the paper's |D_ik|-weighted mean and differs when clients' class sizes differ."""
    from lightning_modules.fedproto import FedProto

    e = golden("fedproto")["server_aggregation"]
    fednh_entry = golden("fednh")["client_prototypes_and_server_update"]  # the same two clients' batches
    sizes = [torch.bincount(torch.cat([torch.tensor(b["y"]) for b in c["batches"]]), minlength=5).to(T)
             for c in fednh_entry["inputs"]["clients"]]
    extras = {"proto_sum": 0, "proto_count": 0, "proto_mean_sum": 0, "proto_clients": 0}
    for client, n in zip(e["inputs"]["clients"], sizes):
        means = torch.zeros(5, len(next(iter(client.values()))), dtype=T)
        for k, mean in client.items():
            means[int(k)] = t(mean)
        extras = {"proto_sum": extras["proto_sum"] + means * n[:, None], "proto_count": extras["proto_count"] + n,
                  "proto_mean_sum": extras["proto_mean_sum"] + means, "proto_clients": extras["proto_clients"] + (n > 0)}
    module = FedProto(num_classes=5, in_channels=1, backbone="simple-cnn", weighting=weighting)
    module.server_side.global_prototypes = torch.zeros(5, means.shape[1], dtype=T)
    module.server_side.step({}, extras, 0, ServerContext(1))
    gap = (module.server_side.global_prototypes - t(e["outputs"]["prototype"])).abs().max()
    assert gap < e["tolerance"] if weighting == "clients" else gap > 1e-3


# ---- FedProx ---------------------------------------------------------------------------------
def test_fedprox_proximal_term_with_plain_sgd_matches_perturbed_gradient_descent():
    from lightning_modules.fedprox import FedProx

    e = golden("fedprox")["client_round"]
    central = state_of(e["inputs"]["central"])
    for client, expected in zip(e["inputs"]["clients"], e["outputs"]["clients"]):
        module = build(FedProx, central, mu=e["inputs"]["args"]["mu"])
        batches = batches_of(client["batches"])
        module.train()
        sgd_steps(module.client_objective(context(module, batches)), torch.optim.SGD(module.parameters(), lr=0.1), batches)
        assert_body_and_head(module, state_of(expected), e["tolerance"])


# ---- FedRep ----------------------------------------------------------------------------------
def test_fedrep_head_then_body_and_body_only_aggregation_match_fedetf_code():
    from lightning_modules.fedrep import FedRep

    e = golden("fedrep")["round"]
    central = state_of(e["inputs"]["central"])
    trained = []
    for client, expected in zip(e["inputs"]["clients"], e["outputs"]["clients"]):
        own = state_of(client["state"])  # the client keeps its head; the body comes from the server
        module = build(FedRep, {**central, **{k: own[k] for k in own if "head" in k}})
        batches = batches_of(client["batches"])
        ctx = context(module, batches)
        body_objective = module.client_objective(ctx)
        module.train()
        sgd_steps(module.training_step, reference_sgd(module.head.parameters()), batches)  # head epoch
        sgd_steps(body_objective, reference_sgd(module.backbone.parameters()), batches)  # body epoch
        assert_body_and_head(module, state_of(expected), e["tolerance"])
        trained.append(module)
    shared = trained[0].shared_keys()
    assert not any(k.startswith("head.") for k in shared) and "backbone.0.weight" in shared
    buf = RoundBuffer({k: trained[0].state_dict()[k].shape for k in shared}, {}, "cpu")
    for module, weight in zip(trained, e["inputs"]["size_weights"]):
        buf.add_client({k: module.state_dict()[k] for k in shared}, weight, {})
    avg = buf.averaged_state()
    ref_central = state_of(e["outputs"]["central"])
    for name in ("body.weight", "body.bias"):
        close(avg[ours_name(name)], ref_central[name], e["tolerance"])
    for name in ("linear_head.weight", "linear_head.bias"):  # the server's head is never averaged
        close(ref_central[name], central[name], 0.0)


# ---- FedDyn ----------------------------------------------------------------------------------
def ref_vector_parts(vector: list[float], state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Split the FedETF framework's flat parameter vector (model.parameters() order, which is the state
    dict's: the tiny model has no buffers) by name."""
    flat, parts, at = t(vector), {}, 0
    for name, value in state.items():
        n = value.numel()
        parts[name] = flat[at:at + n].view(value.shape)
        at += n
    assert at == len(flat)
    return parts


def test_feddyn_gradient_memory_and_server_update_match_fedetf_code():
    from lightning_modules.feddyn import FedDyn

    e = golden("feddyn")["round"]
    alpha = e["inputs"]["args"]["mu"]
    central = state_of(e["inputs"]["central"])
    trained = [state_of(c) for c in e["outputs"]["clients"]]
    module = build(FedDyn, central, alpha=alpha)
    for i, client in enumerate(trained):  # g_k <- g_k - alpha (theta_k - theta_g)
        old = ref_vector_parts(e["inputs"]["old_grad"][i], central)
        new = ref_vector_parts(e["outputs"]["old_grad"][i], central)
        terms = [(client[n], central[n], old[n].clone()) for n in BODY_HEAD]
        module.update_grad_memory(terms)
        for (_, _, g_k), n in zip(terms, BODY_HEAD):
            close(g_k, new[n], e["tolerance"])
    weights = e["inputs"]["size_weights"]
    avg = {ours_name(n): sum(w * c[n] for w, c in zip(weights, trained)) / sum(weights) for n in BODY_HEAD}
    module.server_side.previous_global = {ours_name(n): central[n].clone() for n in BODY_HEAD}
    module.server_side.h = {ours_name(n): state_of(e["inputs"]["server_state"])[n] for n in BODY_HEAD}
    module.server_side.step(avg, {}, 0, ServerContext(1))
    for n in BODY_HEAD:
        close(avg[ours_name(n)], state_of(e["outputs"]["central"])[n], e["tolerance"])
        close(module.server_side.h[ours_name(n)], state_of(e["outputs"]["server_state"])[n], e["tolerance"])


def test_feddyn_client_step_departs_from_fedetf_codes_unsquared_penalty():
    """FedETF's code adds alpha/2 ||theta - theta_g||_2 (unsquared); ours is the paper's squared term
    (docs/departures.md, FedBM): the trained clients differ."""
    from lightning_modules.feddyn import FedDyn

    e = golden("feddyn")["round"]
    central = state_of(e["inputs"]["central"])
    client, expected = e["inputs"]["clients"][0], state_of(e["outputs"]["clients"][0])
    module = build(FedDyn, central, alpha=e["inputs"]["args"]["mu"])
    batches = batches_of(client["batches"])
    ctx = context(module, batches)
    old = ref_vector_parts(e["inputs"]["old_grad"][0], central)
    ctx.state["grad_memory"] = {ours_name(n): old[n].clone() for n in BODY_HEAD}
    correct, _ = module.dynamic_regulariser(ctx)
    module.train()
    sgd_steps(module.client_objective(ctx), reference_sgd(module.parameters()), batches, after_backward=correct)
    assert (module.backbone[0].weight - expected["body.weight"]).abs().max() > 1e-3


# ---- Lee-Gihun/FedNTD's implementations (model: Sequential(Linear, ReLU, Linear)) -----------------
def from_sequential(state: dict) -> dict[str, torch.Tensor]:
    """That code's tiny model's state ('0.*' body, '2.*' head) under the names ``build`` reads."""
    names = {"0.weight": "body.weight", "0.bias": "body.bias", "2.weight": "linear_head.weight",
             "2.bias": "linear_head.bias"}
    return {names[k]: t(v) for k, v in state.items()}


def flat_parts(vector, ref_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A flat vector in that model's parameter order, split under our parameter names."""
    flat, parts, at = t(vector), {}, 0
    for name in BODY_HEAD:
        n = ref_state[name].numel()
        parts[ours_name(name)] = flat[at:at + n].view(ref_state[name].shape)
        at += n
    assert at == len(flat)
    return parts


def mapped(state: dict) -> dict[str, torch.Tensor]:
    return {ours_name(k): v for k, v in from_sequential(state).items()}


@pytest.mark.parametrize("tau", [1.0, 3.0])
def test_fedntd_not_true_distillation_against_ntd_loss(tau):
    """tau 1 (FedNTD's config, ours): equal. Other tau: the code multiplies the KL by tau^2, the paper's
    Eq. 4 does not, nor do we (docs/departures.md, FST-CBDG)."""
    from lightning_modules.fedntd import ntd_loss

    e = golden("fedntd")[f"ntd_loss_tau{tau:g}"]
    i = e["inputs"]
    logits, teacher, y = t(i["logits"]), t(i["dg_logits"]), torch.tensor(i["targets"])
    ce = F.cross_entropy(logits, y)
    ours = ce + i["beta"] * ntd_loss(logits, teacher, y, tau)
    code = ce + i["beta"] * tau ** 2 * ntd_loss(logits, teacher, y, tau)
    assert code.item() == pytest.approx(e["outputs"]["loss"], abs=e["tolerance"])
    assert (ours.item() == pytest.approx(e["outputs"]["loss"], abs=e["tolerance"])) == (tau == 1.0)


def test_moon_model_contrastive_loss_against_fedntd_code():
    from lightning_modules.moon import model_contrastive_loss

    e = golden("moon")["model_contrastive_loss"]
    i = e["inputs"]
    ours = F.cross_entropy(t(i["logits"]), torch.tensor(i["targets"])) + i["mu"] * model_contrastive_loss(
        t(i["z"]), t(i["z_g"]), t(i["z_prev"]), i["tau"])
    assert ours.item() == pytest.approx(e["outputs"]["loss"], abs=e["tolerance"])


def test_scaffold_client_and_server_match_fedntd_code():
    """Corrected steps (grad - c_i + c, then momentum SGD with weight decay), option II with FedNTD's
    adaptive divisor for momentum (our unit_displacement), and c += (|S|/N) mean_S delta c_i."""
    from lightning_modules.scaffold import Scaffold, unit_displacement

    e = golden("scaffold")["client_and_server"]
    i, o = e["inputs"], e["outputs"]
    ref = from_sequential(i["state"])
    module = build(Scaffold, ref)
    batches = batches_of(i["batches"])
    ctx = context(module, batches)
    ctx.state["c_local"] = flat_parts(i["c_i"], ref)
    module.server_side.c = flat_parts(i["c"], ref)
    correct = module.control_variate_correction(ctx)
    optimizer = torch.optim.SGD(module.parameters(), lr=i["lr"], momentum=i["momentum"], weight_decay=i["weight_decay"])
    module.train()
    sgd_steps(module.client_objective(ctx), optimizer, batches, after_backward=correct)
    module.update_control_variate(ctx, unit_displacement(o["steps"], i["lr"], i["momentum"]))
    assert_body_and_head(module, from_sequential(o["state"]), e["tolerance"])
    for name, value in flat_parts(o["c_i_plus"], ref).items():
        close(ctx.state["c_local"][name], value, e["tolerance"])
    dc, other = flat_parts(o["c_update_amount"], ref), flat_parts(i["other_client_dc"], ref)
    for name, value in dc.items():
        close(ctx.uploads[f"dc.{name}"], value, e["tolerance"])
    n = i["num_clients"]
    module.server_side.c_sum = {name: value * n for name, value in flat_parts(i["c"], ref).items()}
    module.server_side.step({}, {f"dc.{k}": dc[k] + other[k] for k in dc}, 0, ServerContext(num_clients=n))
    for name, value in flat_parts(o["server_c"], ref).items():
        close(module.server_side.c[name], value, e["tolerance"])


def feddyn_round(e: dict):
    from lightning_modules.feddyn import FedDyn

    i, o = e["inputs"], e["outputs"]
    server = from_sequential(i["server"])
    for client, trained, grads in zip(i["clients"], o["clients"], o["local_grads"]):
        module = build(FedDyn, server, alpha=i["alpha"])
        batches = batches_of(client["batches"])
        ctx = context(module, batches)
        ctx.state["grad_memory"] = mapped(client["previous_grads"])
        correct, terms = module.dynamic_regulariser(ctx)
        module.train()
        sgd_steps(module.client_objective(ctx), torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9,
                                                                weight_decay=1e-5), batches, after_backward=correct)
        assert_body_and_head(module, from_sequential(trained), e["tolerance"])
        module.update_grad_memory(terms)
        for name, value in mapped(grads).items():
            close(ctx.state["grad_memory"][name], value, e["tolerance"])
    weights = i["sizes"]
    clients = [mapped(c) for c in o["clients"]]
    avg = {k: sum(w * c[k] for w, c in zip(weights, clients)) / sum(weights) for k in clients[0]}
    module.server_side.previous_global = {ours_name(k): v.clone() for k, v in server.items()}
    module.server_side.h = mapped(i["h"])
    module.server_side.step(avg, {}, 0, ServerContext(1))
    return avg, module.server_side.h


def test_feddyn_client_penalty_memory_and_server_match_fedntd_code_under_full_equal_participation():
    e = golden("feddyn")["round_equal_sizes_full"]
    avg, h = feddyn_round(e)
    for name, value in mapped(e["outputs"]["server"]).items():
        close(avg[name], value, e["tolerance"])
    for name, value in mapped(e["outputs"]["h"]).items():
        close(h[name], value, e["tolerance"])


def test_feddyn_server_h_step_departs_from_fedntd_code_under_partial_participation():
    """FedNTD's code (and FedDyn's Algorithm 1) moves h by alpha/m sum over the sampled clients; ours by
    alpha times the sampled clients' sample-weighted mean, as FedETF's code (docs/departures.md, FedBM)."""
    e = golden("feddyn")["round_unequal_sizes_partial"]
    _, h = feddyn_round(e)  # the clients' local steps still match (asserted inside)
    gap = max((h[k] - v).abs().max().item() for k, v in mapped(e["outputs"]["h"]).items())
    assert gap > 1e-4


def renamed(state: dict, names: dict[str, str]) -> dict[str, torch.Tensor]:
    return {names[k]: t(v) for k, v in state.items() if k in names}


# ---- FedRS (lxcnju/FedRepo) ------------------------------------------------------------------
@pytest.mark.parametrize("proportional", [True, False])
def test_fedrs_restricted_softmax_against_fedrepo_update_local(proportional):
    """``proportional: true`` (the code's alpha + (1 - alpha) n_c / max n) matches; the default (the
    paper's alpha for absent classes, 1 otherwise) differs when present classes have unequal counts."""
    from lightning_modules.fedrs import FedRS

    e = golden("fedrs")["update_local"]
    names = {"body.weight": "body.weight", "body.bias": "body.bias", "classifier.weight": "linear_head.weight"}
    ref, out = renamed(e["inputs"]["state"], names), renamed(e["outputs"]["state"], names)
    head = nn.Linear(ref["body.weight"].shape[0], ref["linear_head.weight"].shape[0], bias=False)
    module = build(FedRS, ref, head=head, alpha=e["inputs"]["alpha"], proportional=proportional)
    with torch.no_grad():
        module.head.weight.copy_(ref["linear_head.weight"])
    batches = batches_of(e["inputs"]["batches"])
    ctx = context(module, batches)
    assert torch.equal(ctx.class_counts().to(T), t(e["inputs"]["class_counts"]))
    module.train()
    loss = sgd_steps(module.client_objective(ctx), reference_sgd(module.parameters()), batches)
    matches = abs(loss - e["outputs"]["mean_loss"]) < e["tolerance"]
    assert matches == proportional
    if proportional:
        close(module.head.weight, out["linear_head.weight"], e["tolerance"])
        close(module.backbone[0].weight, out["body.weight"], e["tolerance"])


# ---- CReFF (shangxinyi/CReFF-FL) -------------------------------------------------------------
def test_crerf_gradient_matching_distance_against_match_loss():
    from lightning_modules.crerf import matching_distance

    e = golden("crerf")["match_loss"]
    syn, real = e["inputs"]["gw_syn"], e["inputs"]["gw_real"]
    ours = matching_distance(t(syn[0]), t(syn[1]), t(real[0]), t(real[1]))
    assert ours.item() == pytest.approx(e["outputs"]["distance"], abs=e["tolerance"])


def test_crerf_federated_feature_update_against_update_feature_syn():
    """Our server step (per-class mean of the holders' gradients, then the matching SGD on the seen
    classes' features) on the code's inputs gives the code's federated features."""
    from lightning_modules.crerf import GRAD_B, GRAD_W, HOLDERS, CReRF

    e = golden("crerf")["update_feature_syn"]
    i = e["inputs"]
    feats, m = t(i["feature_syn"]), i["features_per_class"]
    k, d = len(feats) // m, feats.shape[1]
    module = CReRF(num_classes=k, in_channels=1, backbone="simple-cnn", features_per_class=m,
                   match_steps=i["match_epoch"], lr_feature=i["lr_feature"], retrain_epochs=1).to(T)
    module.feature_dim = d
    module.retrained_head = nn.Linear(d, k).to(T).requires_grad_(False)
    module.retrained_head.load_state_dict({"weight": t(i["classifier"]["classifier.weight"]),
                                           "bias": t(i["classifier"]["classifier.bias"])})
    module.federated_features = feats.clone()
    extras = {GRAD_W: torch.zeros(k, k, d, dtype=T), GRAD_B: torch.zeros(k, k, dtype=T), HOLDERS: torch.zeros(k, dtype=T)}
    for client in i["clients_gradient"]:  # each client's upload, summed as the round buffer sums them
        for c, (gw, gb) in client.items():
            extras[GRAD_W][int(c)] += t(gw)
            extras[GRAD_B][int(c)] += t(gb)
            extras[HOLDERS][int(c)] += 1
    module.server_side.step({}, extras, 0, ServerContext(1))
    close(module.federated_features, t(e["outputs"]["feature_syn"]), e["tolerance"])


# ---- BalanceFL (sxontheway/BalanceFL) --------------------------------------------------------
def balancefl_loss(i: dict, present: torch.Tensor) -> torch.Tensor:
    from lightning_modules.balancefl import (
        missing_class_distillation,
        present_class_cross_entropy,
        present_class_entropy,
    )

    logits, aug, teacher, y = t(i["logits"]), t(i["logit_aug"]), t(i["teacher_pred"]), torch.tensor(i["labels"])
    missing = torch.tensor([c for c in range(logits.shape[1]) if c not in present.tolist()])
    return (present_class_cross_entropy(aug, y, present) + i["lamda"] * missing_class_distillation(
        logits, teacher, missing, i["Temp"]) - 0.002 * present_class_entropy(logits, present))


def test_balancefl_local_loss_against_lwf_loss():
    e = golden("balancefl")["lwf_loss_batch_holds_client_classes"]
    ours = balancefl_loss(e["inputs"], torch.tensor(e["inputs"]["client_classes"]))
    assert ours.item() == pytest.approx(e["outputs"]["loss"], abs=e["tolerance"])


def test_balancefl_present_classes_per_client_depart_from_the_codes_per_batch_rule():
    """The code takes the present classes from each batch; ours from the client (the paper's P): a batch
    without one of the client's classes scores differently, and the batch's classes reproduce the code."""
    e = golden("balancefl")["lwf_loss_batch_misses_class_3"]
    i = e["inputs"]
    per_batch = balancefl_loss(i, torch.unique(torch.tensor(i["labels"])))
    per_client = balancefl_loss(i, torch.tensor(i["client_classes"]))
    assert per_batch.item() == pytest.approx(e["outputs"]["loss"], abs=e["tolerance"])
    assert abs(per_client.item() - e["outputs"]["loss"]) > 1e-3


# ---- FedBABU (jhoon-oh/FedBABU) --------------------------------------------------------------
def test_fedbabu_body_only_training_and_body_aggregation_against_fedbabu_code():
    from lightning_modules.fedbabu import FedBABU

    e = golden("fedbabu")["round"]
    names = {"features.weight": "body.weight", "features.bias": "body.bias", "linear.weight": "linear_head.weight",
             "linear.bias": "linear_head.bias"}
    start = renamed(e["inputs"]["state"], names)
    trained = []
    for client, expected in zip(e["inputs"]["clients"], e["outputs"]["clients"]):
        module = build(FedBABU, start)
        module.head.requires_grad_(False)  # as FedBABU.__init__ does for its own head
        batches = batches_of(client["batches"])
        module.train()
        optimizer = reference_sgd([p for p in module.parameters() if p.requires_grad])  # configure_optimizers' rule
        sgd_steps(module.client_objective(context(module, batches)), optimizer, batches)
        assert_body_and_head(module, renamed(expected, names), e["tolerance"])
        trained.append(module)
    shared = trained[0].shared_keys()
    assert not any(k.startswith("head.") for k in shared)
    buf = RoundBuffer({k: trained[0].state_dict()[k].shape for k in shared}, {}, "cpu")
    for module in trained:  # equal sample counts: our sample-weighted mean is the code's plain mean
        buf.add_client({k: module.state_dict()[k] for k in shared}, float(len(e["inputs"]["clients"][0]["batches"])), {})
    avg = buf.averaged_state()
    for k, v in renamed(e["outputs"]["global_body"], names).items():
        close(avg[ours_name(k)], v, e["tolerance"])


def test_fedrod_rejects_an_unknown_prior():
    from bench.core.errors import FedbenchError
    from lightning_modules.fedrod import FedRoD

    with pytest.raises(FedbenchError, match="prior must be one of"):
        FedRoD(num_classes=3, in_channels=1, backbone="simple-cnn", prior="uniform")


def test_moon_client_training_with_projection_head_against_train_net_fedcon():
    """MOON's own code (QinbinLi/MOON): one local epoch of CE on l3(z) plus the model-contrastive term on the
    projection z = l2(relu(l1(h))); ours with ``projection_dim`` is the same model and loss."""
    from lightning_modules.moon import Moon

    e = golden("moon")["train_net_fedcon"]
    i = e["inputs"]
    names = {"features.0.weight": "backbone.0.weight", "features.0.bias": "backbone.0.bias",
             "l1.weight": "projection.0.weight", "l1.bias": "projection.0.bias", "l2.weight": "projection.2.weight",
             "l2.bias": "projection.2.bias", "l3.weight": "head.weight", "l3.bias": "head.bias"}
    net = renamed(i["net"], names)
    d, p = net["projection.0.weight"].shape[0], net["projection.2.weight"].shape[0]
    module = Moon(num_classes=net["head.weight"].shape[0], in_channels=1, backbone="simple-cnn", mu=i["mu"],
                  temperature=i["temperature"], projection_dim=p)
    module.backbone = nn.Sequential(nn.Linear(net["backbone.0.weight"].shape[1], d), nn.ReLU())
    module.feature_dim = d
    module.projection = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, p))
    module.to(T).load_state_dict(net)
    batches = batches_of(i["batches"])
    ctx = context(module, batches)
    ctx.global_state = renamed(i["global"], names)
    ctx.state["previous"] = renamed(i["previous"], names)
    module.train()
    sgd_steps(module.client_objective(ctx), torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9,
                                                            weight_decay=1e-5), batches)
    for k, v in renamed(e["outputs"]["net"], names).items():
        close(module.state_dict()[k], v, e["tolerance"])
