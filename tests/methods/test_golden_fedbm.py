"""Golden values of FedCB / FedBM from the public code (meiluzhu/FedBM 556511e), numbers only.

tests/golden/fedcb.json and fedbm.json hold small seeded inputs and the outputs of the public code's own
functions (each entry names repository, commit, file and function); here OUR functions run on the same
inputs. Tolerances: entries the public code computes in float64 (dv_loss, DeepInversionHook, fedavg,
concept distributions, augmentation) match to 1e-12 relative (float64 rounding of sums of <= 50 terms
is ~1e-15); the LKCC logits/loss and the generator objective are float32 in the public code (its
`means.float()`), ours run in float64 on the same float32 inputs: 2e-6 relative + 2e-6 absolute
(float32 eps 1.2e-7 times sums of <= 10 terms of magnitude <= 20).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench.engine.aggregation import RoundBuffer
from lightning_modules.components.cgde_generator import (
    GeneratorObjective,
    bn_statistics_loss,
    diversity_loss,
)
from lightning_modules.components.concept_distributions import ConceptDistribution
from lightning_modules.components.lkcc import lkcc_logits, lkcc_surrogate_loss
from lightning_modules.fedcb import LKCCHead

GOLDEN = Path(__file__).parents[1] / "golden"
F64 = {"rel": 1e-12, "abs": 1e-12}
F32 = {"rtol": 2e-6, "atol": 2e-6}
IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])


def golden(name: str) -> dict:
    return json.loads((GOLDEN / f"{name}.json").read_text())


def t(x, dtype=torch.float64) -> torch.Tensor:
    return torch.tensor(x, dtype=dtype)


@pytest.mark.parametrize("name", ["fedcb", "fedbm"])
def test_every_entry_names_its_public_source(name):
    for entry in golden(name).values():
        for src in entry["source"] if isinstance(entry["source"], list) else [entry["source"]]:
            assert src["repository"] == "meiluzhu/FedBM" and src["commit"].startswith("556511e")
            assert src["file"].endswith(".py") and src["function"]


# ---- FedCB ------------------------------------------------------------------------------------
def test_concept_distribution_matches_public_code():
    e = golden("fedcb")["concept_distribution"]
    dist = ConceptDistribution.from_embeddings(t(e["inputs"]["embeddings"]))
    out = e["outputs"]
    assert torch.allclose(dist.mu, t(out["mu"]), rtol=1e-12, atol=1e-14)
    assert torch.allclose(dist.sigma_diag, t(out["sigma_diag"]), rtol=1e-12, atol=1e-14)
    # full covariance + 1e-4 I; the public code's 1e-4 I is a float32 eye (1e-4 - 2.5e-12 on the diagonal)
    assert torch.allclose(dist.cov, t(out["cov"]), rtol=1e-12, atol=1e-11)
    assert torch.allclose(dist.chol @ dist.chol.transpose(1, 2), t(out["cov"]), rtol=1e-10, atol=1e-11)


def test_lkcc_logits_and_surrogate_loss_match_public_code():
    e = golden("fedcb")["lkcc"]
    i = e["inputs"]
    head = LKCCHead(4, t(i["mu"]), t(i["sigma_diag"]), i["tau"], use_variance=True).double()
    head.mu, head.sigma_diag = t(i["mu"]), t(i["sigma_diag"])
    with torch.no_grad():
        head.projection.weight.copy_(t(i["projection_weight"]))
        head.projection.bias.copy_(t(i["projection_bias"]))
    h = head.embed(t(i["features"]))
    y = torch.tensor(i["labels"])
    assert torch.allclose(head(t(i["features"])), t(e["outputs"]["logits"]), **F32)
    assert torch.allclose(lkcc_logits(h, head.mu, head.sigma_diag, i["tau"]), t(e["outputs"]["logits"]), **F32)
    loss = lkcc_surrogate_loss(h, y, head.mu, head.sigma_diag, i["tau"])
    assert torch.allclose(loss, t(e["outputs"]["loss"]), **F32)
    assert torch.allclose(head.loss(h, y), loss)


def test_weighted_fedavg_matches_public_code():
    e = golden("fedcb")["fedavg"]
    states = [{k: t(v) for k, v in s.items()} for s in e["inputs"]["states"]]
    buf = RoundBuffer({k: v.shape for k, v in states[0].items()}, {}, "cpu")
    for state, n in zip(states, e["inputs"]["num_samples"]):
        buf.add_client(state, float(n), {})
    avg = buf.averaged_state()
    for k, v in e["outputs"].items():
        assert torch.allclose(avg[k], t(v), rtol=1e-12, atol=1e-14), k


# ---- FedBM ------------------------------------------------------------------------------------
def test_diversity_loss_matches_public_code_on_both_paths():
    """Fails with per-dimension mean L1 distances (the old ratio was off by D_z / D_x = 5 / 12)."""
    e = golden("fedbm")["diversity"]
    i = e["inputs"]
    images, z, labels = t(i["images"]), t(i["z"]), torch.tensor(i["labels"])
    expected = e["outputs"]["loss"]
    assert diversity_loss(images, z, labels, i["num_classes"]).item() == pytest.approx(expected, **F64)
    from lightning_modules.components.cgde_generator import batched_diversity_loss

    batched = batched_diversity_loss(images.flatten(1), z.flatten(1), labels, i["num_classes"])
    assert batched.item() == pytest.approx(expected, **F64)


def _bn_net(state: dict) -> nn.Module:
    net = nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3), nn.ReLU(), nn.Conv2d(3, 2, 1), nn.BatchNorm2d(2))
    net = net.double()
    net.load_state_dict({k: t(v) for k, v in state.items()}, strict=False)
    return net


def test_bn_statistics_loss_matches_public_code():
    e = golden("fedbm")["bn_statistics"]
    net = _bn_net(e["inputs"]["state_dict"])
    assert bn_statistics_loss(net, t(e["inputs"]["x"])).item() == pytest.approx(e["outputs"]["loss"], **F64)


@pytest.mark.parametrize("case", range(6))
def test_augmentation_matches_public_code(case):
    """The public code's RandomCrop(128, padding 4) + flips + Normalize, seeded; ours with a CPU
    generator of the same seed and then the same normalisation. Fails if the images are not augmented."""
    from lightning_modules.components.cgde_generator import augment_generated  # absent before the fix

    out = golden("fedbm")["augment"]["outputs"][case]
    x = (torch.arange(2 * 3 * 128 * 128, dtype=torch.float64) % 997 / 997).view(2, 3, 128, 128)
    mean, std = (t(v).view(1, 3, 1, 1) for v in IMAGENET)
    ours = (augment_generated(x, torch.Generator().manual_seed(out["seed"])) - mean) / std
    assert torch.allclose(ours[:, :, ::32, ::32], t(out["sampled"]), rtol=1e-12, atol=1e-12)
    assert torch.allclose(ours[:, :, :5, :5], t(out["corner"]), rtol=1e-12, atol=1e-12)
    assert ours.sum().item() == pytest.approx(out["sum"], rel=1e-12)


class _Teacher(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                  nn.Flatten())
        self.linear_fedbm = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.linear_fedbm(self.body(x)), dim=1)


def test_generator_objective_matches_public_code():
    """L = L_sem (Eq. 4's surrogate) + lambda_div L_div + lambda_dis L_dis, one step of the public
    Generator_Driver.train on fixed images (its aug reduced to Normalize; the crop/flips are above)."""
    e = golden("fedbm")["generator_objective"]
    i = e["inputs"]
    teacher = _Teacher().double()
    teacher.load_state_dict({k: t(v) for k, v in i["teacher_state_dict"].items()}, strict=False)
    teacher.eval()
    mu, sd = t(i["mu"]), t(i["sigma_diag"])
    eye = torch.eye(4, dtype=torch.float64).expand(len(mu), 4, 4)
    dist = ConceptDistribution(mu, sd, eye, eye)
    mean, std = (t(v).view(1, 3, 1, 1) for v in (i["normalise"]["mean"], i["normalise"]["std"]))
    objective = GeneratorObjective(teacher, teacher, dist, i["tau"], i["lambda_div"], i["lambda_dis"],
                                   lambda x: (x - mean) / std, (True, True, True))
    loss, terms = objective.losses(t(i["images"]), t(i["z"]), torch.tensor(i["labels"]))
    expected = t([e["outputs"][k] for k in ("loss", "sem", "div", "dis")])
    assert torch.allclose(terms, expected, rtol=1e-5, atol=1e-5)  # sem is a float32 difference of the others
    assert terms[2].item() == pytest.approx(e["outputs"]["div"], rel=2e-6)
    assert terms[3].item() == pytest.approx(e["outputs"]["dis"], rel=2e-6)
    assert loss.item() == pytest.approx(e["outputs"]["loss"], rel=2e-6)
