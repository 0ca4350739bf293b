"""Evaluation of a model on a split, sharded over ranks; probabilities reduced as one tensor."""
from __future__ import annotations

import torch

from bench.core.batches import DeviceData
from bench.liveness import waiting_on
from bench.metrics import classification_metrics


@torch.no_grad()
def predict_probs(module, data: DeviceData, index: torch.Tensor, fabric, batch_size: int = 256,
                  logits_fn=None) -> torch.Tensor:
    """Softmax probabilities [len(index), K] of ``module.eval_logits`` (or ``logits_fn``; module left
    in eval mode)."""
    logits_fn = logits_fn or module.eval_logits
    module.eval()
    out = []
    for start in range(0, len(index), batch_size):
        x, _ = data.to_float(index[start : start + batch_size])
        with fabric.autocast():
            logits = logits_fn(x)
        out.append(torch.softmax(logits.float(), dim=1))
    if not out:
        return torch.zeros(0, module.num_classes, device=data.images.device)
    return torch.cat(out)


def evaluate_sharded(module, data: DeviceData, fabric, num_classes: int, batch_size: int = 256,
                     logits_fn=None) -> dict[str, float]:
    """Each rank predicts every world_size-th sample; one all-reduce assembles all probabilities.
    ``logits_fn`` (default ``module.eval_logits``) scores a batch."""
    n = len(data.labels)
    mine = torch.arange(fabric.global_rank, n, fabric.world_size, device=data.labels.device)
    probs = torch.zeros(n, num_classes, dtype=torch.float64, device=data.labels.device)
    probs[mine] = predict_probs(module, data, mine, fabric, batch_size, logits_fn).double()
    if fabric.world_size > 1:
        with waiting_on(fabric, "the evaluation all-reduce"):
            fabric.all_reduce(probs, reduce_op="sum")
    return classification_metrics(probs, data.labels, num_classes)


def evaluate_local(module, data: DeviceData, index: torch.Tensor, fabric, num_classes: int) -> dict[str, float]:
    """Evaluate on samples of one rank only (a client's own test split)."""
    probs = predict_probs(module, data, index, fabric)
    return classification_metrics(probs, data.labels[index], num_classes)
