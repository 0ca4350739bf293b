"""LKCC: prompts, text-embedding cache, concept distributions and the Eq. 1-4 losses."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bench.core.errors import FedbenchError, FedbenchWarning
from lightning_modules.components import prompts as P
from lightning_modules.components import text_encoders as TE
from lightning_modules.components.concept_distributions import ConceptDistribution
from lightning_modules.components.lkcc import (
    align_inf_monte_carlo,
    embedding_average_logits,
    lkcc_logits,
    lkcc_surrogate_loss,
)

# Monte Carlo tolerance: with 20000 draws the estimate's spread over seeds is ~0.007 (measured
# on these shapes), so 0.05 is about 7 standard deviations.
MC_TOL = 0.05


def _problem(seed: int, b: int = 6, k: int = 4, d: int = 16, sigma_scale: float = 0.05):
    g = torch.Generator().manual_seed(seed)
    h = F.normalize(torch.randn(b, d, generator=g, dtype=torch.float64), dim=1)
    mu = 0.8 * F.normalize(torch.randn(k, d, generator=g, dtype=torch.float64), dim=1)
    sigma = sigma_scale * torch.rand(k, d, generator=g, dtype=torch.float64)
    y = torch.randint(k, (b,), generator=g)
    return h, y, mu, sigma


def _surrogate_numpy(h, y, mu, sigma, tau) -> float:
    h, mu, sigma, y = h.numpy(), mu.numpy(), sigma.numpy(), y.numpy()
    total = 0.0
    for i in range(len(y)):
        f = np.array([tau * h[i] @ mu[k] + 0.5 * tau**2 * np.sum(h[i] ** 2 * sigma[k])
                      for k in range(len(mu))])
        log_z = math.log(np.sum(np.exp(f - f.max()))) + f.max()
        total += log_z - f[y[i]] + 0.5 * tau**2 * np.sum(h[i] ** 2 * sigma[y[i]])
    return total / len(y)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_surrogate_equals_closed_form(seed):
    h, y, mu, sigma = _problem(seed)
    got = lkcc_surrogate_loss(h, y, mu, sigma, tau=7.5).item()
    assert got == pytest.approx(_surrogate_numpy(h, y, mu, sigma, 7.5), rel=1e-10)
    logits = lkcc_logits(h, mu, sigma, 7.5)
    assert logits[1, 2].item() == pytest.approx(
        7.5 * float(h[1] @ mu[2]) + 0.5 * 56.25 * float((h[1] ** 2 * sigma[2]).sum()), rel=1e-12)


def test_surrogate_without_variance_is_plain_ce_on_mean_embeddings():
    h, y, mu, _ = _problem(3)
    zero = torch.zeros_like(mu)
    expected = F.cross_entropy(12.5 * h @ mu.T, y)
    assert lkcc_surrogate_loss(h, y, mu, zero, 12.5).item() == pytest.approx(expected.item(), rel=1e-12)
    assert torch.allclose(embedding_average_logits(h, mu, 12.5), 12.5 * h @ mu.T)
    assert torch.allclose(lkcc_logits(h, mu, zero, 12.5), embedding_average_logits(h, mu, 12.5))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_monte_carlo_align_inf_never_exceeds_surrogate(seed):
    h, y, mu, sigma = _problem(seed, sigma_scale=0.05 + 0.05 * seed)
    tau = 8.0
    surrogate = lkcc_surrogate_loss(h, y, mu, sigma, tau).item()
    mc = align_inf_monte_carlo(h, y, mu, sigma, tau, 20000, torch.Generator().manual_seed(10 + seed)).item()
    assert mc <= surrogate + MC_TOL
    # Averaging CE over joint draws puts the negatives' expectation outside the log: lower still.
    joint = align_inf_monte_carlo(h, y, mu, sigma, tau, 20000, torch.Generator().manual_seed(seed),
                                  inner_expectation=False).item()
    assert joint <= mc + MC_TOL


def test_monte_carlo_matches_surrogate_where_the_bound_is_tight():
    # Zero variance for the labelled class: Jensen is an equality, so Eq. 3 == Eq. 4 exactly.
    h, _, mu, sigma = _problem(5, sigma_scale=0.2)
    y = torch.zeros(len(h), dtype=torch.long)
    sigma[0] = 0.0
    surrogate = lkcc_surrogate_loss(h, y, mu, sigma, 8.0).item()
    mc = align_inf_monte_carlo(h, y, mu, sigma, 8.0, 20000, torch.Generator().manual_seed(0)).item()
    assert abs(mc - surrogate) < MC_TOL
    # and with no variance at all the estimate is exactly the CE on tau * h.mu
    none = torch.zeros_like(sigma)
    exact = align_inf_monte_carlo(h, y, mu, none, 8.0, 100, torch.Generator().manual_seed(0)).item()
    assert exact == pytest.approx(F.cross_entropy(8.0 * h @ mu.T, y).item(), rel=1e-6)


def test_concept_distribution_matches_numpy():
    emb = torch.randn(3, 7, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    dist = ConceptDistribution.from_embeddings(emb, eps=1e-4)
    e = emb.numpy() / np.linalg.norm(emb.numpy(), axis=-1, keepdims=True)
    np.testing.assert_allclose(dist.mu.numpy(), e.mean(axis=1), rtol=1e-12)
    np.testing.assert_allclose(dist.sigma_diag.numpy(), e.var(axis=1, ddof=1), rtol=1e-12)
    for k in range(3):
        np.testing.assert_allclose(dist.cov[k].numpy(), np.cov(e[k].T, ddof=1) + 1e-4 * np.eye(5), rtol=1e-10)
    assert torch.allclose(dist.chol @ dist.chol.transpose(1, 2), dist.cov)
    assert (dist.mu.norm(dim=1) < 0.99).all()  # mean is not renormalised


def test_concept_distribution_sampling():
    emb = torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    dist = ConceptDistribution.from_embeddings(emb)
    labels = torch.tensor([0, 1] * 20000)
    z = dist.sample(labels, generator=torch.Generator().manual_seed(0))
    for c in (0, 1):
        zc = z[labels == c].numpy()
        np.testing.assert_allclose(zc.mean(0), dist.mu[c].numpy(), atol=0.01)
        np.testing.assert_allclose(np.cov(zc.T), dist.cov[c].numpy(), atol=0.01)
    again = dist.sample(labels, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again, z)
    assert not torch.equal(dist.sample(labels, generator=torch.Generator().manual_seed(1)), z)
    noise = dist.sample(labels, generator=torch.Generator().manual_seed(0), noise_only=True)
    np.testing.assert_allclose(noise[labels == 1].mean(0).numpy(), np.zeros(4), atol=0.03)
    np.testing.assert_allclose(noise.std(0).numpy(), np.ones(4), atol=0.03)
    with pytest.raises(FedbenchError, match="at least 2 prompts"):
        ConceptDistribution.from_embeddings(emb[:, :1])


def test_prompt_counts_and_fraction():
    assert len(P.templates("kvasir")) == 24 and len(set(P.templates("kvasir"))) == 24
    assert len(P.templates("oct-c8")) == 28 and len(set(P.templates("oct-c8"))) == 28
    assert "an endoscopic image of {}." in P.templates("kvasir")
    assert "an OCT scan of {}." in P.templates("oct-c8")
    assert P.templates("kvasir", 0.25) == P.templates("kvasir")[:6]
    assert len(P.templates("oct-c8", 0.5)) == 14
    assert len(P.templates("digits", 0.01)) == 1
    grid = P.prompts("oct-c8", class_names=["AMD", "CNV", "CSR", "DME", "DR", "DRUSEN", "MH", "NORMAL"])
    assert len(grid) == 8 and all(len(row) == 28 for row in grid)
    assert grid[4][0] == "an image of Diabetic retinopathy."  # DR is not swapped with MH
    assert P.concepts("fashion-mnist")[0] == "T-shirt or top"
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(FedbenchError, match="prompt_fraction"):
            P.templates("kvasir", bad)


def test_prompt_errors():
    with pytest.raises(FedbenchError, match="kvasir.*oct-c8|fashion-mnist"):
        P.prompts("kvasirr")
    with pytest.raises(FedbenchError, match="3 class names"):
        P.prompts("digits", class_names=["zero", "one", "two"])
    with pytest.raises(FedbenchError, match="different order"):
        P.prompts("oct-c8", class_names=["AMD", "CNV", "CSR", "DME", "MH", "DRUSEN", "DR", "NORMAL"])


def _counting(monkeypatch) -> list[str]:
    built: list[str] = []
    real = TE.get_text_encoder

    def counting(name, device=None):
        built.append(name)
        return real(name, device)

    monkeypatch.setattr(TE, "get_text_encoder", counting)
    return built


def test_minilm_embeddings_are_cached(tmp_path, monkeypatch):
    built = _counting(monkeypatch)
    grid = [["a photo of a cat.", "an image of a cat."], ["a photo of a truck.", "an image of a truck."]]
    first = TE.class_prompt_embeddings("minilm", grid, tmp_path)
    assert first.shape == (2, 2, 384) and built == ["minilm"]
    assert torch.allclose(first.norm(dim=-1), torch.ones(2, 2), atol=1e-5)
    assert F.cosine_similarity(first[0, 0], first[1, 0], dim=0) < 0.9  # cat != truck
    second = TE.class_prompt_embeddings("minilm", grid, tmp_path)
    assert built == ["minilm"] and torch.equal(first, second)
    other = TE.class_prompt_embeddings("minilm", [grid[1], grid[0]], tmp_path)  # new key: rebuilt
    assert built == ["minilm", "minilm"] and torch.allclose(other[0], first[1], atol=1e-5)
    assert len(list(tmp_path.glob("text-minilm-*.pt"))) == 2


def test_unreachable_encoder_names_offline_alternative(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("biomedclip", "bert"):
        start = time.monotonic()
        with pytest.raises(FedbenchError, match="minilm") as err:
            TE.get_text_encoder(name)
        assert time.monotonic() - start < 10.0
        assert name in str(err.value)
    with pytest.raises(FedbenchError, match="Known: .*minilm"):
        TE.get_text_encoder("gpt")


def test_registered_datamodules_agree_with_prompt_sets():
    from datamodules.base import DATASETS

    shared = sorted(set(P.known_datasets()) & set(DATASETS.names()))
    assert {"kvasir", "oct-c8", "fashion-mnist", "digits"} <= set(shared)
    for name in shared:
        names = DATASETS.get(name).class_names
        assert len(P.prompts(name, class_names=names)) == len(names)


class _Foreign:
    """An object a weights_only load refuses to build."""


@pytest.mark.parametrize("content", ["object-pickle", "truncated", "list-embeddings", "wrong-shape", "nan"])
def test_foreign_text_cache_is_rebuilt_with_a_warning(tmp_path, monkeypatch, content):
    """A text-embedding cache file in another format is named in a warning and re-encoded, never a raw error."""
    grid = [["a photo of a cat."], ["a photo of a truck."]]
    good = TE.class_prompt_embeddings("minilm", grid, tmp_path)
    (path,) = tmp_path.glob("text-minilm-*.pt")
    base = {"encoder": "minilm", "prompts": grid}
    if content == "object-pickle":
        torch.save({**base, "embeddings": _Foreign()}, path)
    elif content == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif content == "list-embeddings":
        torch.save({**base, "embeddings": good.tolist()}, path)
    elif content == "wrong-shape":
        torch.save({**base, "embeddings": good[:1]}, path)
    else:
        torch.save({**base, "embeddings": torch.full_like(good, float("nan"))}, path)
    built = _counting(monkeypatch)
    with pytest.warns(FedbenchWarning, match="text-embedding cache .* encoding the prompts again"):
        again = TE.class_prompt_embeddings("minilm", grid, tmp_path)
    assert built == ["minilm"] and torch.allclose(again, good, atol=1e-6)
    assert torch.equal(TE.class_prompt_embeddings("minilm", grid, tmp_path), again)  # the rebuilt file is reused
