"""Model state helpers shared by methods: a submodule's entries of a state dict, the parameters a
method's server-side correction acts on, and the module evaluated at other state tensors.

``FrozenModel`` runs the live submodules on stored tensors (the received global model for FedNTD's
and BalanceFL's teachers and MOON's positive; a client's previous model for MOON's negative)
through ``torch.func.functional_call``: no module is deep-copied per client or per batch.
``FrozenModels`` runs several of them (MOON's positive and negative) as one channel-stacked pass.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence

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


# the only modules with parameters or buffers that a channel-stacked pass supports (and their subclasses)
STACKABLE = (nn.Conv2d, nn.BatchNorm2d)


def stackable(module: nn.Module) -> bool:
    """Whether every parameter and buffer of ``module`` belongs to a Conv2d or BatchNorm2d."""
    return all(isinstance(m, STACKABLE) or not any(True for _ in (*m.parameters(False), *m.buffers(False)))
               for m in module.modules())


def stacked_copy(module: nn.Module, n: int) -> nn.Module:
    """``n`` copies of ``module`` side by side along the channels, as one module (eval mode): each Conv2d
    takes n times the channels in n times the groups, each BatchNorm2d n times the channels. Its
    tensors are ``module``'s own (shared, not copied): ``stacked_state`` supplies the stacked ones."""
    twin = copy.deepcopy(module, memo={id(t): t for t in (*module.parameters(), *module.buffers())})
    for m in twin.modules():
        if isinstance(m, nn.Conv2d):
            m.in_channels, m.out_channels, m.groups = n * m.in_channels, n * m.out_channels, n * m.groups
        elif isinstance(m, nn.BatchNorm2d):
            m.num_features *= n
    return twin.eval()


def stacked_state(states: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The states concatenated along the output channels (dim 0); a scalar (BatchNorm's
    num_batches_tracked, unused in eval mode) is the first state's."""
    return {k: torch.cat([s[k] for s in states]) if v.dim() else v for k, v in states[0].items()}


class FrozenModels:
    """Several ``FrozenModel`` (the same module, eval mode) run as one pass: ``run`` returns each
    one's output of submodule ``name``, as ``FrozenModel.run`` would.

    A submodule whose parameters and buffers all belong to Conv2d and BatchNorm2d layers (the CNN
    backbones) runs once as ``stacked_copy``: the input repeated along the channels, the models'
    convolutions as groups of one grouped convolution, BatchNorm and every parameter-free layer
    acting per channel, so that the output's channels are the models' outputs side by side. One
    pass instead of n: half the kernel launches for two models. Any other submodule (a Linear, a
    LayerNorm: CLIP's image encoder, MOON's projection head) runs model by model through
    ``FrozenModel.run``. A stacked backbone must not mix channels outside its Conv2d layers (a
    channel shuffle, a pool concatenating average and max along the channels); the backbones of
    lightning_modules/backbones.py do not (tests/test_launch_counts.py checks each).
    """

    def __init__(self, models: Sequence[FrozenModel]) -> None:
        if any(m.module is not models[0].module or m.train_mode for m in models):
            raise ValueError("FrozenModels runs models of one module, all in eval mode")
        self.models = list(models)
        self._stacked: dict[str, tuple[nn.Module, dict[str, torch.Tensor]] | None] = {}

    def stacked(self, name: str) -> tuple[nn.Module, dict[str, torch.Tensor]] | None:
        if name not in self._stacked:
            sub, n = getattr(self.models[0].module, name), len(self.models)
            self._stacked[name] = (stacked_copy(sub, n), stacked_state([substate(m.state, name) for m in self.models])
                                   ) if stackable(sub) else None
        return self._stacked[name]

    def run(self, name: str, x: torch.Tensor) -> list[torch.Tensor]:
        """Submodule ``name`` at each model's state, on ``x``."""
        stacked = self.stacked(name)
        if stacked is None:
            return [m.run(name, x) for m in self.models]
        with torch.no_grad():
            out = functional_call(stacked[0], stacked[1], (x.repeat(1, len(self.models), *[1] * (x.dim() - 2)),))
        return list(out.chunk(len(self.models), 1))
