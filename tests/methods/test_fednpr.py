"""FedNPR / FedNPR-Per / FedAvg+NPR (issue 4): personal heads, local prototypes, the local loss,
rank invariance, the Fed-ISIC2019 and RSNA-ICH loaders, and the offline EfficientNet-Lite0 weights."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import Killed, max_state_diff, run_in_process, stop_after
from official_layouts import ICH_SUBTYPES as SUBTYPES
from official_layouts import build_isic, build_rsna_csv
from official_layouts import ich_grey as grey
from official_layouts import isic_colour as colour
from PIL import Image

from bench.assembly.experiment import build_module, make_fabric
from bench.assembly.run_data import build_datamodule, client_splits, to_device
from bench.assembly.run_plan import eval_protocol, plan_rounds
from bench.core.batches import DeviceData
from bench.core.errors import DatasetNotFoundError
from bench.engine.federation import Federation
from datamodules.base import DATASETS
from datamodules.partition import partition
from lightning_modules.base import ClientContext
from lightning_modules.components.balanced_softmax import balanced_softmax_loss, class_log_prior
from lightning_modules.components.npr import npr_loss, update_prototypes
from lightning_modules.fednpr import PROTOTYPES_KEY

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out


# ---- helpers ------------------------------------------------------------------------------------
def npr_cfg(tiny_cfg, method: str, **overrides):
    base = {"method.name": method, "method.backbone": "simple-cnn", "data.image_size": 16,
            "partition.num_clients": 4, "fed.sample_ratio": 1.0, "fed.rounds": 2,
            "method.optimizer": "adam", "method.lr": 1e-3}
    return tiny_cfg(**{**base, **overrides})


def make_federation(cfg, module=None) -> Federation:
    """The Federation run_experiment would build (one in-process rank), to inspect client state
    (``module``: use this method instance instead of the registered ``cfg.method.name``)."""
    fabric = make_fabric(cfg)
    fabric.launch()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    dm = build_datamodule(cfg)
    dm.setup()
    p = cfg.partition
    part = partition(dm.train.labels.numpy(), p.scheme, p.num_clients, cfg.seed, **p.args)
    module = module if module is not None else build_module(cfg, dm)
    fabric.to_device(module)
    train, val, test = (to_device(s, dm, fabric.device) for s in (dm.train, dm.val, dm.test))
    clients = client_splits(cfg, part.client_indices, dm.train, module.protocol == "per_client", fabric.device)
    return Federation(fabric, plan_rounds(cfg, eval_protocol(cfg, module)), module, train, clients, val, test)


def model_as_loaded(fed: Federation, c: int) -> dict[str, torch.Tensor]:
    """The full model client c starts its next round with (global shared state + its personal part)."""
    fed.load_client_model(c)
    return {k: v.clone() for k, v in fed.module.state_dict().items()}


def toy_context(module, n: int = 96, seed: int = 0, round_idx: int = 0) -> ClientContext:
    """A client with imbalanced labels (class 0 dominant, class 9 absent) on random 16 px images."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.cat([torch.zeros(n // 2, dtype=torch.long), torch.randint(1, 9, (n - n // 2,), generator=g)])
    images = torch.randint(0, 256, (n, 1, 16, 16), dtype=torch.uint8, generator=g)
    data = DeviceData(images, labels, torch.full((1, 1, 1, 1), 0.3), torch.full((1, 1, 1, 1), 0.37))
    return ClientContext(client_id=0, round_idx=round_idx, seed=seed, data=data, indices=torch.arange(n),
                         num_classes=module.num_classes, global_state={}, state={},
                         generator=torch.Generator().manual_seed(seed + 1))


def toy_module(name: str = "fednpr", **args):
    from lightning_modules.base import METHODS

    torch.manual_seed(0)
    return METHODS.get(name)(num_classes=10, in_channels=1, backbone="simple-cnn", optimizer="adam", lr=1e-3, **args)


# ---- federated behaviour --------------------------------------------------------------------------
def test_fednpr_per_heads_personal_everything_else_shared(tiny_cfg):
    fed = make_federation(npr_cfg(tiny_cfg, "fednpr-per"))
    assert fed.personal == ["head.weight", "head.bias"]
    assert not any(k.startswith("head.") for k in fed.shared)
    fed.run_round(0)
    models = [model_as_loaded(fed, c) for c in range(4)]
    for c in range(4):  # each client's head is the one it trained, not an average
        for k in fed.personal:
            assert torch.equal(models[c][k], fed.client_states[c]["personal"][k])
    for a in range(4):
        for b in range(a + 1, 4):
            assert (models[a]["head.weight"] - models[b]["head.weight"]).abs().max() > 1e-4
            for k in models[a]:
                if not k.startswith("head."):
                    assert torch.equal(models[a][k], models[b][k]), k
    # and the heads moved away from the common initial head
    assert all((m["head.weight"] - fed.initial_personal["head.weight"]).abs().max() > 1e-4 for m in models)


def test_fednpr_prototypes_local_unit_norm_and_refreshed_from_received_model(tiny_cfg):
    cfg = npr_cfg(tiny_cfg, "fednpr", **{"method.args": {"num_subclusters": 3}})
    fed = make_federation(cfg)
    module = fed.module
    assert fed.personal == [] and set(fed.shared) == set(module.state_dict())  # all state averaged
    assert not any("proto" in k for k in module.state_dict()) and module.server_side.upload_shapes() == {}
    fed.run_round(0)
    protos0 = {c: fed.client_states[c][PROTOTYPES_KEY].clone() for c in range(4)}
    for c, p in protos0.items():
        assert p.shape == (10, 3, module.feature_dim) and not p.requires_grad
        assert torch.allclose(p.norm(dim=-1), torch.ones(10, 3), atol=1e-5)
    assert (protos0[0] - protos0[1]).abs().max() > 1e-3  # each client its own
    received = {k: v.clone() for k, v in fed.global_state.items()}
    fed.run_round(1)
    for c in range(4):  # round 1 refreshed them by Sinkhorn on features of the model received in round 1
        fed.module.load_state_dict(received)
        fed.module.eval()
        idx = fed.clients[c].train
        with torch.no_grad():
            feats = fed.module.features(fed.data.to_float(idx)[0])
        expected = update_prototypes(feats, fed.data.labels[idx], protos0[c], 0.05, 100, "paper")
        got = fed.client_states[c][PROTOTYPES_KEY]
        assert torch.allclose(got, expected, atol=1e-5)
        assert torch.allclose(got.norm(dim=-1), torch.ones(10, 3), atol=1e-5)
        assert (got - protos0[c]).abs().max() > 1e-3


def test_npr_gradient_reaches_backbone_only_and_never_moves_prototypes():
    module = toy_module("fednpr", lam=0.5)
    ctx = toy_context(module)
    module.train()
    objective = module.client_objective(ctx)  # refreshes the client's prototypes into ctx.state
    before = ctx.state[PROTOTYPES_KEY].clone()
    assert not before.requires_grad and before.shape == (10, 4, module.feature_dim)
    x, y = ctx.data.to_float(ctx.indices[:32])
    npr_loss(module.features(x), y, ctx.state[PROTOTYPES_KEY]).backward()
    assert module.head.weight.grad is None and module.head.bias.grad is None
    assert all(p.grad is not None and p.grad.abs().sum() > 0
               for n, p in module.backbone.named_parameters() if n.endswith("weight"))
    assert ctx.state[PROTOTYPES_KEY].grad is None
    opt = module.configure_optimizers()
    for i in range(3):  # full local steps: the prototypes stay exactly what the round start computed
        opt.zero_grad()
        objective(ctx.data.to_float(ctx.indices[32 * i: 32 * (i + 1)])).backward()
        opt.step()
    assert torch.equal(ctx.state[PROTOTYPES_KEY], before)
    assert not any("proto" in k for k in module.state_dict())  # never on the module, never aggregated


@pytest.mark.parametrize("variant,lam,weight", [("paper", 0.3, 0.3), ("public_code", 0.3, 1.0)])
def test_local_loss_is_bsm_plus_weighted_npr_and_eval_uses_plain_logits(variant, lam, weight):
    module = toy_module("fednpr", lam=lam, npr_variant=variant)
    ctx = toy_context(module)
    module.train()
    objective = module.client_objective(ctx)
    assert module.terms["npr"].weight == weight
    x, y = ctx.data.to_float(ctx.indices[:40])
    torch.manual_seed(1)
    loss = objective((x, y))
    torch.manual_seed(1)
    feats = module.features(x)
    logits = module.head(feats)
    prior = class_log_prior(ctx.labels, 10)
    assert prior[0] > prior[1] and prior[9] < -20  # the client's imbalance, absent class ~ log(1e-9)
    bsm = balanced_softmax_loss(logits, y, prior)
    npr = npr_loss(feats, y, ctx.state[PROTOTYPES_KEY])
    assert torch.allclose(loss, bsm + weight * npr, atol=1e-6)
    assert abs(float(bsm.detach() - F.cross_entropy(logits, y).detach())) > 1e-3  # BSM is not plain CE here
    assert abs(float(npr.detach())) > 1e-3 and not torch.allclose(loss, bsm + (1.3 - weight) * npr, atol=1e-4)
    module.eval()
    with torch.no_grad():
        assert torch.allclose(module.eval_logits(x), module.head(module.features(x)))


def test_public_code_variant_draws_assignments_from_the_client_generator():
    module = toy_module("fednpr", npr_variant="public_code")
    a, b, c = toy_context(module), toy_context(module), toy_context(module)
    c.generator = torch.Generator().manual_seed(99)
    module.eval()
    pa, pb, pc = (module.terms["npr"].client_prototypes(module, ctx) for ctx in (a, b, c))
    assert torch.equal(pa, pb) and (pa - pc).abs().max() > 1e-3
    paper = toy_module("fednpr")
    assert (paper.terms["npr"].client_prototypes(paper, toy_context(paper)) - pa).abs().max() > 1e-3


def test_fedavg_npr_without_weight_skips_npr():
    module = toy_module("fedavg-npr", lam=0.0)
    ctx = toy_context(module)
    module.train()
    objective = module.client_objective(ctx)
    assert PROTOTYPES_KEY not in ctx.state  # never computed
    x, y = ctx.data.to_float(ctx.indices[:32])
    assert torch.allclose(objective((x, y)), F.cross_entropy(module(x), y))


def test_npr_composes_with_another_method_in_a_few_lines(tiny_cfg):
    """FedBABU + NPR (FedNPR, Table 6; lightning_modules/fedbabu_npr.py) on the per-client contract:
    the NPR options come from its NPR objective term (module.terms["npr"]), added to FedBABU's feature loss; FedBABU's head stays frozen
    and its evaluation fine-tuning (a phase outside the objective) gets no NPR."""
    from lightning_modules.fedbabu_npr import FedBABUNPR

    def build():
        torch.manual_seed(0)
        return FedBABUNPR(num_classes=10, in_channels=1, backbone="simple-cnn", optimizer="adam", lr=1e-3,
                          lam=0.5, num_subclusters=2, finetune_epochs=1)

    module = build()
    ctx = toy_context(module)
    module.train()
    objective = module.client_objective(ctx)
    x, y = ctx.data.to_float(ctx.indices[:40])
    feats = module.features(x)
    expected = F.cross_entropy(module.head(feats), y) + 0.5 * npr_loss(feats, y, ctx.state[PROTOTYPES_KEY])
    assert torch.allclose(objective((x, y)), expected, atol=1e-6)

    fed = make_federation(npr_cfg(tiny_cfg, "fedbabu"), module=build())
    head = fed.module.head.weight.detach().clone()
    body = fed.global_state["backbone.body.0.weight"].clone()
    fed.run_round(0)
    assert all(fed.client_states[c][PROTOTYPES_KEY].shape == (10, 2, module.feature_dim) for c in range(4))
    assert torch.equal(fed.module.head.weight, head) and "head.weight" not in fed.shared
    assert not torch.equal(fed.global_state["backbone.body.0.weight"], body)
    assert len(fed.client_metrics) == 4  # every client fine-tuned and evaluated


def test_fednpr_per_resumes_with_its_prototypes_and_heads(tiny_cfg):
    from bench.assembly.run_plan import checkpoint_plan
    from bench.engine.checkpoint import Checkpointer

    base = {"fed.rounds": 3, "checkpoint_every": 1, "fed.sample_ratio": 0.5, "method.args": {"num_subclusters": 2}}
    full_rec, full_state = run_in_process(npr_cfg(tiny_cfg, "fednpr-per", experiment="full", **base))
    killed = npr_cfg(tiny_cfg, "fednpr-per", experiment="killed", **base)
    with pytest.raises(Killed):
        run_in_process(killed, stop_after(0))
    # the checkpoint of round 0 holds every trained client's prototypes and personal head
    checkpointer = Checkpointer(checkpoint_plan(killed), None)
    snapshot, clients = checkpointer.read(checkpointer.latest())
    assert snapshot["round"] == 0 and any(clients.values())
    assert all(PROTOTYPES_KEY in s and "personal" in s for s in clients.values() if s)
    resumed_rec, resumed_state = run_in_process(npr_cfg(tiny_cfg, "fednpr-per", experiment="killed", resume=True, **base))
    assert max_state_diff(full_state, resumed_state) == 0.0
    assert [h["metrics"] for h in resumed_rec["history"]] == [h["metrics"] for h in full_rec["history"]]


@pytest.mark.ddp
def test_fednpr_same_global_model_with_one_and_two_ranks(two_rank_runs, tmp_path):
    """npr_cfg's FedNPR with half of the clients per round, 3 rounds, 2 subclusters (tests/rank_pairs.py;
    the 2-rank side from the shared launch)."""
    record, state1 = run_in_process(two_rank_runs.one_cfg("fednpr", tmp_path))
    two_record, state2 = two_rank_runs.two("fednpr")
    diff = max_state_diff(state1, state2)
    assert diff <= 1e-6, f"fednpr: 1 vs 2 ranks differ by {diff}"
    bacc = record["final"]["test/balanced_accuracy"]
    assert math.isfinite(bacc) and bacc > 30.0 and record["final"]["clients_evaluated"] >= 2
    assert abs(two_record["final"]["test/balanced_accuracy"] - bacc) < 1e-6  # per-client scores reduced alike


# ---- data -------------------------------------------------------------------------------------
@pytest.mark.parametrize("with_target", [True, False])
def test_fed_isic2019_reads_flamby_layout_with_centres(tmp_path, with_target):
    build_isic(tmp_path / "isic", with_target)
    dm = DATASETS.get("fed-isic2019")(root=str(tmp_path / "isic"), image_size=16, cache_dir=str(tmp_path / "c"),
                                      val_fraction=0.2)
    assert dm.num_classes == 8 and dm.default_image_size == 224
    splits = dm.decode()
    assert {k: len(v) for k, v in splits.items()} == {"train": 96, "test": 48}
    for split in splits.values():
        assert split.images.shape[1:] == (3, 16, 16)
        pix = split.images[:, :, 8, 8].float()
        want = torch.tensor([colour(int(y), int(g)) for y, g in zip(split.labels, split.groups)]).float()
        assert (pix - want).abs().max() <= 6  # each image decoded under its own label and centre
    dm.setup()
    part = partition(dm.train.labels.numpy(), "natural", 6, 0, groups=dm.train.groups.numpy())
    assert [set(dm.train.groups[idx].tolist()) for idx in part.client_indices] == [{c} for c in range(6)]


def test_fed_isic2019_clients_train_on_their_centre_train_fold_and_test_on_its_test_fold(tmp_path, tiny_cfg,
                                                                                          captured):
    """fed.client_test site + data.val_fraction 0 (FedNPR's and FLamby's 80/20 per centre): client c trains on
    the whole train fold of centre c and is scored on that centre's test fold, none of it carved from train."""
    from bench.engine.evaluation import predict_probs
    from bench.engine.federation import copy_into
    from bench.engine.metrics import classification_metrics

    build_isic(tmp_path / "isic")
    cfg = tiny_cfg(**{"data.name": "fed-isic2019", "data.root": str(tmp_path / "isic"), "data.image_size": 16,
                      "data.val_fraction": 0.0, "partition.scheme": "natural", "partition.num_clients": 6,
                      "method.name": "local", "fed.protocol": "per_client", "fed.client_test": "site",
                      "fed.rounds": 2, "fed.sample_ratio": 1.0, "fed.batch_size": 8})
    record, _ = run_in_process(cfg)
    assert record["splits"] == {"train": 96, "val": 0, "test": 48}
    fed = captured["fed"]
    want = []
    for c, split in enumerate(fed.clients):
        assert split.test_data is fed.test and len(split.train) == 16 and len(split.test) == 8
        for data, idx in ((fed.data, split.train), (fed.test, split.test)):  # the green channel codes the centre
            assert (data.images[idx, 1, 8, 8].float() - colour(0, c)[1]).abs().max() <= 6
        assert sorted(fed.test.labels[split.test].tolist()) == list(range(8))  # one test image per class
        copy_into(fed.model_state, fed.client_states[c]["personal"])
        probs = predict_probs(fed.module, fed.test, split.test, fed.fabric)
        want.append(classification_metrics(probs, fed.test.labels[split.test], 8)["balanced_accuracy"])
    assert record["history"][-1]["metrics"]["test/balanced_accuracy"] == pytest.approx(sum(want) / 6, abs=1e-9)


def test_fed_isic2019_missing_files_say_what_to_do(tmp_path):
    dm = DATASETS.get("fed-isic2019")(root=str(tmp_path / "nowhere"), cache_dir=str(tmp_path / "c"))
    with pytest.raises(DatasetNotFoundError, match="not found .*FLamby.*train_test_split"):
        dm.setup()
    root = tmp_path / "isic"
    rows = build_isic(root)
    (root / "ISIC_2019_Training_Input_preprocessed" / f"{rows[5][0]}.jpg").unlink()
    dm = DATASETS.get("fed-isic2019")(root=str(root), image_size=16, cache_dir=str(tmp_path / "c"))
    with pytest.raises(DatasetNotFoundError, match=f"1 image.*missing.*{rows[5][0]}.jpg"):
        dm.decode()
    (root / "train_test_split").unlink()
    with pytest.raises(DatasetNotFoundError, match="no train_test_split or train_test_split.csv"):
        dm.decode()


def test_rsna_ich_csv_layout_keeps_single_subtype_slices(tmp_path):
    keep = build_rsna_csv(tmp_path / "ich")
    dm = DATASETS.get("rsna-ich")(root=str(tmp_path / "ich"), image_size=16, cache_dir=str(tmp_path / "c"))
    assert dm.in_channels == 1 and dm.default_image_size == 128 and dm.num_classes == 5
    splits = dm.decode()
    assert len(splits["train"]) + len(splits["test"]) == len(keep) == 50
    assert len(splits["test"]) == 5  # fixed stratified 90/10: one per class
    for split in splits.values():
        assert split.images.shape[1:] == (1, 16, 16)
        assert torch.equal(split.images[:, 0, 8, 8].long(), torch.tensor([grey(int(y)) for y in split.labels]))
    assert sorted(np.bincount(np.concatenate([s.labels.numpy() for s in splits.values()])).tolist()) == [10] * 5
    dm.setup()
    part = partition(dm.train.labels.numpy(), "dirichlet_missing", 3, 0, beta=0.5, min_size=2, missing_prob=0.5)
    assert sum(part.sizes()) == len(dm.train)


def test_rsna_ich_class_folders_and_missing_files(tmp_path):
    root = tmp_path / "folders"
    for label, name in enumerate(SUBTYPES):
        (root / name).mkdir(parents=True)
        for i in range(10):
            Image.new("L", (12, 12), grey(label)).save(root / name / f"s{i}.png")
    splits = DATASETS.get("rsna-ich")(root=str(root), image_size=16, cache_dir=str(tmp_path / "c")).decode()
    assert torch.equal(splits["train"].images[:, 0, 4, 4].long(), torch.tensor([grey(int(y)) for y in splits["train"].labels]))
    with pytest.raises(DatasetNotFoundError, match="not found .*stage_2_train.csv"):
        DATASETS.get("rsna-ich")(root=str(tmp_path / "absent"), cache_dir=str(tmp_path / "c")).setup()
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match="neither stage_2_train.csv nor stage_1_train.csv nor class folders"):
        DATASETS.get("rsna-ich")(root=str(tmp_path / "empty"), cache_dir=str(tmp_path / "c")).decode()
    keep = build_rsna_csv(tmp_path / "ich")
    (tmp_path / "ich" / "images" / f"{sorted(keep)[3]}.png").unlink()
    with pytest.raises(DatasetNotFoundError, match=f"1 of the 50 single-subtype slices .*{sorted(keep)[3]}"):
        DATASETS.get("rsna-ich")(root=str(tmp_path / "ich"), cache_dir=str(tmp_path / "c")).decode()


# ---- offline ImageNet weights -------------------------------------------------------------------
def test_efficientnet_lite0_loads_every_tensor_from_the_packaged_file():
    from lightning_modules.backbones import build_backbone
    from lightning_modules.pretrained import load_file_state, mapped_state, timm_name

    file_state = load_file_state()
    net, dim = build_backbone("efficientnet_lite0", 3, pretrained=True)
    assert dim == 1280
    state = net.state_dict()
    mapped = mapped_state(3, with_classifier=False)
    assert set(state) == set(mapped) and len(state) == len(file_state) - 2  # all but _fc.weight/_fc.bias
    for key, value in file_state.items():
        if not key.startswith("_fc."):
            assert torch.equal(state[timm_name(key)], value), key
    torch.manual_seed(0)
    x = torch.randn(2, 3, 64, 64)
    random_net, _ = build_backbone("efficientnet_lite0", 3, pretrained=False)
    assert not torch.equal(random_net.state_dict()["blocks.3.1.conv_dw.weight"], state["blocks.3.1.conv_dw.weight"])
    with torch.no_grad():
        assert (net.eval()(x) - random_net.eval()(x)).abs().max() > 0.1
    grey_net, _ = build_backbone("efficientnet_lite0", 1, pretrained=True)  # stem = sum of the RGB kernels
    g = torch.rand(2, 1, 64, 64)
    with torch.no_grad():
        assert torch.allclose(grey_net.eval()(g), net(g.expand(-1, 3, -1, -1)), atol=1e-4)


def test_efficientnet_lite0_weights_classify_a_photograph():
    from sklearn.datasets import load_sample_images

    from lightning_modules.pretrained import build_lite0

    china = torch.tensor(load_sample_images().images[0]).permute(2, 0, 1)[None].float() / 255  # a temple
    x = F.interpolate(china, size=(256, 384), mode="bilinear", antialias=True)[:, :, 16:240, 80:304]
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    with torch.no_grad():
        probs = build_lite0(3, num_classes=1000).eval()((x - mean) / std).softmax(1)[0]
    top = probs.topk(3).indices.tolist()
    buildings = {698, 442, 497, 538, 663, 832}  # palace, bell cote, church, dome, monastery, stupa
    assert top[0] in buildings and set(top) <= buildings | {449, 975} and probs[top[0]] > 0.2


# ---- table configs ------------------------------------------------------------------------------
@pytest.mark.parametrize("dataset", ["isic", "ich", "fashion-mnist"])
def test_fednpr_table_configs_follow_the_paper_protocol(dataset):
    from bench.scheduling.table_runner import load_table_config, plan_runs
    from lightning_modules.base import METHODS

    spec = load_table_config(f"configs/tables/fednpr_{dataset}.yaml")
    runs = plan_runs(spec)
    assert spec.metrics == ("balanced_accuracy", "auc")
    # one record per row and seed: rows must not share a run name, or they overwrite each other's records
    assert len({r.cfg.run_name() for r in runs}) == len(runs)
    for r in runs:
        c = r.cfg
        assert (c.fed.protocol or METHODS.get(c.method.name).protocol) == "per_client" and c.fed.sample_ratio == 1.0
        assert (c.method.optimizer, c.method.lr, c.method.weight_decay, c.fed.batch_size) == ("adam", 1e-3, 5e-4, 64)
        assert c.fed.local_epochs == 1 and c.fed.client_test_fraction == 0.2 and c.data.augment == "npr"
        if dataset != "fashion-mnist":
            assert (c.fed.rounds, c.fed.lr_milestones, c.fed.lr_gamma) == (80, [60, 70], 0.1)
            assert (c.method.backbone, c.method.pretrained) == ("efficientnet_b0", True)
    if dataset == "isic":
        assert {(r.cfg.partition.scheme, r.cfg.partition.num_clients, r.cfg.data.name) for r in runs} == {
            ("natural", 6, "fed-isic2019")}
    if dataset == "ich":  # FedNPR's published split: its 10 clients as sites
        assert {(r.cfg.partition.scheme, r.cfg.partition.num_clients, r.cfg.data.name, r.cfg.fed.client_test)
                for r in runs} == {("natural", 10, "rsna-ich", "site")}
        assert {Path(r.cfg.data.client_split_file).name for r in runs} == {"ich_datasplit_10cl.npy"}
