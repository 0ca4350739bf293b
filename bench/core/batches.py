"""Mini-batches sliced from a uint8 tensor on the device, shuffled by an explicit generator."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from bench.core.augment import augment_batch
from bench.core.seeding import AUGMENT, SHUFFLE, derive_seed, torch_generator


@dataclass
class DeviceData:
    """A dataset resident on the device: uint8 images, labels, and the normalisation to apply.

    ``images`` may instead hold precomputed float features [N, D] (frozen-encoder methods turn
    their data into cached features once, in ``FederatedModule.prepare_splits``): batches of
    features are returned without scaling, normalisation or augmentation.
    Batches come out in the dtype of ``mean`` (float32; float64 for precision 64-true).
    """

    images: torch.Tensor  # uint8 [N, C, H, W]
    labels: torch.Tensor  # int64 [N]
    mean: torch.Tensor  # [1, C, 1, 1]
    std: torch.Tensor
    channels_last: bool = False  # image batches in channels-last memory layout (the run's ``channels_last``)
    origin: str | None = None  # names the images' content (datamodules/tensors.py TensorSplit.origin)

    def to_float(self, index: torch.Tensor | slice, augment: str = "none", gen: torch.Generator | None = None):
        if self.images.dtype != torch.uint8:  # cached features
            return self.images[index].to(self.mean.dtype), self.labels[index]
        x = self.images[index].to(self.mean.dtype).div_(255.0)
        if augment != "none":
            x = augment_batch(x, augment, gen)
        x = x.sub_(self.mean).div_(self.std)  # in place: the same values as (x - mean) / std, one buffer
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, self.labels[index]


def num_batches(n: int, batch_size: int, drop_last: bool = False) -> int:
    """Batches per epoch over n samples: a trailing batch of one sample cannot train BatchNorm, so
    it is dropped (as are all incomplete batches with ``drop_last``)."""
    if drop_last or (n % batch_size == 1 and n > 1):
        return n // batch_size
    return -(-n // batch_size)  # ceil division


class EpochBatches:
    """One epoch of shuffled batches of ``indices`` for (seed, round, client, epoch).

    Re-iterable; ``set_epoch`` selects the epoch. Each epoch's permutation is derived from
    (seed, round, client, epoch), or, with ``generator``, drawn from that running generator
    (extra local phases reshuffle with the client's ``ctx.generator``).
    """

    def __init__(
        self,
        data: DeviceData,
        indices: torch.Tensor,
        batch_size: int,
        seed: int,
        round_idx: int,
        client: int,
        augment: str = "none",
        drop_last: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        self.data, self.indices, self.batch_size = data, indices, batch_size
        self.seed, self.round_idx, self.client = seed, round_idx, client
        self.augment, self.drop_last, self.generator = augment, drop_last, generator
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return num_batches(len(self.indices), self.batch_size, self.drop_last)

    def index_batches(self) -> Iterator[torch.Tensor]:
        """The epoch's batches as sample indices (into ``data``)."""
        n = len(self.indices)
        if self.generator is not None:
            perm = torch.randperm(n, generator=self.generator, device=self.generator.device)
        else:
            key = self.round_idx * 1000 + self.epoch
            perm = torch.randperm(n, generator=torch_generator(derive_seed(self.seed, key, self.client, SHUFFLE)))
        order = self.indices[perm.to(self.indices.device)]
        for b in range(len(self)):
            yield order[b * self.batch_size : (b + 1) * self.batch_size]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        aug_gen = None
        if self.augment != "none":
            key = self.round_idx * 1000 + self.epoch
            aug_gen = torch_generator(derive_seed(self.seed, key, self.client, AUGMENT), self.data.images.device)
        for idx in self.index_batches():
            yield self.data.to_float(idx, self.augment, aug_gen)
