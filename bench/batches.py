"""Mini-batches sliced from a uint8 tensor on the device, shuffled by an explicit generator."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from bench.seeding import AUGMENT, SHUFFLE, derive_seed, torch_generator
from datamodules.augment import augment_batch


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

    def to_float(self, index: torch.Tensor | slice, augment: str = "none", gen: torch.Generator | None = None):
        if self.images.dtype != torch.uint8:  # cached features
            return self.images[index].to(self.mean.dtype), self.labels[index]
        x = self.images[index].to(self.mean.dtype).div_(255.0)
        if augment != "none":
            x = augment_batch(x, augment, gen)
        return (x - self.mean) / self.std, self.labels[index]


class EpochBatches:
    """One epoch of shuffled batches of ``indices`` for (seed, round, client, epoch).

    Re-iterable; ``set_epoch`` selects the epoch so that the same object can feed a Lightning
    Trainer (Central) with exactly the batches a federated client would see.
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
    ) -> None:
        self.data, self.indices, self.batch_size = data, indices, batch_size
        self.seed, self.round_idx, self.client = seed, round_idx, client
        self.augment, self.drop_last = augment, drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        n = len(self.indices)
        if self.drop_last or (n % self.batch_size == 1 and n > 1):
            return n // self.batch_size  # a trailing batch of one sample cannot train BatchNorm: dropped
        return -(-n // self.batch_size)  # noqa: PLE0303 (ceil division of n >= 0: never negative)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        key = self.round_idx * 1000 + self.epoch
        perm = torch.randperm(len(self.indices), generator=torch_generator(derive_seed(self.seed, key, self.client, SHUFFLE)))
        order = self.indices[perm.to(self.indices.device)]
        aug_gen = None
        if self.augment != "none":
            aug_gen = torch_generator(derive_seed(self.seed, key, self.client, AUGMENT), self.data.images.device)
        for b in range(len(self)):
            idx = order[b * self.batch_size : (b + 1) * self.batch_size]
            yield self.data.to_float(idx, self.augment, aug_gen)
