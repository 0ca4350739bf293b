"""Golden values for FST-CBDG (Yan & Guo, 2024; ../shared/papers/fst-cbdg.txt). The paper has no public
code, so tests/golden/fst-cbdg.json holds numbers computed by the hand-written formula code below
(plain numpy, written from the paper's equations and Algorithm 1, not from our implementation) on small
seeded inputs. Each test checks (1) that the formula code still gives the recorded outputs and (2) that
our functions / module give them too.

Noise of Eq. 5: the standard normal draws are torch's ``randn`` on a CPU generator seeded with the
entry's seed, float32, one [N, D] block per draw (N = sum_k n_k, rows grouped by class in label order);
this fixes which draws the formula and our code use, nothing else.

Regenerate (only if the formula code itself is corrected): ``python tests/methods/test_golden_fst_cbdg.py --write``.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_clip_methods import clip_cfg, prepared  # noqa: F401  (clip_cfg is a fixture)

from bench.core.batches import DeviceData
from lightning_modules.base import ClientContext
from lightning_modules.components.fst_cbdg import (
    class_balanced_counts,
    sample_text_features,
    self_training_loss,
    text_sampling_loss,
    update_soft_labels,
)

GOLDEN = Path(__file__).parents[1] / "golden" / "fst-cbdg.json"
PAPER = "Yan & Guo 2024, FST-CBDG (shared/papers/fst-cbdg.txt); no public code"


# ------------------------------------------------------------------ the paper's formulas (numpy, float64)


def softmax(a: np.ndarray) -> np.ndarray:
    e = np.exp(a - a.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def f(W, b, z):
    """Eq. 1: f(z; W, b) = softmax(W z + b), rows of z."""
    return softmax(z @ W.T + b)


def eq4_update(q, W, b, I, beta):
    """Eq. 4: q^t = beta q^{t-1} + (1 - beta) f(I)."""
    return beta * q + (1.0 - beta) * f(W, b, I)


def eq3_ist(q, W, b, I):
    """Eq. 3: L_iST = -E_j[q_j . log f(I_j)] (the expectation is the mean over the batch)."""
    return float(-(q * np.log(f(W, b, I))).sum(axis=1).mean())


def eq7_counts(m, gamma):
    """Eq. 7: m_k + n_k = (1 + gamma) m_{k*}, k* = argmax_k m_k (inputs keep (1 + gamma) m_{k*} whole:
    the paper says nothing of rounding)."""
    target = (1.0 + gamma) * max(m)
    assert target == int(target), target
    return [int(target) - mk for mk in m]


def eq5_draw(T, counts, sigma, gen):
    """Eq. 5: z_kj = T_k + sigma eps, eps ~ N(0, I); n_k rows per class, in class order."""
    labels = np.repeat(np.arange(len(T)), counts)
    eps = torch.randn((len(labels), T.shape[1]), generator=gen, dtype=torch.float32).double().numpy()
    return T[labels] + sigma * eps, labels


def eq6_tsamp(W, b, z, labels):
    """Eq. 6: L_tSamp = -sum_k sum_j 1_k . log f(z_kj): a double SUM over the synthetic instances."""
    if len(labels) == 0:
        return 0.0
    return float(-np.log(f(W, b, z)[np.arange(len(labels)), labels]).sum())


def algorithm1_iteration(state, rows, inp, gen):
    """Algorithm 1, lines 13-17, for one iteration on the batch ``rows`` of the client: update q of the
    batch (Eq. 4), L_iST (Eq. 3), m_k from the client's updated pseudo-labels argmax_k q_jk (all its
    images), n_k (Eq. 7), a fresh draw (Eq. 5), L_tSamp (Eq. 6); returns the loss L_iST + lambda L_tSamp."""
    W, b, I, T = (np.asarray(inp[k], dtype=np.float64) for k in ("W", "b", "I", "T"))
    q = state["q"]
    q[rows] = eq4_update(q[rows], W, b, I[rows], inp["beta"])
    ist = eq3_ist(q[rows], W, b, I[rows])
    m = np.bincount(q.argmax(axis=1), minlength=len(T)).tolist()
    counts = eq7_counts(m, inp["gamma"])
    z, labels = eq5_draw(T, counts, inp["sigma"], gen)
    tsamp = eq6_tsamp(W, b, z, labels)
    return {"m": m, "n": counts, "L_iST": ist, "L_tSamp": tsamp, "loss": ist + inp["lambda"] * tsamp}


# ------------------------------------------------------------------ inputs and the recorded file


def unit_rows(a: torch.Tensor) -> list:
    return np.round((a / a.norm(dim=-1, keepdim=True)).double().numpy(), 8).tolist()


def make_inputs() -> dict:
    g = torch.Generator().manual_seed(37)
    K, D, n = 10, 64, 12  # the test CLIP's 10 classes and 64-d features
    T = torch.randn(K, D, generator=g)
    I = T[torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4])] + 0.6 * torch.randn(n, D, generator=g)
    q = torch.softmax(2.0 * torch.randn(n, K, generator=g), dim=1)
    return {
        "I": unit_rows(I), "T": unit_rows(T), "W": unit_rows(T + 0.2 * torch.randn(K, D, generator=g)),
        "b": np.round(0.1 * torch.randn(K, generator=g).double().numpy(), 8).tolist(),
        "q": np.round((q / q.sum(dim=1, keepdim=True)).double().numpy(), 8).tolist(),
        "beta": 0.9, "gamma": 1.0, "lambda": 1.0, "sigma": 0.1, "seed": 5,
        "batches": [[3, 7, 0, 11, 5, 9], [1, 10, 2, 8, 6, 4]],
    }


def compute(inp: dict) -> dict:
    """Every entry's outputs from the formula code."""
    W, b, I, T = (np.asarray(inp[k], dtype=np.float64) for k in ("W", "b", "I", "T"))
    q0 = np.asarray(inp["q"], dtype=np.float64)
    gen = torch.Generator().manual_seed(inp["seed"])
    z, labels = eq5_draw(T[:3, :4], [2, 0, 1], 0.5, gen)
    state, iterations = {"q": q0.copy()}, []
    gen = torch.Generator().manual_seed(inp["seed"])
    for rows in inp["batches"]:
        iterations.append(algorithm1_iteration(state, rows, inp, gen))
    return {
        "eq4_soft_label_update": eq4_update(q0[:4], W, b, I[:4], inp["beta"]).tolist(),
        "eq3_self_training_loss": eq3_ist(q0[:4], W, b, I[:4]),
        "eq7_counts": {str(g): eq7_counts([5, 0, 2, 5, 1], g) for g in (0.0, 0.4, 1.0)},
        "eq5_synthetic_features": {"T": "T[:3, :4]", "counts": [2, 0, 1], "sigma": 0.5, "z": z.tolist(),
                                   "labels": labels.tolist()},
        "eq6_text_sampling_loss": eq6_tsamp(W[:, :4], b, z, labels),
        "algorithm1_iterations": iterations,
        "q_after_iterations": state["q"].tolist(),
    }


def write() -> None:
    inp = make_inputs()
    entries = {
        "eq4_soft_label_update": "Eq. 4 on rows 0-3 (q, W, b, I)",
        "eq3_self_training_loss": "Eq. 3 with q of rows 0-3 (not updated) and f(I) of rows 0-3",
        "eq7_counts": "Eq. 7 for m = [5, 0, 2, 5, 1], per gamma",
        "eq5_synthetic_features": "Eq. 5, the first draw of a generator seeded with `seed`",
        "eq6_text_sampling_loss": "Eq. 6 of eq5_synthetic_features under (W[:, :4], b)",
        "algorithm1_iterations": "Algorithm 1 lines 13-17, one iteration per batch of `batches`, one generator "
                                 "seeded with `seed` for all draws; q persists between iterations",
    }
    record = {"method": "fst-cbdg", "source": PAPER, "public_code": None,
              "computed_by": "the formula code in tests/methods/test_golden_fst_cbdg.py (numpy, float64)",
              "entries": entries, "inputs": inp, "outputs": compute(inp)}
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(record, indent=1) + "\n")


# ------------------------------------------------------------------ the tests


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text())


def test_the_record_is_what_the_formulas_give(golden):
    assert golden["source"] == PAPER and golden["public_code"] is None
    expected = compute(golden["inputs"])
    assert json.dumps(expected) == json.dumps(golden["outputs"]) or _close(expected, golden["outputs"])


def _close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, str):
        return a == b
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


def tensors(golden, *names):
    return (torch.tensor(golden["inputs"][k], dtype=torch.float64) for k in names)


def test_eq4_eq3_soft_label_update_and_self_training_loss(golden):
    q, W, b, I = tensors(golden, "q", "W", "b", "I")
    logits = F.linear(I[:4], W, b)
    out = golden["outputs"]
    q_new = update_soft_labels(q[:4], torch.softmax(logits, dim=-1), golden["inputs"]["beta"])
    assert torch.allclose(q_new, torch.tensor(out["eq4_soft_label_update"], dtype=torch.float64), atol=1e-12)
    assert math.isclose(float(self_training_loss(logits, q[:4])), out["eq3_self_training_loss"], rel_tol=1e-12)


def test_eq7_class_balanced_counts(golden):
    for gamma, expected in golden["outputs"]["eq7_counts"].items():
        assert class_balanced_counts(torch.tensor([5, 0, 2, 5, 1]), float(gamma)).tolist() == expected


def test_eq5_synthetic_features_and_eq6_summed_text_sampling_loss(golden):
    W, b, T = tensors(golden, "W", "b", "T")
    entry = golden["outputs"]["eq5_synthetic_features"]
    gen = torch.Generator().manual_seed(golden["inputs"]["seed"])
    z, labels = sample_text_features(T[:3, :4].float(), torch.tensor(entry["counts"]), entry["sigma"], gen)
    assert labels.tolist() == entry["labels"]
    assert torch.allclose(z.double(), torch.tensor(entry["z"], dtype=torch.float64), atol=1e-6)
    head = torch.nn.Linear(4, 10).double()
    with torch.no_grad():
        head.weight.copy_(W[:, :4])
        head.bias.copy_(b)
    z = torch.tensor(entry["z"], dtype=torch.float64)
    loss = text_sampling_loss(head, z, labels).detach()  # the default reduction: Eq. 6's sum
    assert math.isclose(float(loss), golden["outputs"]["eq6_text_sampling_loss"], rel_tol=1e-12)


def test_algorithm1_iterations_draw_afresh_and_sum_eq6(golden, clip_cfg):  # noqa: F811
    """Our module with the paper's defaults (apart from gamma 1 and sigma 0.1, given as args), two
    iterations on fixed batches: the loss is L_iST + lambda * Eq. 6's SUM over n_k features drawn at
    that iteration from the client's updated pseudo-labels (Eqs. 5, 7), and q follows Eq. 4."""
    inp = golden["inputs"]
    _, module, _ = prepared(clip_cfg("fst-cbdg", {"gamma": inp["gamma"], "sigma": inp["sigma"]}))
    q, W, b, I, T = (t.float() for t in tensors(golden, "q", "W", "b", "I", "T"))
    with torch.no_grad():
        module.text_features.copy_(T)
        module.head.weight.copy_(W)
        module.head.bias.copy_(b)
    data = DeviceData(I, torch.zeros(len(I), dtype=torch.long), torch.zeros(1), torch.ones(1))
    gen = torch.Generator().manual_seed(inp["seed"])
    ctx = ClientContext(0, 0, 0, data, torch.arange(len(I)), 10, {}, gen, state={"q": q.clone()}, batch_size=6)
    objective = module.client_objective(ctx)
    for rows, expected in zip(inp["batches"], golden["outputs"]["algorithm1_iterations"]):
        rows = torch.tensor(rows)
        loss = objective((I[rows], rows))  # a batch: the client's features of ``rows`` and the rows
        assert math.isclose(float(loss), expected["loss"], rel_tol=1e-5), (float(loss), expected)
    q_after = torch.tensor(golden["outputs"]["q_after_iterations"])
    assert torch.allclose(ctx.state["q"], q_after, atol=1e-6)


if __name__ == "__main__" and "--write" in sys.argv:
    write()
