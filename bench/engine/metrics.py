"""Classification metrics from probabilities: accuracy, macro-F1, balanced accuracy, macro AUC."""
from __future__ import annotations

import torch
from torchmetrics.functional.classification import multiclass_auroc

from bench.engine.val_scores import VAL_SCORES, metric_sum  # noqa: F401 (the orchestrator's criteria; re-exported)

METRIC_NAMES = ("accuracy", "f1", "balanced_accuracy", "precision", "auc")


def confusion_matrix(preds: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """[true, predicted] counts."""
    return torch.bincount(labels * num_classes + preds, minlength=num_classes**2).view(num_classes, num_classes)


def classification_metrics(probs: torch.Tensor, labels: torch.Tensor, num_classes: int) -> dict[str, float]:
    """Metrics in percent, as sklearn defines them, plus ``predicted_classes`` (a count).

    Macro precision/F1 average over the classes present in the labels or the predictions;
    balanced accuracy averages recall over the classes present in the labels; AUC is the
    macro one-vs-rest AUC over the classes present in the labels (an absent class has none).
    """
    probs = probs.float()
    labels = labels.long()
    cm = confusion_matrix(probs.argmax(1), labels, num_classes).double()
    tp, support, predicted = cm.diag(), cm.sum(1), cm.sum(0)
    in_labels = support > 0
    in_either = in_labels | (predicted > 0)
    recall = tp / support.clamp(min=1)
    precision = tp / predicted.clamp(min=1)
    f1 = torch.where(precision + recall > 0, 2 * precision * recall / (precision + recall).clamp(min=1e-12), 0.0)
    out = {
        "accuracy": float(tp.sum() / cm.sum()),
        "f1": float(f1[in_either].mean()),
        "balanced_accuracy": float(recall[in_labels].mean()),
        "precision": float(precision[in_either].mean()),
    }
    if int(in_labels.sum()) >= 2:
        per_class = multiclass_auroc(probs, labels, num_classes, average=None, thresholds=None)
        out["auc"] = float(per_class[in_labels].mean())
    else:
        out["auc"] = float("nan")
    # not a percentage: how many classes the model predicts at all (1 = collapsed to a constant)
    return {**{k: 100.0 * v for k, v in out.items()}, "predicted_classes": float(int((predicted > 0).sum()))}
