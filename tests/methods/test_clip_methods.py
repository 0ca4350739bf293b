"""The CLIP methods on a frozen-feature cache (issue 5): FACMIC, FedCLIP, CLIP-ZS, CLIP-FC, FST-CBDG.

Runs use sklearn digits and the offline tiny random CLIP (64-d features); a synthetic "CLIP" with
a biased zero-shot classifier checks that FST-CBDG learns something without labels.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import max_state_diff, run_in_process

from bench.assembly.experiment import build_module
from bench.assembly.run_data import build_datamodule, to_device
from bench.assembly.run_outputs import RunObserver
from bench.core.batches import DeviceData, EpochBatches
from bench.core.seeding import torch_generator
from lightning_modules.base import ClientContext
from lightning_modules.clip_feature_base import ClipFeatureModule, shared_clip
from lightning_modules.components.clip_heads import FeatureAttention, FedClipAdapter
from lightning_modules.components.clip_models import preprocess_uint8

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

EMBED = 64  # tiny-random CLIP's embed_dim


@pytest.fixture
def clip_cfg(tiny_cfg, tmp_path):
    """tiny_cfg for a CLIP method, with its feature cache under tmp_path; the test set is scored every
    round (the tests compare per-round curves)."""

    def make(method: str, args: dict | None = None, **overrides):
        args = {"feature_cache_dir": str(tmp_path / "features"), **(args or {})}
        return tiny_cfg(**{"method.name": method, "method.args": args, "experiment": method,
                           "fed.test_rounds": "all", **overrides})

    return make


def state_bytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def prepared(cfg):
    """(datamodule, module, (train, val, test)) as run_experiment builds them, on the CPU."""
    dm = build_datamodule(cfg)
    dm.setup()
    module = build_module(cfg, dm)
    splits = module.prepare_splits(*(to_device(s, dm, "cpu") for s in (dm.train, dm.val, dm.test)))
    return dm, module, splits


# ---------------------------------------------------------------- the encoder runs once


def test_rounds_never_run_the_image_encoder(clip_cfg):
    clip = shared_clip("tiny-random")
    seen: dict[str, int] = {}

    class Counting(RunObserver):
        def federation_built(self, federation) -> None:  # the splits are encoded: the rounds start
            seen["rounds_start"] = clip.image_encoder_calls

        def round_done(self, r: int) -> None:
            seen["rounds_end"] = clip.image_encoder_calls

    start = clip.image_encoder_calls
    record, state = run_in_process(clip_cfg("facmic"), Counting())
    assert len(record["history"]) == 3 and all(h["samples_trained"] > 0 for h in record["history"])
    assert seen["rounds_end"] == seen["rounds_start"], "a round ran the image encoder"
    encoded = seen["rounds_start"] - start  # prepare_splits: one call per 256 images of each split
    assert encoded == sum(math.ceil(n / 256) for n in record["splits"].values()) > 0
    # what is communicated is the attention module and nothing else
    attention = FeatureAttention(EMBED).state_dict()
    assert {k.removeprefix("head.") for k in state} == set(attention)
    assert record["bytes_per_client_round"] == {"up": state_bytes(attention), "down": state_bytes(attention)}

    start = clip.image_encoder_calls  # another method on the same data: every feature comes from the cache
    record2, _ = run_in_process(clip_cfg("fst-cbdg"))
    assert clip.image_encoder_calls == start
    assert all(h["samples_trained"] > 0 for h in record2["history"])
    # unsupervised: no labeled validation split, so the reported metrics are the final round's
    assert "val/accuracy" not in record2["history"][-1]["metrics"] and record2["best_round"] == 2


def test_state_dict_is_only_the_head(clip_cfg):
    clip = shared_clip("tiny-random")
    clip_numel = sum(p.numel() for p in clip.model.parameters())
    linear = torch.nn.Linear(EMBED, 10).state_dict()
    expected = {"facmic": FeatureAttention(EMBED).state_dict(), "fedclip": FedClipAdapter(EMBED).state_dict(),
                "clip-zs": linear, "clip-fc": linear, "clip-fc-central": linear, "fst-cbdg": linear}
    for method, head in expected.items():
        cfg = clip_cfg(method)
        dm = build_datamodule(cfg)
        dm.setup()
        module = build_module(cfg, dm)
        state = module.state_dict()
        assert {k.removeprefix("head.") for k in state} == set(head), method
        assert all(k.startswith("head.") for k in state), method
        assert state_bytes(state) == state_bytes(head), method
        assert sum(t.numel() for t in state.values()) < clip_numel / 100, method
        # what is aggregated and communicated: the head, except CLIP-ZS's frozen zero-shot head
        assert module.shared_keys() == ([] if method == "clip-zs" else list(state)), method
        assert module.text_features.shape == (10, EMBED)  # a buffer, but not persistent


# ---------------------------------------------------------------- CLIP-ZS and FST-CBDG at round 0


def test_fst_cbdg_starts_exactly_at_zero_shot(clip_cfg):
    dm, module, (train, val, test) = prepared(clip_cfg("fst-cbdg"))
    clip = module.frozen_clip
    text = clip.encode_texts([f"a photo of a {c}." for c in dm.class_names])
    images = clip.encode_images(preprocess_uint8(dm.test.images, clip.image_size, clip.mean, clip.std))
    zero_shot = (F.normalize(images, dim=-1) @ F.normalize(text, dim=-1).T).argmax(dim=1)
    module.eval()
    with torch.no_grad():
        assert torch.equal(module.eval_logits(test.images).argmax(dim=1), zero_shot)
        assert torch.equal(module.head.bias, torch.zeros(10))
    # no labeled val split (no label-based model selection); the test split keeps its labels for
    # evaluation; training batches carry sample positions, never labels (see the scramble test below)
    assert val is None and torch.equal(test.labels, dm.test.labels)
    # soft pseudo-labels start at the zero-shot probabilities (Eq. 2, no temperature)
    idx = torch.arange(5, 45)
    ctx = ClientContext(0, 0, 0, train, idx, 10, {}, generator=torch_generator(1))
    x, rows = next(iter(module.client_batches(ctx)))  # the synthetic features are drawn per iteration
    assert torch.equal(x, train.images[idx[rows]])
    p = torch.softmax(F.normalize(train.images[idx], dim=-1) @ F.normalize(text, dim=-1).T, dim=-1)
    assert torch.allclose(ctx.state["q"], p, atol=1e-6)
    assert float(p.max()) < 0.2  # near-uniform, as the paper's Fig. 2 describes


def test_clip_zero_shot_run_is_zero_shot_and_trains_nothing(clip_cfg):
    record, state = run_in_process(clip_cfg("clip-zs"))
    dm, module, (_, _, test) = prepared(clip_cfg("clip-zs"))
    clip = module.frozen_clip
    text = clip.encode_texts([f"a photo of a {c}." for c in dm.class_names])
    pred = (F.normalize(test.images, dim=-1) @ F.normalize(text, dim=-1).T).argmax(dim=1)
    accuracy = 100.0 * float((pred == test.labels).double().mean())
    assert record["bytes_per_client_round"] == {"up": 0, "down": 0}
    assert torch.allclose(state["head.weight"], clip.logit_scale * F.normalize(text, dim=-1), atol=1e-5)
    assert all(h["samples_trained"] == 0 for h in record["history"])
    assert [h["metrics"]["test/accuracy"] for h in record["history"]] == pytest.approx([accuracy] * 3, abs=1e-9)


# ---------------------------------------------------------------- FST-CBDG is unsupervised


def scramble_train_labels(monkeypatch) -> None:
    """Make every run permute the training labels right after the datamodule is set up."""
    from bench.assembly import run_data

    real_build = run_data.build_datamodule

    def build(cfg):
        dm = real_build(cfg)
        real_setup = dm.setup

        def setup(stage=None):
            real_setup(stage)
            perm = torch.randperm(len(dm.train.labels), generator=torch.Generator().manual_seed(123))
            dm.train.labels = dm.train.labels[perm]

        dm.setup = setup
        return dm

    monkeypatch.setattr(run_data, "build_datamodule", build)


def test_fst_cbdg_training_never_reads_a_label(clip_cfg, monkeypatch):
    iid = {"partition.scheme": "iid", "method.lr": 0.05}
    _, true_state = run_in_process(clip_cfg("fst-cbdg", experiment="true", **iid))
    _, true_probe = run_in_process(clip_cfg("clip-fc", experiment="true", **iid))
    scramble_train_labels(monkeypatch)
    _, scrambled_state = run_in_process(clip_cfg("fst-cbdg", experiment="scrambled", **iid))
    _, scrambled_probe = run_in_process(clip_cfg("clip-fc", experiment="scrambled", **iid))
    assert max_state_diff(true_state, scrambled_state) == 0.0
    assert max_state_diff(true_probe, scrambled_probe) > 1e-4  # the scramble does reach a supervised method
    text = F.normalize(shared_clip("tiny-random").encode_texts(
        [f"a photo of a {c}." for c in ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight",
                                        "nine"]]), dim=-1)
    assert float((true_state["head.weight"] - text).abs().max()) > 1e-4  # and the head did train


def test_fst_cbdg_draws_eq5_eq7_afresh_every_iteration_and_sums_eq6(clip_cfg):
    """Algorithm 1, lines 14-17: each iteration updates q of its batch (Eq. 4), then draws n_k (Eq. 7,
    from the client's updated pseudo-labels) features per class (Eq. 5) from the client's generator
    and adds lambda times their SUMMED cross-entropy (Eq. 6); nothing else consumes the generator."""
    _, module, (train, _, _) = prepared(clip_cfg("fst-cbdg", {"gamma": 0.5, "sigma": 0.05, "tsamp_weight": 0.7}))
    idx = torch.arange(0, 300, 3)
    ctx = ClientContext(0, 0, 0, train, idx, 10, {}, generator=torch_generator(7), batch_size=32)
    module.train()
    batches, objective = module.client_batches(ctx), module.client_objective(ctx)
    assert len(batches) == len(EpochBatches(train, idx, 32, 0, 0, 0)) == 4  # the default batches
    text = F.normalize(module.text_features, dim=-1)
    draws = []
    for x, rows in batches:
        replay = torch.Generator().set_state(ctx.generator.get_state())
        q_new = 0.9 * ctx.state["q"][rows] + 0.1 * torch.softmax(module(x), -1).detach()
        ist = -(q_new * torch.log_softmax(module(x), -1)).sum(1).mean()
        loss = objective((x, rows))
        m = torch.bincount(ctx.state["q"].argmax(dim=1), minlength=10)
        n = math.floor(1.5 * int(m.max()) + 0.5) - m  # Eq. 7 from the updated pseudo-labels
        labels = torch.repeat_interleave(torch.arange(10), n)
        z = text[labels] + 0.05 * torch.randn(len(labels), text.shape[1], generator=replay)  # Eq. 5
        tsamp = -torch.log_softmax(module.head(z), -1)[torch.arange(len(labels)), labels].sum()  # Eq. 6
        assert torch.equal(ctx.generator.get_state(), replay.get_state())  # one draw of sum(n) x D per step
        assert math.isclose(float(loss), float(ist + 0.7 * tsamp), rel_tol=1e-5)
        draws.append(len(labels))
    assert len(draws) == 4 and min(draws) > 0


class BiasedClipWorld:
    """A stand-in for a pretrained CLIP whose zero-shot classifier is biased towards some classes:
    images of class y are P_y + m + noise, class texts are P_k + a_k m (+ noise), a_k spread in [0, 1]."""

    def __init__(self, dim: int = EMBED, classes: int = 10) -> None:
        g = torch.Generator().manual_seed(0)
        self.protos = F.normalize(torch.randn(classes, dim, generator=g), dim=-1)
        self.common = F.normalize(torch.randn(dim, generator=g), dim=0)
        pull = torch.linspace(0, 1, classes)[torch.randperm(classes, generator=g)]
        self.text = self.protos + pull[:, None] * self.common + 0.5 * torch.randn(classes, dim, generator=g) / dim**0.5

    def encode_split(self, module, split: DeviceData | None) -> DeviceData | None:
        if split is None:
            return None
        g = torch.Generator().manual_seed(len(split.labels))
        noise = 3.0 * torch.randn(len(split.labels), self.protos.shape[1], generator=g) / self.protos.shape[1] ** 0.5
        return DeviceData(7.0 * (self.protos[split.labels] + self.common + noise), split.labels, split.mean, split.std)


def accuracies(record: dict) -> list[float]:
    return [h["metrics"]["test/accuracy"] for h in record["history"]]


def test_fst_cbdg_improves_on_a_biased_zero_shot_without_labels(clip_cfg, monkeypatch):
    world = BiasedClipWorld()
    monkeypatch.setattr(ClipFeatureModule, "encode_split", lambda self, split: world.encode_split(self, split))
    monkeypatch.setattr(ClipFeatureModule, "class_text_features", lambda self: world.text)
    fed = {"partition.num_clients": 10, "fed.rounds": 5, "method.lr": 0.01, "method.weight_decay": 1e-5}
    zs, _ = run_in_process(clip_cfg("clip-zs", **fed))
    fst, _ = run_in_process(clip_cfg("fst-cbdg", **fed))
    st_only, _ = run_in_process(clip_cfg("fst-cbdg", {"tsamp_weight": 0.0}, experiment="st-only", **fed))
    zero_shot = accuracies(zs)[-1]
    assert 50.0 < zero_shot < 80.0
    assert accuracies(fst)[-1] >= zero_shot + 3.0, (zero_shot, accuracies(fst))
    # L_iST alone has zero gradient while q = f(I): the head stays at zero-shot
    assert accuracies(st_only) == pytest.approx([zero_shot] * 5, abs=1e-9)


# ---------------------------------------------------------------- FACMIC's target set


def test_facmic_target_set_is_unlabeled_val_or_the_held_out_test_split(clip_cfg):
    _, module, (_, val, test) = prepared(clip_cfg("facmic"))
    assert module.target_features is val.images
    _, module, (_, val, test) = prepared(clip_cfg("facmic", {"target": "held_out_client"}))
    assert module.target_features is test.images
    # the LMMD term is live: with lambda = 0 the loss differs
    module.train()
    x, y = test.images[:32], test.labels[:32]
    ctx = ClientContext(0, 0, 0, test, torch.arange(32), 10, {}, generator=torch_generator(0))
    objective = module.client_objective(ctx)  # the target batch comes from the client's generator
    with_lmmd = objective((x, y))
    module.lmmd_weight = 0.0
    assert with_lmmd.item() != pytest.approx(objective((x, y)).item())


# ---------------------------------------------------------------- 1 rank == 2 ranks


@pytest.mark.ddp
@pytest.mark.parametrize("method", ["facmic", "fst-cbdg"])
def test_two_ranks_equal_one_rank(two_rank_runs, tmp_path, method):
    """clip_cfg's runs (FACMIC with adam at 1e-3; FST-CBDG with its defaults): tests/rank_pairs.py, the
    2-rank side from the shared launch."""
    one = two_rank_runs.one_cfg(f"clip-{method}", tmp_path)
    record, state1 = run_in_process(one)
    _, state2 = two_rank_runs.two(f"clip-{method}")
    assert max_state_diff(state1, state2) <= 1e-6
    dm = build_datamodule(one)
    dm.setup()
    init = build_module(one, dm).state_dict()
    assert max_state_diff(state1, init) > 1e-5  # the head trained
    assert all(len(h["clients"]) == 3 for h in record["history"])
