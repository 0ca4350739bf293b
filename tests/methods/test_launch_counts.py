"""Issue 42, item 3: the launch-heavy methods' per-step extra work runs as foreach ops, and computes what
the per-parameter formulas computed.

Ops are counted at the aten dispatch level (``OpCounter``, a TorchDispatchMode): one op is one kernel
launch on a GPU (a foreach op on CUDA is one multi-tensor launch per chunk of tensors; on the CPU it
is one dispatch). A step's count is the difference between local updates of 3 and 2 batches (the
once-per-update setup cancels), on ResNet-18, the tables' model. Equality: each method against the
old per-parameter formula (kept below as the old code wrote it), from the same initial model, over
two rounds of local training with state carried between them: the same bits everywhere.
"""
from __future__ import annotations

import collections
import copy
import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench.core.batches import DeviceData
from lightning_modules.base import ClientContext
from lightning_modules.components.state import FrozenModel
from lightning_modules.fedavg import FedAvg
from lightning_modules.feddyn import FedDyn
from lightning_modules.fedprox import FedProx, ProximalTerm
from lightning_modules.moon import Moon
from lightning_modules.scaffold import Scaffold

pytestmark = pytest.mark.slow  # end-to-end (>= 6 s): make test-fast leaves this file out


class OpCounter(TorchDispatchMode):
    """Counts every aten op dispatched while it is active (by name in ``ops``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def context(module, state: dict, round_idx: int, samples: int = 24) -> ClientContext:
    gen = torch.Generator().manual_seed(round_idx)
    labels = torch.arange(samples) % 3
    data = DeviceData(torch.randint(0, 256, (samples, 3, 16, 16), generator=gen, dtype=torch.uint8), labels,
                      torch.full((1, 3, 1, 1), 0.4), torch.full((1, 3, 1, 1), 0.25))
    glob = {k: module.state_dict()[k].clone() for k in module.shared_keys()}
    return ClientContext(client_id=0, round_idx=round_idx, seed=0, data=data, indices=torch.arange(samples),
                         num_classes=3, global_state=glob, generator=torch.Generator().manual_seed(2), state=state,
                         lr=0.05, batch_size=8)


class FirstBatches:
    """The first ``n`` batches of ``batches`` (one epoch)."""

    def __init__(self, batches, n: int) -> None:
        self.items = list(batches)[:n]

    def set_epoch(self, epoch: int) -> None:
        pass

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(self.items)


@functools.cache
def fedavg_ops_per_step() -> int:
    return ops_per_step(FedAvg)


def ops_per_step(cls, **kwargs) -> int:
    """Aten ops of one local step of ``cls`` on ResNet-18 in its second round (state carried from the first)."""
    torch.manual_seed(0)
    module = cls(num_classes=3, in_channels=3, backbone="resnet18", **kwargs)
    module.train()
    counts, state = [], {}
    first = context(module, state, 0)
    module.local_update(first, module.client_batches(first))
    module.on_client_end(first)
    for n in (2, 3):
        snapshot = copy.deepcopy(module.state_dict()), copy.deepcopy(state)
        ctx = context(module, state, 1)
        with OpCounter() as counter:
            module.local_update(ctx, FirstBatches(module.client_batches(ctx), n))
        counts.append(counter.total)
        module.load_state_dict(snapshot[0])
        state.clear()
        state.update(snapshot[1])
    return counts[1] - counts[0]


# measured (this file's ops_per_step, CPU, torch 2.14): FedAvg 551 ops per step; before the rewrite FedProx
# 1117, FedDyn 861, Scaffold 613; after it FedProx 625 (its 62 parameters' gradient
# accumulations are autograd's own), FedDyn 555, Scaffold 552; MOON 798, not rewritten (below). Since the loss
# check moved out of the step (test_the_local_loop_adds_only_the_batch_conversion_to_a_bare_step): FedAvg 544,
# FedProx 618, FedDyn 548, Scaffold 545, MOON 791
@pytest.mark.parametrize("cls,kwargs,extra", [(FedProx, {"mu": 0.01}, 80), (FedDyn, {}, 8), (Scaffold, {}, 4)])
def test_methods_extra_ops_per_step_do_not_grow_with_the_parameter_count(cls, kwargs, extra):
    """Over FedAvg's step, FedProx adds a few foreach ops plus one gradient accumulation per parameter;
    FedDyn and Scaffold add a few foreach ops (ResNet-18 has 62 parameters)."""
    assert ops_per_step(cls, **kwargs) - fedavg_ops_per_step() <= extra


# ---- the old per-parameter formulas --------------------------------------------------------
class OldProximalTerm(ProximalTerm):
    def for_client(self, module, ctx):
        anchors = [(p, ctx.global_state[n]) for n, p in module.named_parameters()
                   if p.requires_grad and n in ctx.global_state]
        return lambda batch, f: 0.5 * self.mu * torch.stack([(p - w).pow(2).sum() for p, w in anchors]).sum()


class OldFedDyn(FedDyn):
    def dynamic_regulariser(self, ctx):
        params = self.dynamic_parameters()
        if "grad_memory" not in ctx.state:
            ctx.state["grad_memory"] = {n: torch.zeros_like(p) for n, p in params}
        terms = [(p, ctx.global_state[n], ctx.state["grad_memory"][n]) for n, p in params]

        def correct() -> None:
            for p, anchor, g_k in terms:
                correction = self.alpha * (p.detach() - anchor) - g_k
                if p.grad is None:
                    p.grad = correction
                else:
                    p.grad.add_(correction)

        return correct, terms

    def update_grad_memory(self, terms) -> None:
        for p, anchor, g_k in terms:
            g_k.sub_(self.alpha * (p.detach() - anchor))


class OldScaffold(Scaffold):
    def control_variate_correction(self, ctx):
        params = self.controlled_parameters()
        if "c_local" not in ctx.state:
            ctx.state["c_local"] = {n: torch.zeros_like(p) for n, p in params}
        corrections = [(p, self.server_c(n, p) - ctx.state["c_local"][n]) for n, p in params]

        def correct() -> None:
            for p, correction in corrections:
                if p.grad is None:
                    p.grad = correction.clone()
                else:
                    p.grad.add_(correction)

        return correct


def train_two_rounds(module, server_c: bool) -> tuple[dict, dict, dict]:
    """Two local updates of one client (the second from the first's result, its state carried), on
    ResNet-18 with momentum SGD and weight decay: the weights, the client state and the uploads."""
    module.train()
    if server_c:  # a non-zero server control variate, so that c - c_i differs from -c_i
        gen = torch.Generator().manual_seed(5)
        module.c = {n: 1e-3 * torch.randn(p.shape, generator=gen) for n, p in module.controlled_parameters()}
    state: dict = {}
    for round_idx in (0, 1):
        ctx = context(module, state, round_idx)
        module.local_update(ctx, module.client_batches(ctx))
        module.on_client_end(ctx)
    return module.state_dict(), state, ctx.uploads


def bitwise_equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(bitwise_equal(a[k], b[k]) for k in a)
    return torch.equal(a, b)


@pytest.mark.parametrize("new_cls,old_cls,kwargs", [(FedDyn, OldFedDyn, {"alpha": 0.1}),
                                                     (Scaffold, OldScaffold, {}),
                                                     (FedProx, FedProx, {"mu": 0.1})])
def test_rewritten_methods_train_to_the_same_bits_as_the_per_parameter_formulas(new_cls, old_cls, kwargs):
    torch.manual_seed(0)
    new = new_cls(num_classes=3, in_channels=3, backbone="resnet18", **kwargs)
    old = old_cls(num_classes=3, in_channels=3, backbone="resnet18", **kwargs)
    old.load_state_dict(new.state_dict())
    if new_cls is FedProx:
        old.terms["prox"] = OldProximalTerm(mu=kwargs["mu"])
    initial = copy.deepcopy(new.state_dict())
    ours, theirs = train_two_rounds(new, new_cls is Scaffold), train_two_rounds(old, new_cls is Scaffold)
    assert not bitwise_equal(ours[0], initial)  # it trained
    assert bitwise_equal(ours[0], theirs[0]) and bitwise_equal(ours[1], theirs[1]) and bitwise_equal(ours[2], theirs[2])


def test_proximal_loss_value_is_the_per_parameter_sum_within_rounding():
    """The logged value: sum of squared norms against the old sum of per-parameter sums of squares."""
    torch.manual_seed(0)
    module = FedProx(num_classes=3, in_channels=3, backbone="resnet18", mu=0.1)
    ctx = context(module, {}, 0)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p), alpha=1e-2)
    new = module.terms["prox"].for_client(module, ctx)(None, None).item()
    old = OldProximalTerm(mu=0.1).for_client(module, ctx)(None, None).item()
    exact = 0.05 * sum(float((p.detach().double() - ctx.global_state[n].double()).pow(2).sum())
                       for n, p in module.named_parameters())
    # float32 sums over ResNet-18's 11M weights: measured here old 55.9021, new 55.8993, rel. 5e-5 apart; both
    # are float32 roundings of the float64 sum, each within 1e-4 of it
    assert new == pytest.approx(exact, rel=1e-4) and old == pytest.approx(exact, rel=1e-4) and exact > 0


# ---- MOON: two reference passes per step, measured --------------------------------------------
# measured (ops_per_step, CPU, torch 2.14, before the loss check left the step): MOON 798 ops per step = FedAvg 551 + 247: two eval passes of
# ResNet-18's backbone (the received and the previous model, 88 ops each) and the contrastive loss's forward
# and backward (71). Tried and not kept (issue 42 item 3): the two backbones as one channel-stacked pass (grouped
# convolutions over the two states concatenated once per local update) cut it to 712 (+161), with the same
# bits at 16 px and |dw| 2.4e-7 at 32 px (the old code's own spread across kernels: 9.5e-7), but was not
# faster on this CPU (1 thread, CPU time, new/old: ResNet-18 1.02 at 16 px, 1.07 at 128 px, batch 8;
# EfficientNet-B0 0.82 at 32 px, batch 8, 1.35 to 1.69 at 64 px, batch 32: oneDNN's grouped convolutions), and
# there was no GPU to measure the launches it saves. torch.func.vmap over the two states was worse: 554 ops
# for the two passes instead of 176 (BatchNorm's batching rule adds ops per layer)
MOON_LOSS_OPS = 80


def test_moons_step_adds_two_reference_backbone_passes_and_its_contrastive_loss():
    torch.manual_seed(0)
    module = Moon(num_classes=3, in_channels=3, backbone="resnet18")
    reference, x = FrozenModel(module, module.state_dict()), torch.zeros(8, 3, 16, 16)
    with OpCounter() as one_pass:
        reference.features(x)
    assert ops_per_step(Moon) - fedavg_ops_per_step() <= 2 * one_pass.total + MOON_LOSS_OPS


def loop_ops_per_step(loop: str, backbone: str) -> collections.Counter:
    """Aten ops of one step of loop_probe's fedbench or bare loop (epochs of 3 and 2 batches of 32, differenced)."""
    from lightning.fabric import Fabric

    from bench.perf import loop_probe
    from lightning_modules.base import FederatedModule

    counts = []
    for samples in (64, 96):
        data, classes = loop_probe.synthetic_data(samples, 28)
        torch.manual_seed(0)
        module = FederatedModule(num_classes=classes, in_channels=1, backbone=backbone)
        if loop == "bare":
            x, y = data.to_float(slice(None))
            epoch = functools.partial(loop_probe.bare_epoch, module, x, y, 32, 0)
        else:
            autocast = Fabric(accelerator="cpu", devices=1, precision="32-true").autocast
            epoch = functools.partial(loop_probe.fedbench_epoch, module, data, 32, 0, autocast)
        with OpCounter() as counter:
            epoch()
        counts.append(counter.ops)
    return counts[1] - counts[0]


@pytest.mark.parametrize("backbone", ["simple-cnn", "resnet18"])
def test_the_local_loop_adds_only_the_batch_conversion_to_a_bare_step(backbone):
    """Issue 42: fedbench's step is a bare PyTorch step plus the batch's uint8 -> normalised float conversion
    (images are kept as uint8) and one detach of the loss; the non-finite-loss check runs once per local update.
    Before, it took 6 more ops per step (isfinite and an or per step: 11 over the bare loop's 133 / 545)."""
    extra = loop_ops_per_step("fedbench", backbone) - loop_ops_per_step("bare", backbone)
    assert extra == collections.Counter({"aten.div_.Tensor": 2, "aten.sub_.Tensor": 1, "aten._to_copy.default": 1,
                                         "aten.detach.default": 1})
