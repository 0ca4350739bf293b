"""FedCB (LKCC) and FedBM (LKCC + CGDE), issue 3: the frozen classifier, the loss, the three
classifier variants, the generator's schedule, the synthetic batch, the loss switches, the
noise condition and the server state. Tiny runs on sklearn digits with the small CNN; the
MiniLM embeddings are cached once per session."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import REPO, kill_and_resume, max_state_diff, run_in_process

from bench.core.batches import DeviceData
from bench.core.errors import FedbenchError
from lightning_modules.base import ClientContext
from lightning_modules.components import prompts as P
from lightning_modules.components import text_encoders as TE
from lightning_modules.components.concept_distributions import ConceptDistribution
from lightning_modules.components.lkcc import lkcc_logits
from lightning_modules.fedbm import FedBM
from lightning_modules.fedcb import FedCB
from lightning_modules.server_part import ServerContext

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

SMALL = {"method.backbone": "simple-cnn", "partition.num_clients": 4, "fed.rounds": 2, "fed.sample_ratio": 1.0}
DIGIT_NAMES = [str(d) for d in range(10)]
CHEAP_GEN = {"gen_steps": 2, "gen_batch": 8, "gen_base_channels": 8, "g_batch": 5}


@pytest.fixture(scope="session")
def text_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("text-cache"))


def build(cls, text_cache, **args):
    torch.manual_seed(0)
    return cls(num_classes=10, in_channels=1, backbone="simple-cnn", dataset_name="digits", class_names=DIGIT_NAMES,
               text_cache_dir=text_cache, **args)


def digits_data(n: int = 40, size: int = 8) -> DeviceData:
    gen = torch.Generator().manual_seed(1)
    return DeviceData(torch.randint(0, 256, (n, 1, size, size), generator=gen, dtype=torch.uint8),
                      torch.arange(n) % 10, torch.tensor([0.3]).view(1, 1, 1, 1), torch.tensor([0.4]).view(1, 1, 1, 1))


def context(module, data: DeviceData, round_idx: int = 0, client: int = 0) -> ClientContext:
    glob = {k: module.state_dict()[k].clone() for k in module.shared_keys()}
    return ClientContext(client_id=client, round_idx=round_idx, seed=0, data=data, indices=torch.arange(len(data.labels)),
                         num_classes=10, global_state=glob, generator=torch.Generator().manual_seed(round_idx * 100 + client))


def expected_distribution(text_cache, prompt_fraction: float = 1.0) -> ConceptDistribution:
    emb = TE.class_prompt_embeddings("minilm", P.prompts("digits", DIGIT_NAMES, prompt_fraction), text_cache)
    return ConceptDistribution.from_embeddings(emb.float())


# ---- (a) the frozen classifier ---------------------------------------------------------------
def test_classifier_buffers_frozen_identical_on_every_client_and_not_shared(tiny_cfg, captured, monkeypatch, text_cache):
    seen: list[tuple[int, int, torch.Tensor, torch.Tensor]] = []
    original = FedCB.client_objective

    def record(self, ctx):
        seen.append((ctx.round_idx, ctx.client_id, self.head.mu.clone(), self.head.sigma_diag.clone()))
        return original(self, ctx)

    monkeypatch.setattr(FedCB, "client_objective", record)
    record_, final = run_in_process(tiny_cfg(**SMALL, **{"method.name": "fedcb",
                                                          "method.args": {"text_cache_dir": text_cache}}))
    fed = captured["fed"]
    dist = expected_distribution(text_cache)
    assert len(seen) == 2 * 4  # every client of both rounds
    for _, _, mu, sigma in seen:
        assert torch.equal(mu, dist.mu) and torch.equal(sigma, dist.sigma_diag)
    assert torch.equal(final["head.mu"], dist.mu) and torch.equal(final["head.sigma_diag"], dist.sigma_diag)
    assert "head.mu" not in fed.shared and "head.sigma_diag" not in fed.shared
    assert "head.projection.weight" in fed.shared and any(k.startswith("backbone.") for k in fed.shared)
    assert not any(p is fed.module.head.mu for p in fed.module.parameters())
    # only backbone + projection go on the wire
    shared_bytes = sum(v.numel() * v.element_size() for k, v in final.items() if k in fed.shared)
    assert record_["bytes_per_client_round"]["down"] == shared_bytes
    assert float(dist.sigma_diag.min()) >= 0 and float(dist.sigma_diag.sum()) > 0


# ---- (b) the loss ------------------------------------------------------------------------------
def test_training_loss_is_the_closed_form_surrogate(text_cache):
    m = build(FedCB, text_cache, tau=12.5)
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(6, 1, 8, 8, generator=gen), torch.tensor([0, 3, 3, 9, 5, 1])
    loss = m.training_step((x, y)).detach()
    h = F.normalize(m.head.projection(m.backbone(x)), dim=1).detach().double()
    mu, sd, tau = m.head.mu.double(), m.head.sigma_diag.double(), 12.5
    logits = tau * h @ mu.T + 0.5 * tau**2 * (h**2) @ sd.T
    by_hand = (torch.logsumexp(logits, 1) - logits[torch.arange(6), y] + 0.5 * tau**2 * (h**2 * sd[y]).sum(1)).mean()
    assert float(loss) == pytest.approx(float(by_hand), rel=1e-5)
    assert torch.allclose(m.eval_logits(x).double(), logits, atol=1e-4)
    m.head.sigma_diag.zero_()  # sigma = 0: plain CE on tau h.mu
    assert float(m.training_step((x, y)).detach()) == pytest.approx(float(F.cross_entropy(tau * h @ mu.T, y)), rel=1e-5)


# ---- (c) the classifier variants ---------------------------------------------------------------
def test_classifier_variants(text_cache):
    dist = expected_distribution(text_cache)
    d = build(FedCB, text_cache)
    e = build(FedCB, text_cache, classifier="embedding_average")
    assert torch.equal(d.head.mu, dist.mu) and torch.equal(d.head.sigma_diag, dist.sigma_diag)
    assert torch.equal(e.head.mu, dist.mu) and not e.head.sigma_diag.any()
    x = torch.randn(4, 1, 8, 8)
    h = e.embed(x)
    assert torch.allclose(e.eval_logits(x), 12.5 * h @ dist.mu.T, atol=1e-5)
    assert torch.allclose(d.eval_logits(x), lkcc_logits(d.embed(x), dist.mu, dist.sigma_diag, 12.5), atol=1e-5)
    assert not torch.allclose(d.eval_logits(x), 12.5 * d.embed(x) @ dist.mu.T)  # the variance term matters
    # "Random (Freezing)" is no FedCB classifier (the cosine, tau-scaled random rows are gone): it is
    # FedAvg with a frozen random linear head, fedavg-random-frozen (test below)
    for bad in ({"classifier": "linear"}, {"classifier": "random_frozen"}, {"text_encoder": "gpt"}, {"tau": 0.0}):
        with pytest.raises(FedbenchError):
            build(FedCB, text_cache, **bad)
    with pytest.raises(FedbenchError, match="random_frozen"):
        build(FedBM, text_cache, classifier="random_frozen")


def test_without_lkcc_learned_classifier(text_cache):
    """FedBM Table VI "w/o LKCC": a trainable linear classifier (CE, aggregated), the generator still
    conditioned on the concept distributions, L_sem = CE of the global model's learned classifier."""
    import copy

    from bench.core.seeding import SERVER, derive_seed

    data = digits_data()
    m = build(FedBM, text_cache, **{**CHEAP_GEN, "gen_batch": 6, "gen_steps": 1}, classifier="learned")
    assert "head.fc.weight" in m.shared_keys() and "head.fc.bias" in m.shared_keys()
    assert not any(k.startswith(("head.mu", "head.sigma", "head.projection")) for k in m.state_dict())
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(6, 1, 8, 8, generator=gen), torch.tensor([0, 3, 3, 9, 5, 1])
    with torch.no_grad():
        ce = F.cross_entropy(m.head.fc(m.backbone(x)), y)
    assert float(m.training_step((x, y)).detach()) == pytest.approx(float(ce), rel=1e-6)
    m.prepare_splits(data, None, data)
    dist = expected_distribution(text_cache)
    cond = m.condition_distribution()
    assert torch.equal(cond.mu, dist.mu) and torch.equal(cond.cov, dist.cov)
    # L_sem of the (only) generator step, by hand, from the draws of train_generator's seeded stream
    rng = torch.Generator().manual_seed(derive_seed(m.server_seed, 4, -1, SERVER))
    labels = torch.randint(10, (6,), generator=rng)
    z = dist.sample(labels, generator=rng)
    g = copy.deepcopy(m.cgde.generator).train()
    m.eval()
    from lightning_modules.components.cgde_generator import augment_generated

    with torch.no_grad():  # the teacher sees the crop/flips drawn next from the same stream
        by_hand = F.cross_entropy(m.head.fc(m.backbone(m.cgde.normalise(augment_generated(g(z), rng)))), labels)
    m.train()
    logs = m.train_generator({k: v.clone() for k, v in m.state_dict().items() if k in m.shared_keys()}, 4)
    assert logs["sem"] == pytest.approx(float(by_hand), rel=1e-5) and logs["div"] > 0 and logs["dis"] > 0
    with pytest.raises(FedbenchError, match="learned"):
        build(FedCB, text_cache, classifier="learned")


def test_prompt_fraction_changes_the_distribution(text_cache):
    half = build(FedCB, text_cache, prompt_fraction=0.5)
    dist = expected_distribution(text_cache, 0.5)
    assert torch.equal(half.head.mu, dist.mu)
    assert not torch.equal(half.head.mu, build(FedCB, text_cache).head.mu)


# ---- (d) FedBM ---------------------------------------------------------------------------------
def test_generator_schedule_and_synthetic_batches(tiny_cfg, captured, monkeypatch, text_cache):
    sizes: list[tuple[int, int, int]] = []
    original = FedBM.with_synthetic

    def spy(self, ctx, batch):
        trained = original(self, ctx, batch)  # the batch the loss is averaged over (real + synthetic)
        sizes.append((ctx.round_idx, len(batch[1]), len(trained[1])))
        return trained

    monkeypatch.setattr(FedBM, "with_synthetic", spy)
    args = {**CHEAP_GEN, "gen_start": 2, "gen_every": 2, "text_cache_dir": text_cache}
    run_in_process(tiny_cfg(**{**SMALL, "method.name": "fedbm", "fed.rounds": 5, "method.args": args}))
    module: FedBM = captured["fed"].module
    assert [e["round"] for e in module.cgde.log] == [1, 3]  # after rounds 2 and 4 (1-based)
    for r, real, total in sizes:
        assert total == real + (5 if r >= 2 else 0), (r, real, total)
    assert {r for r, _, _ in sizes} == {0, 1, 2, 3, 4}
    # the generator makes images like the data: [g, 1, 8, 8] in [0, 1], normalised like real ones
    data = captured["fed"].data
    ctx = context(module, data, round_idx=4)
    rng_state = ctx.generator.get_state()
    module._augment_rng = None  # a fresh (seed, round, client) augmentation stream
    xs, ys = module.synthetic_batch(ctx)
    ctx.generator.set_state(rng_state)
    from bench.core.seeding import AUGMENT, METHOD, derive_seed
    from lightning_modules.components.cgde_generator import augment_generated, generate_batch

    raw, labels = generate_batch(module.cgde.generator, module.condition_distribution(), 5, ctx.generator)
    assert raw.shape == (5, *data.images.shape[1:]) and 0 <= float(raw.min()) and float(raw.max()) <= 1
    # augmented like the generator's training batches (crop, flips) from a CPU stream of (seed, round, client)
    aug_rng = torch.Generator().manual_seed(derive_seed(derive_seed(0, 4, 0, METHOD), -1, -1, AUGMENT))
    assert torch.allclose(xs, (augment_generated(raw, aug_rng) - data.mean) / data.std) and torch.equal(ys, labels)
    assert not torch.allclose(xs, (raw - data.mean) / data.std)
    assert not any(k.startswith(("generator", "cgde")) for k in module.state_dict())


def test_generator_loss_switches_and_noise_condition(text_cache):
    data = digits_data()
    logs = {}
    for name, args in {"all": {}, "no_div": {"use_div": False}, "no_dis": {"use_dis": False},
                       "no_sem": {"use_sem": False}}.items():
        m = build(FedBM, text_cache, **CHEAP_GEN, **args)
        m.prepare_splits(data, None, data)
        m.server_side.step({k: v.clone() for k, v in m.state_dict().items() if k in m.shared_keys()}, {}, 4, ServerContext(1))
        logs[name] = m.cgde.log[-1]
    assert all(logs["all"][k] > 0 for k in ("sem", "div", "dis"))
    assert logs["no_div"]["div"] == 0 and logs["no_div"]["dis"] > 0
    assert logs["no_dis"]["dis"] == 0 and logs["no_dis"]["div"] > 0
    assert logs["no_sem"]["sem"] == 0
    with pytest.raises(FedbenchError, match="use_sem"):
        build(FedBM, text_cache, use_sem=False, use_div=False, use_dis=False)
    with pytest.raises(FedbenchError, match="condition"):
        build(FedBM, text_cache, condition="text")
    with pytest.raises(FedbenchError, match="augment_synthetic"):
        build(FedBM, text_cache, augment_synthetic="yes")
    # noise condition: z ~ N(0, I) does not depend on the concept means; concept conditions do
    outs = {}
    for cond in ("noise", "concept"):  # without the crop/flips, whose stream moves on between the two calls
        m = build(FedBM, text_cache, **CHEAP_GEN, condition=cond, augment_synthetic=False)
        m.prepare_splits(data, None, data)
        m.cgde.trained = True
        a = m.synthetic_batch(context(m, data))[0]
        m.head.mu.add_(1.0)
        outs[cond] = (a, m.synthetic_batch(context(m, data))[0])
    assert torch.equal(*outs["noise"]) and not torch.allclose(*outs["concept"])


def test_generator_only_on_server_rank_then_broadcast(text_cache):
    data = digits_data()

    class Comm:
        def __init__(self, is_server, payload=None):
            self.is_server, self.payload, self.sent = is_server, payload, None

        def broadcast(self, obj):
            self.sent = obj
            return obj if self.is_server else self.payload

    server, other = build(FedBM, text_cache, **CHEAP_GEN), build(FedBM, text_cache, **CHEAP_GEN)
    for m in (server, other):
        m.prepare_splits(data, None, data)
    glob = {k: v.clone() for k, v in server.state_dict().items() if k in server.shared_keys()}
    server_side = Comm(True)
    server.server_side.step(glob, {}, 4, server_side)  # the ServerContext is given, not injected (issue 29)
    other_side = Comm(False, payload=server_side.sent)
    other.server_side.step(glob, {}, 4, other_side)
    assert len(server.cgde.log) == 1 and other.cgde.log == []  # trained once, on the server
    assert other_side.sent is None and other.cgde.trained
    assert max_state_diff(server.cgde.generator.state_dict(), other.cgde.generator.state_dict()) == 0.0
    server.server_side.step(glob, {}, 5, ServerContext(1))  # not a generator round (gen_start = gen_every = 5)
    assert len(server.cgde.log) == 1


def test_server_state_round_trip(text_cache):
    data = digits_data()
    a = build(FedBM, text_cache, **CHEAP_GEN)
    a.prepare_splits(data, None, data)
    fresh = a.server_side.state()
    assert not bool(fresh["generator_trained"])
    a.server_side.step({k: v.clone() for k, v in a.state_dict().items() if k in a.shared_keys()}, {}, 4, ServerContext(1))
    b = build(FedBM, text_cache, **CHEAP_GEN)
    b.prepare_splits(data, None, data)
    assert max_state_diff(a.cgde.generator.state_dict(), b.cgde.generator.state_dict()) > 0
    b.server_side.load_state(a.server_side.state(), ServerContext(1))
    assert b.cgde.trained and max_state_diff(a.cgde.generator.state_dict(), b.cgde.generator.state_dict()) == 0.0
    assert torch.equal(a.synthetic_batch(context(a, data, 7, 2))[0], b.synthetic_batch(context(b, data, 7, 2))[0])


def test_fedbm_resumes_exactly(tiny_cfg, text_cache):
    """The generator is checkpointed: killed after round 2 of 3 and resumed = uninterrupted."""
    args = {**CHEAP_GEN, "gen_start": 1, "gen_every": 1, "text_cache_dir": text_cache}
    base = {**SMALL, "method.name": "fedbm", "method.args": args, "fed.rounds": 3, "fed.sample_ratio": 0.5,
            "checkpoint_every": 1}
    kill_and_resume(tiny_cfg, base)


# ---- (e) the offline text encoder on the papers' prompts --------------------------------------
def test_minilm_embeds_the_kvasir_prompts_offline(text_cache):
    from datamodules.base import DATASETS

    grid = P.prompts("kvasir", list(DATASETS.get("kvasir").class_names))
    emb = TE.class_prompt_embeddings("minilm", grid, text_cache)
    assert emb.shape == (8, 24, 384) and torch.isfinite(emb).all()
    assert torch.allclose(emb.norm(dim=-1), torch.ones(8, 24), atol=1e-5)
    dist = ConceptDistribution.from_embeddings(emb)
    cos = F.normalize(dist.mu, dim=1) @ F.normalize(dist.mu, dim=1).T
    assert float((cos - 2 * torch.eye(8)).max()) < 0.95  # eight distinct concepts


# ---- the paper-scale and ablation configs ------------------------------------------------------
@pytest.mark.parametrize("name", ["table2_kvasir", "table2_oct-c8", "table2_ham10000", "table2_pbc",
                                  "ablation_kvasir", "ablation_fashion-mnist"])
def test_fedcb_fedbm_table_configs_plan(name):
    from bench.assembly.config import result_config
    from bench.assembly.experiment import method_arg_names
    from bench.scheduling.table_runner import load_table_config, plan_runs
    from lightning_modules.base import METHODS

    spec = load_table_config(str(REPO / "configs" / "tables" / f"{name}.yaml"))
    runs = plan_runs(spec)
    first: dict = {}
    for r in runs:  # runs shown under several rows (ablation tables) share a record only when identical
        other = first.setdefault((r.cfg.run_name(), r.cfg.experiment), r)
        assert result_config(other.cfg.to_dict()) == result_config(r.cfg.to_dict()), (other.label, r.label)
    for r in runs:
        assert set(r.cfg.method.args) <= method_arg_names(METHODS.get(r.cfg.method.name)), r.label
    if name == "table2_kvasir":  # per-beta settings of the public code's Kvasir runs
        taus = {(r.cfg.method.name, r.beta): r.cfg.method.args["tau"] for r in runs if r.label in ("FedCB", "FedBM")}
        assert taus == {("fedcb", 0.05): 12.5, ("fedcb", 0.1): 7.5, ("fedbm", 0.05): 12.5, ("fedbm", 0.1): 7.5}


def test_table_rows_restricted_to_betas_must_cover_every_column():
    from bench.scheduling.table_runner import plan_runs
    from bench.tables.table_spec import TableSpec

    spec = {"table": "t", "dataset": "d", "betas": [0.05, 0.1], "seeds": [0],
            "rows": [{"label": "A", "betas": [0.05], "method": {"name": "fedavg"}}]}
    with pytest.raises(FedbenchError, match=r"no run for beta\(s\) \[0.1\]"):
        plan_runs(TableSpec.parse(spec, "t.yaml"))
    spec["rows"][0]["betas"] = [0.3]
    with pytest.raises(FedbenchError, match="not all in the table"):
        plan_runs(TableSpec.parse(spec, "t.yaml"))


# ---- Random (Freezing): FedAvg with a frozen random linear classifier (FedCB Sec. 1, FedBM Table VIII)
def test_random_freezing_is_fedavg_with_a_frozen_random_linear_head(tiny_cfg, captured):
    """FedCB Sec. 1: "the server randomly initializes the global classifier and broadcasts it to all
    clients ... we freeze local classifiers, and only train and upload feature extractors"."""
    run_in_process(tiny_cfg(**{"method.name": "fedavg-random-frozen", "method.backbone": "simple-cnn",
                                "partition.num_clients": 4, "fed.rounds": 2, "fed.sample_ratio": 1.0}))
    fed = captured["fed"]
    module, initial = fed.module, captured["initial_state"]
    head_keys = {"head.weight", "head.bias"}
    # the head: PyTorch's nn.Linear(feature_dim, K) initialisation, U(-1/sqrt(d), 1/sqrt(d))
    assert isinstance(module.head, torch.nn.Linear) and module.head.weight.shape == (10, module.feature_dim)
    bound = module.feature_dim ** -0.5
    assert float(initial["head.weight"].abs().max()) <= bound and float(initial["head.bias"].abs().max()) <= bound
    assert float(initial["head.weight"].std()) > bound / 3  # uniform on [-bound, bound]: std bound/sqrt(3)
    # frozen: not trained (no gradient), never aggregated or communicated, the same in every round
    assert not any(p.requires_grad for p in module.head.parameters())
    assert not head_keys & set(module.shared_keys()) and not head_keys & set(fed.global_state)
    final = module.state_dict()
    assert all(torch.equal(final[k], initial[k]) for k in head_keys)
    assert not torch.equal(final["backbone.body.0.weight"], initial["backbone.body.0.weight"])  # the body trains
    # logits are plain linear: W f(x) + b, no normalisation, projection or temperature; loss plain CE
    x = torch.randn(5, 1, 8, 8)
    y = torch.tensor([0, 3, 9, 1, 1])
    module.eval()
    with torch.no_grad():
        f = module.features(x)
        logits = f @ initial["head.weight"].T + initial["head.bias"]
        assert torch.allclose(module.eval_logits(x), logits, atol=1e-6)
        ctx = ClientContext(0, 0, 0, DeviceData(x, y, torch.zeros(1), torch.ones(1)), torch.arange(5), 10, {},
                            torch.Generator().manual_seed(0))
        loss = module.client_objective(ctx)((x, y))
    assert float(loss) == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-6)


def test_random_freezing_head_starts_as_fedavgs_head(tiny_cfg):
    """The same seeded draw as FedAvg's (trainable) head: PyTorch's default nn.Linear initialisation."""
    from bench.assembly.experiment import build_module
    from bench.assembly.run_data import build_datamodule

    heads = {}
    for method in ("fedavg", "fedavg-random-frozen"):
        cfg = tiny_cfg(**{"method.name": method, "method.backbone": "simple-cnn"})
        dm = build_datamodule(cfg)
        dm.setup()
        heads[method] = build_module(cfg, dm).head
    assert torch.equal(heads["fedavg"].weight, heads["fedavg-random-frozen"].weight)
    assert torch.equal(heads["fedavg"].bias, heads["fedavg-random-frozen"].bias)
    assert heads["fedavg"].weight.requires_grad and not heads["fedavg-random-frozen"].weight.requires_grad
