"""FedNPR / FedNPR-Per term by term against the public code (issue 37): tests/golden/fednpr.json holds inputs and
outputs recorded by running Jwicaksana/FedNPR 1dbe3ae's own functions (helper.py CustomLoss, train,
update_prototype, aggr_fed, copy_fed; npr.py AGD_torch_no_grad_gpu) on small seeded inputs, outside this
repository, with a tiny net (features = Linear(3, 5) as the pooled feature, head = Linear(5, 4)) in place of
EfficientNet-B0; each entry names its file and function. Only numbers were kept.

The public code's NPR weight is 1 (it adds lambda as a constant) and its sub-cluster assignment is a
gumbel-softmax draw: our ``npr_variant: public_code`` is compared with it; the paper variant's iterated
Sinkhorn has no public reference, so it is checked against a hand-written Sinkhorn-Knopp below, written
from the paper's description (SwAV's equipartition, Cuturi 2013), independent of ours.

Tolerance: float32 inputs, rel 1e-5 / abs 1e-6.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from golden_values import assert_close, load_golden, tensor
from torch import nn

from lightning_modules.base import matches_prefix
from lightning_modules.components import npr
from lightning_modules.components.balanced_softmax import balanced_softmax_loss, class_log_prior
from lightning_modules.fednpr_per import FedNPRPer

GOLDEN = load_golden("fednpr")
RTOL, ATOL = 1e-5, 1e-6


def close(got: torch.Tensor, expected, atol: float = ATOL) -> None:
    assert_close(got, expected, RTOL, atol)


def tiny_net(state: dict) -> tuple[nn.Linear, nn.Linear]:
    """The recording's net: features = Linear(3, 5) (the pooled feature), head = classifier.1 = Linear(5, 4)."""
    features, head = nn.Linear(3, 5), nn.Linear(5, 4)
    features.load_state_dict({k.removeprefix("features."): tensor(v) for k, v in state.items() if k.startswith("features.")})
    head.load_state_dict({k.removeprefix("classifier.1."): tensor(v) for k, v in state.items() if k.startswith("classifier.1.")})
    return features, head


def test_every_entry_names_its_public_source():
    for name, entry in GOLDEN.items():
        src = entry["source"]
        assert src["repository"] == "Jwicaksana/FedNPR" and len(src["commit"]) == 40, name
        assert src["file"] and src["function"], name


def test_balanced_softmax_equals_the_codes_custom_loss():
    e = GOLDEN["balanced_softmax"]
    i = e["inputs"]
    log_prior = class_log_prior(torch.tensor(i["client_labels"]), i["num_classes"])
    logits, y = tensor(i["logits"]), torch.tensor(i["targets"])
    close(logits + log_prior, e["outputs"]["shifted_logits"])  # an absent class: log(0 + 1e-9)
    close(balanced_softmax_loss(logits, y, log_prior), e["outputs"]["loss"])


def _local_step():
    e = GOLDEN["local_step"]
    i = e["inputs"]
    features, head = tiny_net(i["net_state"])
    x, y, protos = tensor(i["x"]), torch.tensor(i["y"]), tensor(i["prototypes"])
    f = features(x)
    bsm = balanced_softmax_loss(head(f), y, class_log_prior(torch.tensor(i["client_labels"]), 4))
    npr_term = npr.npr_loss(f, y, protos)
    return e, (features, head), (f, protos, y), (bsm, npr_term)


def test_npr_score_standardisation_and_loss_equal_the_codes_train_step():
    """max over sub-clusters of the cosine, a LayerNorm over the classes (no affine, eps 1e-5), CE."""
    e, _, (f, protos, y), (bsm, npr_term) = _local_step()
    scores = npr.npr_scores(f, protos)
    close(scores, e["outputs"]["npr_scores"])
    close(F.layer_norm(scores, scores.shape[-1:], eps=1e-5), e["outputs"]["npr_standardised"])
    close(npr.npr_loss_from_scores(scores, y), e["outputs"]["npr_loss"])
    close(npr_term, e["outputs"]["npr_loss"])
    close(bsm, e["outputs"]["bsm_loss"])


def test_public_code_local_loss_and_its_gradient_equal_the_codes():
    """The code's loss is BSM + lambda + NPR: our public_code weight 1 gives the same gradient (and the
    same value less the constant lambda). Its update with SGD lr 1 is -grad."""
    e, (features, head), _, (bsm, npr_term) = _local_step()
    lam = e["inputs"]["lambda_argument"]
    total = bsm + npr.npr_weight("public_code", lam) * npr_term
    assert total.item() + lam == pytest.approx(e["outputs"]["total_loss"], rel=RTOL)
    total.backward()
    ours = {f"features.{k}": p.grad for k, p in features.named_parameters()}
    ours |= {f"classifier.1.{k}": p.grad for k, p in head.named_parameters()}
    assert sorted(ours) == sorted(e["outputs"]["sgd_lr1_update"])
    for name, update in e["outputs"]["sgd_lr1_update"].items():
        close(-ours[name], update)
    assert npr.npr_weight("paper", lam) == lam  # the paper's weight, the default


def test_public_code_prototype_update_equals_the_codes_for_the_same_draws(monkeypatch):
    """helper.py update_prototype: per class with >= 2 samples, each sub-cluster's prototype becomes the
    normalised mean of the features that drew it, and a sub-cluster nobody drew becomes zero (class 2's
    first); a class with one sample (class 3) keeps its prototypes. The draws are random in both (gumbel
    there, the client generator here): the code's draws are replayed into ours. Failed before this
    issue's fix, which kept the empty sub-cluster's old prototype and updated class 3 from its one sample."""
    e = GOLDEN["prototype_update"]
    i = e["inputs"]
    features, _ = tiny_net(i["net_state"])
    x, y = tensor(i["x"]), torch.tensor(i["y"])
    drawn = torch.zeros(len(y), dtype=torch.long)
    for c, draws in e["outputs"]["assignments_per_class"].items():
        drawn[y == int(c)] = torch.tensor(draws)
    monkeypatch.setattr(npr, "subcluster_assignments", lambda *a, **k: drawn)
    with torch.no_grad():
        new = npr.update_prototypes(features(x), y, tensor(i["prototypes"]), variant="public_code",
                                    generator=torch.Generator().manual_seed(0))
    close(new, e["outputs"]["prototypes"])


def _agd_plan(m: np.ndarray, eps: float = 0.05) -> np.ndarray:
    """What AGD_torch_no_grad_gpu returns as its plan, by hand: its loop never updates A, y or z, so every
    pass sets X = exp(-M / gamma) / sum, gamma = eps / (3 ln n), n the number of samples."""
    gamma = eps / (3 * math.log(m.shape[0]))
    w = np.exp(-(m - m.min()) / gamma)
    return w / w.sum()


def test_the_codes_assignment_solver_does_not_iterate_and_its_draw_is_a_gumbel_sample():
    """The fact behind ``public_code``: the code's plan is the one-step kernel exp(-M / gamma) (whose argmax,
    ``indexs``, is the LEAST similar sub-cluster, and is unused); the assignment it uses is a hard
    gumbel-softmax draw (tau 0.5) on that plan, whose entries are all below 1, so gumbel noise of scale 1
    decides most rows."""
    e = GOLDEN["agd_assignment"]
    m = np.array(e["inputs"]["similarities"])
    plan = _agd_plan(m)
    assert np.argmax(plan, axis=1).tolist() == e["outputs"]["indexs"] == np.argmin(m, axis=1).tolist()
    torch.manual_seed(e["inputs"]["torch_manual_seed"])
    x = torch.tensor(plan, dtype=torch.float64)
    gumbels = -torch.empty_like(x).exponential_().log()
    assert F.one_hot(((x + gumbels) / 0.5).argmax(1), m.shape[1]).double().tolist() == e["outputs"]["gumbel_onehot"]


def _sinkhorn_by_hand(scores: np.ndarray, eps: float, iters: int) -> np.ndarray:
    """Sinkhorn-Knopp equipartition as the paper describes it (SwAV's form): Q = exp(S / eps) with total
    mass 1; repeat: each of the K columns to mass 1/K, each of the N rows to mass 1/N; return N * Q."""
    q = np.exp(scores / eps)
    q /= q.sum()
    n, k = q.shape
    for _ in range(iters):
        for j in range(k):
            q[:, j] /= q[:, j].sum() * k
        for r in range(n):
            q[r, :] /= q[r, :].sum() * n
    return q * n


@pytest.mark.parametrize("iters", [0, 1, 3, 100])
def test_paper_sinkhorn_equals_a_hand_written_sinkhorn_knopp(iters):
    """No public reference: the paper's iterated solver against the hand-written formula above."""
    g = torch.Generator().manual_seed(8)
    feats = F.normalize(torch.randn(9, 5, generator=g, dtype=torch.float64), dim=1)
    protos = F.normalize(torch.randn(3, 5, generator=g, dtype=torch.float64), dim=1)
    scores = (feats @ protos.T).numpy()
    expected = _sinkhorn_by_hand(scores, 0.05, iters)
    got = npr.sinkhorn_equipartition(torch.tensor(scores), eps=0.05, iters=iters)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-9, atol=1e-12)
    assert npr.assign_subclusters(feats, protos, 0.05, iters).tolist() == np.argmax(expected, axis=1).tolist()
    if iters == 100:  # near convergence: every sub-cluster holds about N/K = 3 samples' mass
        np.testing.assert_allclose(expected.sum(axis=0), [3.0, 3.0, 3.0], rtol=1e-2)


@pytest.mark.parametrize("method,personal", [("fednpr", ()), ("fednpr_per", ("head",))])
def test_aggregation_equals_the_codes_aggr_fed_and_copy_fed(method, personal):
    """FedNPR: every tensor, averaged by training size; FedNPR-Per: all but the classifier, which each
    client keeps (ours: personal_prefixes; the code's classifier.1.* is our head.*)."""
    assert FedNPRPer.personal_prefixes == ("head",)
    e = GOLDEN["aggregation"]
    i = e["inputs"]
    sizes = i["client_sizes"]
    clients = list(i["client_states"])
    after = e["outputs"][f"clients_after_{method}"]
    for key in i["client_states"][clients[0]]:
        ours = key.replace("classifier.1.", "head.")
        stacked = torch.stack([tensor(i["client_states"][c][key], torch.float64) for c in clients])
        mean = (stacked * tensor(sizes, torch.float64).view(-1, *[1] * (stacked.dim() - 1))).sum(0) / sum(sizes)
        for n, c in enumerate(clients):
            expected = stacked[n] if matches_prefix(ours, personal) else mean
            close(expected, after[c][key])
