"""The received global model as a frozen teacher, without copying the model.

FedNTD and BalanceFL distil from the global model a client receives. Its tensors are already on
the device (``ctx.global_state``); the teacher runs the live backbone and head on them through
``torch.func.functional_call``, so no module is deep-copied per client or per batch.

``train_mode=True`` runs BatchNorm on batch statistics (BalanceFL's code keeps its teacher in
train mode); the running statistics it then updates are private clones, never the read-only
global state.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call


def substate(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries under ``prefix.`` with the prefix stripped (a submodule's state)."""
    cut = len(prefix) + 1
    return {k[cut:]: v for k, v in state.items() if k.startswith(prefix + ".")}


class GlobalTeacher:
    """Features and logits of ``module.backbone`` / ``module.head`` evaluated at ``global_state``."""

    def __init__(self, module: nn.Module, global_state: dict[str, torch.Tensor], train_mode: bool = False) -> None:
        self.module, self.train_mode = module, train_mode
        buffers = {name for name, _ in module.named_buffers()}
        state = {k: (v.clone() if train_mode and k in buffers else v) for k, v in global_state.items()}
        self.backbone_state = substate(state, "backbone")
        self.head_state = substate(state, "head")

    def _run(self, sub: nn.Module, state: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        was = sub.training
        sub.train(self.train_mode)
        try:
            with torch.no_grad():
                return functional_call(sub, state, (x,))
        finally:
            sub.train(was)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(self.module.backbone, self.backbone_state, x)

    def head(self, f: torch.Tensor) -> torch.Tensor:
        return self._run(self.module.head, self.head_state, f)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
