"""Model state helpers shared by methods: a submodule's entries of a state dict, the parameters a
method's server-side correction acts on, and the module evaluated at other state tensors.

``FrozenModel`` runs the live submodules on stored tensors (the received global model for FedNTD's
and BalanceFL's teachers and MOON's positive; a client's previous model for MOON's negative)
through ``torch.func.functional_call``: no module is deep-copied per client or per batch.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call


def substate(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries under ``prefix.`` with the prefix stripped (a submodule's state)."""
    cut = len(prefix) + 1
    return {k[cut:]: v for k, v in state.items() if k.startswith(prefix + ".")}


def trainable_shared_parameters(module) -> list[tuple[str, nn.Parameter]]:
    """The parameters that are trained and aggregated (Scaffold's control variates and FedDyn's
    dynamic regulariser act on exactly these; BatchNorm buffers are plainly averaged)."""
    shared = set(module.shared_keys())
    return [(n, p) for n, p in module.named_parameters() if p.requires_grad and n in shared]


class FrozenModel:
    """``module``'s submodules evaluated at ``state`` (a full state dict, or the part of it that the
    submodules used need), without gradient.

    ``train_mode=False`` runs them in eval mode (BatchNorm on the state's running statistics);
    ``True`` on batch statistics (BalanceFL's teacher), and the running statistics this updates are
    private clones, never the caller's tensors. The module's own train/eval flags are restored.
    """

    def __init__(self, module: nn.Module, state: dict[str, torch.Tensor], train_mode: bool = False) -> None:
        self.module, self.train_mode = module, train_mode
        buffers = {name for name, _ in module.named_buffers()}
        self.state = {k: (v.clone() if train_mode and k in buffers else v) for k, v in state.items()}
        self._parts: dict[str, dict[str, torch.Tensor]] = {}

    def run(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Submodule ``name`` (e.g. 'backbone') of the module, at the stored state, on ``x``."""
        sub = getattr(self.module, name)
        if name not in self._parts:
            self._parts[name] = substate(self.state, name)
        was = sub.training
        sub.train(self.train_mode)
        try:
            with torch.no_grad():
                return functional_call(sub, self._parts[name], (x,))
        finally:
            sub.train(was)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.run("backbone", x)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.run("head", self.features(x))
