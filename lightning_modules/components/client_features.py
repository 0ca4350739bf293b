"""Features of a client's training data, computed by a model without gradient (prototypes, NPR's
sub-clusters, BalanceFL's feature covariance): one helper, its batch size a parameter."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from lightning_modules.base import ClientContext


@contextlib.contextmanager
def evaluating(module: nn.Module) -> Iterator[None]:
    """Eval mode within the block; the module's mode is restored afterwards."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


@torch.no_grad()
def client_features(ctx: ClientContext, extract: Callable[[torch.Tensor], torch.Tensor], batch_size: int = 256,
                    even: bool = False) -> torch.Tensor:
    """``extract(x)`` of all the client's training images (no augmentation), in the order of
    ``ctx.indices``, as [n, D] in the batches' dtype (the run's precision: float32, or float64 under
    64-true). The images go through ``extract`` in consecutive batches of
    ``batch_size`` (the last one smaller); ``even=True`` splits them into ceil(n / batch_size)
    batches of (nearly) equal size instead, so that a train-mode BatchNorm sees comparable batches."""
    n = len(ctx.indices)
    if even:
        chunks = list(torch.tensor_split(ctx.indices, -(-n // batch_size)))
    else:
        chunks = [ctx.indices[i : i + batch_size] for i in range(0, n, batch_size)]
    return torch.cat([extract(ctx.data.to_float(idx)[0]).to(ctx.data.mean.dtype) for idx in chunks])


def class_feature_sums(module, ctx: ClientContext, normalise: bool = False,
                       batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class sums [C, D] of the module's pooled features of the client's training samples (each
    L2-normalised first if ``normalise``), in eval mode, and the class counts [C] (float), both in the
    run's precision."""
    with evaluating(module):
        feats = client_features(ctx, module.features, batch_size)
    if normalise:
        feats = F.normalize(feats, dim=1)
    onehot = F.one_hot(ctx.labels, module.num_classes).to(feats.dtype)  # [n, C]
    sums = onehot.T @ feats  # a matmul, not index_add_ (GPU atomics: run-to-run non-deterministic)
    return sums, onehot.sum(dim=0)
