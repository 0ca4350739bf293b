"""FACMIC's per-round local training time with the frozen-feature cache vs re-encoding every round.

Both arms run the same FACMIC client epoch (feature attention, contrastive + LMMD, Adam) over the
same images with a ViT-B-16-sized CLIP image encoder with fixed random weights ("vit-b-16-random").
The cached arm encodes the client's images and the target set once (reported as ``encode_once_s``,
not part of a round), then every round only slices features. The re-encoding arm is what a
head-only method without the cache does (and what FACMIC's public code does): every step encodes
the source batch and the drawn target batch with the frozen encoder, then trains the head.
"""
from __future__ import annotations

import statistics
import tempfile
import time

import torch

from bench.core.batches import DeviceData, EpochBatches
from bench.core.seeding import METHOD, derive_seed, torch_generator
from lightning_modules.base import ClientContext
from lightning_modules.components.clip_models import preprocess_uint8
from lightning_modules.facmic import Facmic

CLASSES = ["glioma tumor", "meningioma tumor", "no tumor", "pituitary tumor"]


class _Uint8Images(DeviceData):
    """Batches of raw uint8 images, for an arm that runs the encoder itself."""

    def to_float(self, index, augment: str = "none", gen: torch.Generator | None = None):
        return self.images[index], self.labels[index]


def _client_epoch(module: Facmic, data: DeviceData, batch_size: int, round_idx: int, encode=None) -> float:
    """One FACMIC local epoch over ``data``; ``encode`` (uint8 -> features) re-encodes every batch."""
    idx = torch.arange(len(data.labels))
    ctx = ClientContext(client_id=0, round_idx=round_idx, seed=0, data=data, indices=idx, num_classes=len(CLASSES),
                        global_state={}, generator=torch_generator(derive_seed(0, round_idx, 0, METHOD)))
    module.train()
    objective = module.client_objective(ctx)
    optimizer = module.configure_optimizers()
    target_images = module.target_images if encode is not None else None
    t = time.perf_counter()
    for x, y in EpochBatches(data, idx, batch_size, 0, round_idx, 0, drop_last=True):
        if encode is not None:  # no cache: the frozen encoder runs on the source and the target batch
            x = encode(x)
            pick = torch.randperm(len(target_images), generator=ctx.generator)[: len(x)]
            module.target_features = encode(target_images[pick])
        optimizer.zero_grad(set_to_none=True)
        objective((x, y)).backward()
        optimizer.step()
    return time.perf_counter() - t


def facmic_cache_speedup(image_size: int = 224, n_images: int = 16, rounds: int = 2, batch_size: int = 8,
                         clip: str = "vit-b-16-random", seed: int = 0, cached_rounds: int = 10) -> dict:
    """Median per-round time of FACMIC local training, cached features vs re-encoding (same data).

    The re-encoding arm runs ``rounds`` rounds (each encodes 2 x n_images images); the cached arm is
    cheap, so it runs ``max(rounds, cached_rounds)`` rounds to make its median robust to noise.
    """
    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n_images, 3, image_size, image_size), dtype=torch.uint8, generator=gen)
    labels = torch.arange(n_images) % len(CLASSES)
    target = torch.randint(0, 256, (n_images, 3, image_size, image_size), dtype=torch.uint8, generator=gen)
    mean, std = torch.zeros(1, 3, 1, 1), torch.ones(1, 3, 1, 1)
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as text_cache:
        module = Facmic(num_classes=len(CLASSES), in_channels=3, clip=clip, class_names=CLASSES,
                        dataset_name="brain-tumor", optimizer="adam", lr=5e-5, weight_decay=0.02,
                        feature_cache_dir=text_cache)
    enc = module.frozen_clip

    def encode(uint8: torch.Tensor) -> torch.Tensor:
        return enc.encode_images(preprocess_uint8(uint8, enc.image_size, enc.mean, enc.std))

    t = time.perf_counter()
    feats = torch.cat([encode(images[i : i + batch_size]) for i in range(0, n_images, batch_size)])
    target_feats = torch.cat([encode(target[i : i + batch_size]) for i in range(0, n_images, batch_size)])
    encode_once = time.perf_counter() - t
    init = {k: v.clone() for k, v in module.state_dict().items()}

    cached = DeviceData(feats, labels, mean, std)
    module.target_features = target_feats
    cached_times = [_client_epoch(module, cached, batch_size, r) for r in range(max(rounds, cached_rounds))]

    module.load_state_dict(init)
    raw = _Uint8Images(images, labels, mean, std)
    module.target_images = target
    calls = enc.image_encoder_calls
    reencode_times = [_client_epoch(module, raw, batch_size, r, encode=encode) for r in range(rounds)]
    cached_s, reencode_s = statistics.median(cached_times), statistics.median(reencode_times)
    return {"clip": clip, "image_size": image_size, "n_images": n_images, "rounds": rounds, "batch_size": batch_size,
            "cached_rounds": max(rounds, cached_rounds),
            "threads": torch.get_num_threads(), "encode_once_s": encode_once, "cached_round_s": cached_s,
            "reencode_round_s": reencode_s, "encoder_calls_per_reencode_round": (enc.image_encoder_calls - calls) / rounds,
            "speedup": reencode_s / cached_s}


if __name__ == "__main__":
    print(facmic_cache_speedup())
