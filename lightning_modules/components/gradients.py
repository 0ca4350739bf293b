"""Gradient edits applied after a backward pass (Scaffold's and FedDyn's corrections) as foreach ops:
one launch per list on a GPU instead of one per parameter, with the same arithmetic per element."""
from __future__ import annotations

import torch

from bench.core.compat import foreach


def add_to_gradients(params: list[torch.Tensor], additions: list[torch.Tensor], copy_missing: bool) -> None:
    """p.grad += a for every pair; a parameter without a gradient gets a (a copy of it when
    ``copy_missing``, for additions reused across steps) as its gradient."""
    grads, adds = [], []
    for p, a in zip(params, additions):
        if p.grad is None:
            p.grad = a.clone() if copy_missing else a
        else:
            grads.append(p.grad)
            adds.append(a)
    if grads:
        foreach("add_")(grads, adds)
