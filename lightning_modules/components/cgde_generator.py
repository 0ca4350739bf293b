"""CGDE (FedBM): the concept-conditioned generator, its three losses and its server-side training.

L_generator = L_sem + lambda_div * L_div + lambda_dis * L_dis   (FedBM Eq. 10), with
- L_sem: the LKCC surrogate loss of the frozen global model on the synthetic images (Eq. 6),
- L_div: per-class pairwise 1 / (L1(x_i, x_j) / L1(z_i, z_j) + 1e-5), summed over classes / K (Eq. 7;
  L1 the norms themselves, as the public code's F.pdist(p=1), not per-dimension means),
- L_dis: sum over the teacher's BN layers of ||mu_run - mu_batch||_2 + ||var_run - var_batch||_2 (Eq. 8).
The teacher sees the images augmented as the public code does (``augment_generated``: RandomCrop with
zero padding 4, then a horizontal and a vertical flip, one draw per batch); L_div uses the raw images.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import contextmanager
from typing import Self

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.compat import batch_norm_base
from bench.core.errors import FedbenchError
from lightning_modules.components.concept_distributions import ConceptDistribution
from lightning_modules.components.lkcc import lkcc_surrogate_loss

_START = 8  # spatial size of the first feature map


def _block(c_in: int, c_out: int, upsample: bool) -> list[nn.Module]:
    layers: list[nn.Module] = [nn.Upsample(scale_factor=2)] if upsample else []
    return layers + [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.LeakyReLU(0.2)]


class ConceptGenerator(nn.Module):
    """z [B, z_dim] -> images [B, out_channels, image_size, image_size] in [0, 1].

    Linear(z_dim -> 128 x 8 x 8) -> [Conv3x3 128->128, BN, LReLU(0.2)] -> n x [Upsample x2, Conv3x3,
    BN, LReLU(0.2)] -> Conv3x3(-> out_channels) -> (resize) -> Sigmoid. n is the fewest doublings
    of 8 that reach image_size (4 for 128: channels 128, 128, 64, 64 exactly as FedBM's code; 2
    for 28 / 32); the last two stages have 64 channels, earlier ones 128. When 8 * 2^n differs
    from image_size the map is resized (antialiased bilinear) to it before the sigmoid.
    ``base_channels`` (default 128, the reference) scales every width (the 64s are half of it),
    for cheap runs on small data.
    """

    def __init__(self, z_dim: int, out_channels: int = 3, image_size: int = 128,
                 base_channels: int = 128) -> None:
        super().__init__()
        if min(z_dim, out_channels, image_size, base_channels // 2) < 1:
            raise FedbenchError(f"bad generator shape: z_dim={z_dim}, channels={out_channels}, "
                                f"size={image_size}, base_channels={base_channels}")
        self.z_dim, self.out_channels, self.image_size = z_dim, out_channels, image_size
        self.base_channels = c = base_channels
        n_up = max(0, math.ceil(math.log2(image_size / _START)))
        widths = [c] * max(0, n_up - 2) + [c // 2] * min(2, n_up)
        self.fc = nn.Linear(z_dim, c * _START * _START)
        layers = _block(c, c, upsample=False)
        c_in = c
        for c_out in widths:
            layers += _block(c_in, c_out, upsample=True)
            c_in = c_out
        layers.append(nn.Conv2d(c_in, out_channels, 3, padding=1))
        self.body = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.body(self.fc(z).view(len(z), self.base_channels, _START, _START))
        if x.shape[-1] != self.image_size:
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear",
                              align_corners=False, antialias=True)
        return torch.sigmoid(x)


def diversity_loss(images: torch.Tensor, z: torch.Tensor, labels: torch.Tensor, num_classes: int,
                   eps: float = 1e-5) -> torch.Tensor:
    """L_div: for every class with >= 2 samples, the mean over pairs i < j of
    1 / (L1(x_i, x_j) / L1(z_i, z_j) + eps), L1 the sum of absolute differences (FedBM Eq. 7, the
    public code's F.pdist(p=1)); summed over classes and divided by ``num_classes``."""
    flat_x, flat_z = images.flatten(1), z.flatten(1)
    if images.device.type != "cpu":  # no per-class unique()/nonzero read back per generator step
        return batched_diversity_loss(flat_x, flat_z, labels, num_classes, eps)
    total = images.new_zeros(())
    for c in labels.unique():
        idx = (labels == c).nonzero(as_tuple=True)[0]
        if len(idx) < 2:
            continue
        i, j = torch.triu_indices(len(idx), len(idx), offset=1, device=idx.device)
        xi, xj = flat_x[idx[i]], flat_x[idx[j]]
        zi, zj = flat_z[idx[i]], flat_z[idx[j]]
        d_x = (xi - xj).abs().sum(dim=1)
        d_z = (zi - zj).abs().sum(dim=1).clamp_min(1e-12)
        total = total + (1.0 / (d_x / d_z + eps)).mean()
    return total / num_classes


def batched_diversity_loss(flat_x: torch.Tensor, flat_z: torch.Tensor, labels: torch.Tensor, num_classes: int,
                           eps: float = 1e-5) -> torch.Tensor:
    """``diversity_loss`` over all pairs at once (GPU): the same sum up to float rounding
    (tests/perf/test_gpu_paths.py), with nothing read back to the host."""
    d_x = torch.cdist(flat_x, flat_x, p=1)
    d_z = torch.cdist(flat_z, flat_z, p=1).clamp_min(1e-12)
    n = len(labels)
    upper = torch.ones(n, n, dtype=torch.bool, device=labels.device).triu(1)
    same = (labels[:, None] == labels[None, :]) & upper
    inv = torch.where(same, 1.0 / (d_x / d_z + eps), torch.zeros_like(d_x))
    onehot = F.one_hot(labels.long(), num_classes).to(inv.dtype)  # [n, K]
    sums = onehot.T @ inv.sum(dim=1)  # per class, over its pairs i < j (i's class = j's class)
    counts = onehot.sum(dim=0)
    pairs = counts * (counts - 1) / 2
    return torch.where(pairs > 0, sums / pairs.clamp_min(1.0), torch.zeros_like(sums)).sum() / num_classes


def augment_generated(images: torch.Tensor, rng: torch.Generator, padding: int = 4) -> torch.Tensor:
    """Generated images augmented as FedBM's public code does (generator_driver.py ``self.aug``):
    RandomCrop(image size, padding 4, zero fill), RandomHorizontalFlip, RandomVerticalFlip. torchvision
    applies them to the whole batch tensor, so one crop offset and one decision per flip serve the batch."""
    return crop_flip(images, crop_flip_draws(rng, padding), padding)


def crop_flip_draws(rng: torch.Generator, padding: int = 4) -> tuple[int, int, bool, bool]:
    """(top, left, hflip, vflip) from the CPU generator ``rng`` in torchvision's order (row offset, column
    offset: randint(0, 2 * padding + 1); then rand(1) < 0.5 for the horizontal, then the vertical flip),
    so the same on every device and rank."""
    if rng.device.type != "cpu":
        raise FedbenchError(f"FedBM's augmentation draws from a CPU generator (device-independent), got {rng.device}.")
    top = int(torch.randint(0, 2 * padding + 1, (1,), generator=rng))
    left = int(torch.randint(0, 2 * padding + 1, (1,), generator=rng))
    hflip = bool(torch.rand(1, generator=rng) < 0.5)
    return top, left, hflip, bool(torch.rand(1, generator=rng) < 0.5)


def crop_flip(images: torch.Tensor, draws: tuple[int, int, bool, bool], padding: int = 4) -> torch.Tensor:
    """The crop at (top, left) of the zero-padded batch, then the flips; nothing is read back."""
    top, left, hflip, vflip = draws
    h, w = images.shape[-2:]
    out = F.pad(images, (padding,) * 4)[..., top:top + h, left:left + w]
    if hflip:
        out = out.flip(-1)
    return out.flip(-2) if vflip else out


class BNStatisticsHook:
    """Context manager: forward hooks on every BatchNorm layer (with running statistics) of
    ``model`` recording ||running_mean - batch_mean||_2 + ||running_var - batch_var||_2 of each
    call's input (batch statistics over all dims but the channel; variance biased, as BN
    normalises with). ``loss()`` is their sum; the hooks are removed on exit."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.terms: list[torch.Tensor] = []
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def _hook(self, module: nn.Module, inputs: tuple[torch.Tensor, ...], _output: torch.Tensor) -> None:
        x = inputs[0]
        dims = [d for d in range(x.ndim) if d != 1]
        mean = x.mean(dim=dims)
        var = x.var(dim=dims, unbiased=False)
        self.terms.append(torch.linalg.vector_norm(module.running_mean - mean)
                          + torch.linalg.vector_norm(module.running_var - var))

    def __enter__(self) -> Self:
        for m in self.model.modules():
            if isinstance(m, batch_norm_base()) and m.running_mean is not None:
                self._handles.append(m.register_forward_hook(self._hook))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def loss(self) -> torch.Tensor:
        if not self.terms:
            raise FedbenchError("BN-statistics loss: the teacher has no BatchNorm layer with running statistics "
                                "(or none was called); disable it with use_dis=False.")
        return torch.stack(self.terms).sum()


def bn_statistics_loss(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """L_dis of ``images`` through ``model`` in eval mode (its previous mode is restored)."""
    was_training = model.training
    model.eval()
    try:
        with BNStatisticsHook(model) as hook:
            model(images)
        return hook.loss()
    finally:
        model.train(was_training)


def _module_device(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


@torch.no_grad()
def generate_batch(generator: nn.Module, distribution: ConceptDistribution, batch_size: int,
                   rng: torch.Generator, noise_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic images in [0, 1] and their uniform random labels, generator in eval mode, no grad.

    Labels and conditions come from ``rng`` (seed it from (seed, round, client)); the caller
    normalises the images like real ones before the model sees them.
    """
    was_training = generator.training
    generator.eval()
    try:
        device = _module_device(generator)
        labels = torch.randint(distribution.num_classes, (batch_size,), generator=rng, device=rng.device)
        z = distribution.to(device).sample(labels, generator=rng, noise_only=noise_only)
        return generator(z), labels.to(device)
    finally:
        generator.train(was_training)


def train_generator(
    generator: nn.Module,
    teacher_forward: Callable[[torch.Tensor], torch.Tensor],
    teacher_model: nn.Module,
    distribution: ConceptDistribution,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    tau: float,
    lambda_div: float,
    lambda_dis: float,
    normalise: Callable[[torch.Tensor], torch.Tensor] | None,
    seed: int,
    use_sem: bool = True,
    use_div: bool = True,
    use_dis: bool = True,
    noise_only: bool = False,
    sem_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    augment: bool = True,
) -> dict[str, float]:
    """Train ``generator`` for ``steps`` Adam steps against the frozen teacher; return the last losses.

    ``teacher_forward(images) -> h`` (L2-normalised features of ``teacher_model``) feeds L_sem
    (the LKCC surrogate with ``distribution``'s mu / sigma_diag and ``tau``). ``normalise`` maps
    the generator's [0, 1] images to the teacher's input normalisation (None: identity). Labels
    (uniform) and conditions are drawn from a CPU torch.Generator seeded with ``seed``, so the
    result is the same on every rank. The teacher is in eval mode with gradients off for its
    parameters; its modes and flags are restored afterwards. Each call uses a fresh
    Adam(lr, betas 0.5/0.999), as the public code does.
    ``sem_loss(h, labels)`` replaces the LKCC surrogate as L_sem (FedBM without LKCC: the CE of the
    teacher's learned classifier). ``augment``: the teacher (L_sem, L_dis) sees ``augment_generated``
    of each batch, drawn from the same CPU stream after the labels and conditions (the public code).
    """
    if steps < 1 or batch_size < 1:
        raise FedbenchError(f"train_generator needs steps >= 1 and batch_size >= 1, got {steps}, {batch_size}")
    if not (use_sem or use_div or use_dis):
        raise FedbenchError("train_generator: every loss term is disabled (use_sem, use_div, use_dis).")
    device = _module_device(generator)
    objective = GeneratorObjective(teacher_forward, teacher_model, distribution.to(device), tau, lambda_div,
                                   lambda_dis, normalise, (use_sem, use_div, use_dis), sem_loss)
    view = (lambda images: augment_generated(images, rng)) if augment else (lambda images: images)
    rng = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(generator.parameters(), lr=lr, betas=(0.5, 0.999))
    terms: list[torch.Tensor] = []  # per step [loss, sem, div, dis], detached: read once at the end (no host
    with teacher_frozen(teacher_model, generator):  # sync per step on a GPU)
        for _ in range(steps):
            labels = torch.randint(objective.dist.num_classes, (batch_size,), generator=rng).to(device)
            z = objective.dist.sample(labels, generator=rng, noise_only=noise_only)
            images = generator(z)
            loss, step_terms = objective.losses(images, z, labels, seen=view(images))
            terms.append(step_terms)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return last_finite_losses(torch.stack(terms).tolist())  # the one read of the losses


class GeneratorObjective:
    """L = L_sem + lambda_div L_div + lambda_dis L_dis of generated images against the frozen teacher;
    ``use`` switches (sem, div, dis) on or off; ``sem_loss(h, labels)`` replaces the LKCC surrogate."""

    def __init__(self, teacher_forward, teacher_model: nn.Module, dist: ConceptDistribution, tau: float,
                 lambda_div: float, lambda_dis: float, normalise, use: tuple[bool, bool, bool], sem_loss=None):
        self.teacher_forward, self.teacher_model, self.dist, self.tau = teacher_forward, teacher_model, dist, tau
        self.lambda_div, self.lambda_dis, self.normalise, self.sem_loss = lambda_div, lambda_dis, normalise, sem_loss
        self.use_sem, self.use_div, self.use_dis = use

    def losses(self, images: torch.Tensor, z: torch.Tensor, labels: torch.Tensor,
               seen: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(L, detached [L, sem, div, dis]) of one generated batch; the teacher (L_sem, L_dis) sees
        ``seen`` (the augmented images; default ``images``), L_div the raw ``images``."""
        seen = images if seen is None else seen
        with BNStatisticsHook(self.teacher_model) as hook:
            h = self.teacher_forward(self.normalise(seen) if self.normalise is not None else seen)
        zero = images.new_zeros(())
        if not self.use_sem:
            sem = zero
        elif self.sem_loss is not None:
            sem = self.sem_loss(h, labels)
        else:
            sem = lkcc_surrogate_loss(h, labels, self.dist.mu, self.dist.sigma_diag, self.tau)
        div = diversity_loss(images, z, labels, self.dist.num_classes) if self.use_div else zero
        dis = hook.loss() if self.use_dis else zero
        loss = sem + self.lambda_div * div + self.lambda_dis * dis
        return loss, torch.stack([t.detach().to(loss.dtype).reshape(()) for t in (loss, sem, div, dis)])


@contextmanager
def teacher_frozen(teacher_model: nn.Module, generator: nn.Module):
    """The teacher in eval mode with gradients off, the generator in train mode; both restored on exit."""
    teacher_was_training = teacher_model.training
    grad_flags = [p.requires_grad for p in teacher_model.parameters()]
    gen_was_training = generator.training
    teacher_model.eval().requires_grad_(False)
    generator.train()
    try:
        yield
    finally:
        teacher_model.train(teacher_was_training)
        for p, flag in zip(teacher_model.parameters(), grad_flags):
            p.requires_grad_(flag)
        generator.train(gen_was_training)


def last_finite_losses(table: list[list[float]]) -> dict[str, float]:
    """The last step's losses; a clear error naming the first step whose loss is not finite."""
    bad = next((step for step, row in enumerate(table) if not math.isfinite(row[0])), None)
    if bad is not None:
        loss, sem, div, dis = table[bad]
        raise FedbenchError(f"Generator loss is {loss} at step {bad} (sem {sem}, div {div}, dis {dis}): "
                            "lower the generator lr.")
    return dict(zip(("loss", "sem", "div", "dis"), table[-1]))
