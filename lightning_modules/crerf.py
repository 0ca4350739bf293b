"""CReFF (Shang et al., "Federated Learning on Heterogeneous and Long-Tailed Data via Classifier
Re-training with Federated Features", IJCAI 2022, Sec. 3-4); FedNPR's tables call it CReRF.

Local training is FedAvg's. Besides, each round:
  1. Client k, before training (``local_update``), computes for every class c it holds the gradient of the mean CE
     w.r.t. the classifier (W, b) on real features of class c: features of the received global
     backbone (eval mode), classifier = the server's current re-trained classifier. The gradient
     is averaged over ``grad_repeats`` batches of ``batch_real`` random samples of the class.
     Uploads: the per-class gradients [K, K, D] + [K, K] and a 0/1 "holds class c" vector.
  2. Server (after FedAvg of the model): per class, the real gradient is the mean over the
     round's clients holding it. Federated features S_c (M per class, persistent across rounds,
     initialised N(0, 1)) take ``match_steps`` SGD steps (lr ``lr_feature``) on
        sum_c  D(grad_(W,b) CE(classifier(S_c), c), real gradient of c)
     for the classes seen this round, D = sum over the rows of W of (1 - cosine) + (1 - cosine)
     of the bias gradients (the code's gradient-matching distance).
  3. A fresh linear classifier (seeded from the server stream) is trained on all federated
     features for ``retrain_epochs`` epochs (SGD lr ``lr_retrain``, batch ``retrain_batch``).
     It is the classifier used for evaluation and by the clients' next gradient computation;
     the aggregated model keeps the averaged classifier ``head`` for federated training.
Defaults are the public code's (options.py): M = 100, match_steps = 100, lr_feature = 0.1,
retrain_epochs = 300, lr_retrain = 0.01, batch 32 (its local batch size), batch_real = 32,
10 repeats. The seed paper (FedNPR) states none.

Choices: the code's DSA augmentation of the real samples is omitted; the gradients are computed in
closed form (dCE/dW = (softmax - onehot)^T f / n), identical to autograd; the first round's
re-trained classifier is the initial head (the code uses a fresh random Linear); server draws
come from a seed drawn at construction (a pure function of the run seed) and
``derive_seed(seed, round, -1, SERVER)``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.errors import FedbenchError
from bench.core.seeding import SERVER, derive_seed, torch_generator
from lightning_modules.base import METHODS, ClientBatches, ClientContext, FederatedModule
from lightning_modules.components.client_features import evaluating
from lightning_modules.server_part import ServerContext, ServerPart

GRAD_W, GRAD_B, HOLDERS = "crerf_grad_w", "crerf_grad_b", "crerf_holders"


def classifier_gradient(features: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor,
                        bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradient of the mean CE(features W^T + b, labels) w.r.t. (W, b), in closed form
    (differentiable w.r.t. the features)."""
    probs = F.softmax(features @ weight.T + bias, dim=1)
    g = (probs - F.one_hot(labels, weight.shape[0]).to(probs.dtype)) / len(labels)
    return g.T @ features, g.sum(0)


def matching_distance(gw: torch.Tensor, gb: torch.Tensor, real_w: torch.Tensor, real_b: torch.Tensor) -> torch.Tensor:
    """CReFF's gradient-matching distance: sum over W's rows of 1 - cos, plus 1 - cos of the biases
    (leading dimensions, e.g. one per class, are summed over too)."""
    def one_minus_cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return 1 - (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1) + 1e-6)

    return one_minus_cos(gw, real_w).sum() + one_minus_cos(gb, real_b).sum()


@METHODS.register("crerf")
class CReRF(FederatedModule):
    frozen_prefixes = ("retrained_head", "federated_features")

    def __init__(self, *args, features_per_class: int = 100, match_steps: int = 100, lr_feature: float = 0.1,
                 retrain_epochs: int = 300, lr_retrain: float = 0.01, retrain_batch: int = 32,
                 batch_real: int = 32, grad_repeats: int = 10, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for name, value in (("features_per_class", features_per_class), ("retrain_batch", retrain_batch),
                            ("batch_real", batch_real), ("grad_repeats", grad_repeats)):
            if value < 1:
                raise FedbenchError(f"CReRF's {name} must be >= 1, got {value}.")
        self.features_per_class, self.match_steps, self.lr_feature = features_per_class, match_steps, lr_feature
        self.retrain_epochs, self.lr_retrain, self.retrain_batch = retrain_epochs, lr_retrain, retrain_batch
        self.batch_real, self.grad_repeats = batch_real, grad_repeats
        # a pure function of the run seed (the module is built under a seeded global stream)
        self.server_seed = int(torch.randint(0, 2**62, (1,)).item())
        self.retrained_head = nn.Linear(self.feature_dim, self.num_classes)
        self.retrained_head.load_state_dict(self.head.state_dict())
        self.retrained_head.requires_grad_(False)
        gen = torch_generator(derive_seed(self.server_seed, -1, -1, SERVER))
        k, m = self.num_classes, features_per_class
        self.register_buffer("federated_features", torch.randn(k * m, self.feature_dim, generator=gen))
        self.register_buffer("federated_labels", torch.arange(k).repeat_interleave(m), persistent=False)
        self.server_side = CReRFServer(self)

    def eval_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Evaluation uses the server's re-trained classifier on the global model's features."""
        return self.retrained_head(self.features(x))

    # ---- client ----------------------------------------------------------------------------
    @torch.no_grad()
    def real_feature_gradients(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        """Per held class, the classifier gradient on real features (global backbone, eval mode)."""
        k, d = self.num_classes, self.feature_dim
        device, dtype = ctx.indices.device, ctx.data.mean.dtype  # the run's precision
        grad_w = torch.zeros(k, k, d, device=device, dtype=dtype)
        grad_b = torch.zeros(k, k, device=device, dtype=dtype)
        holders = torch.zeros(k, device=device, dtype=dtype)
        weight, bias = self.retrained_head.weight.to(dtype), self.retrained_head.bias.to(dtype)
        labels, gen = ctx.labels, ctx.generator
        with evaluating(self):
            for c in torch.unique(labels).tolist():
                members = ctx.indices[labels == c]
                n = min(self.batch_real, len(members))
                for _ in range(self.grad_repeats):
                    perm = torch.randperm(len(members), generator=gen, device=gen.device)
                    x, y = ctx.data.to_float(members[perm[:n].to(device)])
                    gw, gb = classifier_gradient(self.features(x).to(dtype), y, weight, bias)
                    grad_w[c] += gw / self.grad_repeats
                    grad_b[c] += gb / self.grad_repeats
                holders[c] = 1.0
        return {GRAD_W: grad_w, GRAD_B: grad_b, HOLDERS: holders}

    def local_update(self, ctx: ClientContext, batches: ClientBatches) -> int:
        ctx.uploads.update(self.real_feature_gradients(ctx))  # step 1, with the received model
        return super().local_update(ctx, batches)  # FedAvg's local training

    # ---- server ----------------------------------------------------------------------------
    def match_features(self, real_w: torch.Tensor, real_b: torch.Tensor, seen: torch.Tensor) -> None:
        """SGD on the federated features so that their classifier gradients match the real ones
        (all seen classes at once: per-class gradients batched over a [K, M, D] view)."""
        k, m, d = self.num_classes, self.features_per_class, self.feature_dim
        weight, bias = self.retrained_head.weight.detach(), self.retrained_head.bias.detach()
        classes = torch.nonzero(seen.to(weight.device)).flatten()
        feats = self.federated_features.detach().clone().view(k, m, d)[classes].requires_grad_(True)
        onehot = F.one_hot(classes, k).to(feats.dtype).unsqueeze(1)  # [S, 1, K]
        target_w, target_b = real_w[classes], real_b[classes]
        opt = torch.optim.SGD([feats], lr=self.lr_feature)
        for _ in range(self.match_steps):
            g = (F.softmax(feats @ weight.T + bias, dim=2) - onehot) / m  # [S, M, K]
            gw, gb = g.transpose(1, 2) @ feats, g.sum(1)  # [S, K, D], [S, K]
            loss = matching_distance(gw, gb, target_w, target_b)
            opt.zero_grad()
            loss.backward()
            opt.step()
        self.federated_features.view(k, m, d)[classes] = feats.detach()

    @torch.no_grad()
    def retrain_classifier(self, round_idx: int) -> None:
        """A fresh linear classifier trained by plain SGD on the federated features (mean CE,
        closed-form gradients); becomes ``retrained_head``."""
        device, dtype = self.federated_features.device, self.federated_features.dtype  # the run's precision
        gen = torch_generator(derive_seed(self.server_seed, round_idx, -1, SERVER))
        d, k = self.feature_dim, self.num_classes
        bound = 1.0 / d**0.5  # nn.Linear's default initialisation range (drawn in float32)
        weight = ((torch.rand(k, d, generator=gen) * 2 - 1) * bound).to(device, dtype)
        bias = ((torch.rand(k, generator=gen) * 2 - 1) * bound).to(device, dtype)
        feats, onehot = self.federated_features, F.one_hot(self.federated_labels, k).to(weight.dtype)
        n, b, lr = len(feats), self.retrain_batch, self.lr_retrain
        for _ in range(self.retrain_epochs):
            order = torch.randperm(n, generator=gen).to(device)
            xs, ys = feats[order], onehot[order]
            for start in range(0, n, b):
                x, y = xs[start : start + b], ys[start : start + b]
                g = (F.softmax(torch.addmm(bias, x, weight.T), dim=1) - y) / len(x)  # = classifier_gradient
                weight.addmm_(g.T, x, alpha=-lr)
                bias.sub_(g.sum(0), alpha=lr)
        self.retrained_head.weight.copy_(weight)
        self.retrained_head.bias.copy_(bias)


class CReRFServer(ServerPart):
    """CReRF's server side: feature matching and the classifier re-trained on the federated features,
    both kept on the model (frozen: ``federated_features``, ``retrained_head``, which evaluation uses)."""

    def upload_shapes(self) -> dict[str, tuple[int, ...]]:
        m = self.module
        k, d = m.num_classes, m.feature_dim
        return {GRAD_W: (k, k, d), GRAD_B: (k, k), HOLDERS: (k,)}

    def step(self, global_state: dict[str, torch.Tensor], extras: dict[str, torch.Tensor], round_idx: int,
             server: ServerContext) -> None:
        m = self.module
        holders = extras[HOLDERS]
        seen = holders > 0
        if not bool(seen.any()):
            return
        scale = (1.0 / holders.clamp(min=1)).to(m.federated_features.dtype)
        real_w = extras[GRAD_W].to(m.federated_features.dtype) * scale.view(-1, 1, 1)
        real_b = extras[GRAD_B].to(m.federated_features.dtype) * scale.view(-1, 1)
        with torch.enable_grad():
            m.match_features(real_w, real_b, seen)
        m.retrain_classifier(round_idx)

    def state(self) -> dict[str, torch.Tensor]:
        m = self.module
        return {"features": m.federated_features.clone(), "weight": m.retrained_head.weight.detach().clone(),
                "bias": m.retrained_head.bias.detach().clone()}

    def load_state(self, state: dict[str, torch.Tensor], server: ServerContext) -> None:
        m = self.module
        m.federated_features.copy_(state["features"])
        with torch.no_grad():
            m.retrained_head.weight.copy_(state["weight"])
            m.retrained_head.bias.copy_(state["bias"])
