"""Evaluation of a model on a split, sharded over ranks; probabilities reduced as one tensor."""
from __future__ import annotations

import torch

from bench.core.batches import DeviceData
from bench.engine.liveness import waiting_on
from bench.engine.metrics import classification_metrics

# input values per evaluation batch when fed.eval_batch_size is null: on a GPU 8 MiB as float32 (large
# batches keep it busy); on a CPU 2 MiB, where activations that stay in cache are faster. Measured on
# the 2-core CPU of issue 19, ResNet-18 at 28 px, two 1-thread ranks evaluating at once: 1,203 samples/s
# per rank at batch 256, 1,374 at 512, 1,539-1,605 at 668 (2**19 values), 1,383 at 1,024, ~1,070 at 2,674.
EVAL_VALUES = {"cpu": 2**19, "accelerator": 2**21}
EVAL_BATCH_RANGE = (256, 4096)


def eval_batch_size(data: DeviceData, requested: int | None = None) -> int:
    """``requested``, or as many samples as fit EVAL_VALUES input values, within EVAL_BATCH_RANGE:
    on a CPU 2048 images of 16 px, 668 of 28 px, 256 (the floor) from 45 px RGB up; on a GPU 4096,
    2674 and 256 from 90 px RGB up."""
    if requested:
        return requested
    per_sample = max(1, data.images[0].numel()) if len(data.images) else 1
    values = EVAL_VALUES["cpu" if data.images.device.type == "cpu" else "accelerator"]
    low, high = EVAL_BATCH_RANGE
    return max(low, min(high, values // per_sample))


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
        out.append(torch.softmax(logits.to(x.dtype), dim=1))  # the run's precision
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


def evaluate_local(module, data: DeviceData, index: torch.Tensor, fabric, num_classes: int,
                   batch_size: int = 256) -> dict[str, float]:
    """Evaluate on samples of one rank only (a client's own test split)."""
    probs = predict_probs(module, data, index, fabric, batch_size)
    return classification_metrics(probs, data.labels[index], num_classes)
