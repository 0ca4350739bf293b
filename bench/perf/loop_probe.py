"""One local-training loop measured in its own process: samples/s, user and system CPU seconds, minor
and major page faults (getrusage of the whole process over the timed epochs only).

``make bench`` starts one process per variant, so that the allocator policy of one cannot leak into
another (bench/core/allocator.py sets it per process):

    python -m bench.perf.loop_probe --loop fedbench --backbone resnet18 --samples 2048
    FEDBENCH_ALLOCATOR=system python -m bench.perf.loop_probe --loop bare ...   # with glibc's churn

``--loop fedbench`` is a client's local training as fedbench runs it (uint8 images sliced per batch,
scaled, normalised, derived shuffling, ``run_epochs`` with the method's loss check); ``--loop bare``
is a plain PyTorch loop over float images normalised once beforehand. ``--loop paired`` runs both in this
one process, epoch about (same model, data and allocator; the order flips every repeat): the ratio of the
step code alone, without the spread between processes. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import sys
import time

from bench.core.allocator import allocator_status, apply_allocator_policy
from bench.core.compat import skip_unused_imports
from bench.core.import_gc import stack_import


def rusage() -> dict[str, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return {"user_s": r.ru_utime, "system_s": r.ru_stime, "minor_faults": r.ru_minflt, "major_faults": r.ru_majflt}


def synthetic_data(samples: int, size: int, num_classes: int = 10):
    """Random 1-channel uint8 images and labels (the allocation pattern does not depend on pixels)."""
    import torch

    from bench.core.batches import DeviceData

    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (samples, 1, size, size), dtype=torch.uint8, generator=gen)
    labels = torch.randint(0, num_classes, (samples,), generator=gen)
    return DeviceData(images, labels, torch.full((1, 1, 1, 1), 0.286), torch.full((1, 1, 1, 1), 0.353)), num_classes


def fashion_mnist(samples: int, cache_dir: str | None):
    from bench.assembly.config import RunConfig
    from bench.assembly.run_data import build_datamodule, to_device

    cfg = RunConfig()
    cfg.data.max_train_samples = samples
    if cache_dir:
        cfg.data.cache_dir = cache_dir
    dm = build_datamodule(cfg)
    dm.setup()
    return to_device(dm.train, dm, "cpu"), dm.num_classes


def bare_epoch(model, x, y, batch_size: int, seed: int) -> int:
    """The reference: float tensors already normalised, shuffled index slices, CE, SGD."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    model.train()
    n = len(y) - len(y) % batch_size
    for b in range(0, n, batch_size):
        idx = perm[b : b + batch_size]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    return n


def fedbench_epoch(module, data, batch_size: int, seed: int, autocast) -> int:
    """A client's local epoch as the orchestrator runs it (bench/core/batches.py, lightning_modules/base.py)."""
    import torch

    from bench.core.batches import EpochBatches
    from lightning_modules.base import run_epochs

    idx = torch.arange(len(data.labels))
    batches = EpochBatches(data, idx, batch_size, seed, 0, 0, drop_last=True)
    module.train()
    return run_epochs(batches, 1, module.training_step, module.configure_optimizers(), autocast,
                      where="in the loop probe")


def measure(args: argparse.Namespace) -> dict:
    with stack_import():  # as in every fedbench process (bench/core/import_gc.py), for both loops alike
        import torch

        from lightning_modules.base import FederatedModule

    torch.set_num_threads(args.threads)
    torch.backends.mkldnn.enabled = not args.no_onednn
    device = probe_device(args.device)
    data, num_classes = (synthetic_data(args.samples, args.image_size) if args.data == "synthetic"
                         else fashion_mnist(args.samples, args.cache_dir))
    data = dataclasses.replace(data, images=data.images.to(device), labels=data.labels.to(device),
                               mean=data.mean.to(device), std=data.std.to(device))
    torch.manual_seed(0)
    module = FederatedModule(num_classes=num_classes, in_channels=data.images.shape[1], backbone=args.backbone)
    module.to(device)
    if args.loop == "paired":  # bare first: its check of the speed options comes before any is applied
        return paired(args, device, {loop: loop_epoch(args, loop, device, module, data) for loop in ("bare", "fedbench")})
    epoch = loop_epoch(args, args.loop, device, module, data)
    epoch(99)  # warm-up: kernels chosen, allocator caches filled
    before, rates, steps, epoch_faults = rusage(), [], 0, []
    for rep in range(args.repeats):
        start = rusage()["minor_faults"]
        n, rate = timed_epoch(epoch, rep, device)
        rates.append(rate)
        epoch_faults.append((rusage()["minor_faults"] - start) / max(1, n // args.batch_size))
        steps += n // args.batch_size
    after = rusage()
    used = {k: after[k] - before[k] for k in before}
    return {"loop": args.loop, "device": device, "backbone": args.backbone, "data": args.data, "threads": args.threads,
            "channels_last": args.channels_last, "compile": args.compile, "precision": args.precision,
            "batch_size": args.batch_size, "steps": steps, "samples_per_s": rates,
            "median_samples_per_s": statistics.median(rates), **used,
            "minor_faults_per_step": used["minor_faults"] / steps,
            # per epoch: a loop that churns faults in every epoch; another process's burst lands in one
            "minor_faults_per_step_by_epoch": epoch_faults,
            "system_over_user": used["system_s"] / max(used["user_s"], 1e-9), "allocator": allocator_status()}


def timed_epoch(epoch, seed: int, device: str) -> tuple[int, float]:
    """One epoch (``epoch(seed)``): samples trained and samples/s, its kernels run (not only queued on a GPU)."""
    import torch

    t = time.perf_counter()
    n = epoch(seed)
    if device == "cuda":
        torch.cuda.synchronize()
    return n, n / (time.perf_counter() - t)


def loop_epoch(args: argparse.Namespace, loop: str, device: str, module, data):
    """seed -> samples trained in one epoch of ``loop`` ("bare" or "fedbench") on ``module``."""
    if loop == "bare":
        if args.channels_last or args.compile or args.precision != "32-true":
            raise SystemExit("the bare loop is the eager fp32 reference: the speed options apply to --loop fedbench")
        x, y = data.to_float(slice(None))
        return lambda seed: bare_epoch(module, x, y, args.batch_size, seed)
    from lightning.fabric import Fabric

    from bench.assembly.speed_options import apply_speed_options, with_channels_last

    autocast = Fabric(accelerator=device, devices=1, precision=args.precision).autocast
    apply_speed_options(module, args.channels_last, args.compile)
    data = with_channels_last(data, args.channels_last)
    return lambda seed: fedbench_epoch(module, data, args.batch_size, seed, autocast)


def paired(args: argparse.Namespace, device: str, epochs: dict) -> dict:
    """The ``epochs`` of fedbench's and the bare loop (loop_epoch, on one model) about, in this process: repeat r
    runs fedbench then bare when r is even, bare then fedbench when odd (a drift of the machine hits both alike);
    one ratio of samples/s per repeat."""
    for epoch in epochs.values():
        epoch(99)  # warm-up of both
    rates: dict[str, list[float]] = {"fedbench": [], "bare": []}
    for rep in range(args.repeats):
        for loop in ("fedbench", "bare") if rep % 2 == 0 else ("bare", "fedbench"):
            rates[loop].append(timed_epoch(epochs[loop], rep, device)[1])
    ratios = [f / b for f, b in zip(rates["fedbench"], rates["bare"])]
    return {"loop": "paired", "device": device, "backbone": args.backbone, "data": args.data, "threads": args.threads,
            "batch_size": args.batch_size, "samples_per_s": rates["fedbench"], "bare_samples_per_s": rates["bare"],
            "ratios": ratios, "median_ratio": statistics.median(ratios), "allocator": allocator_status()}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.perf.loop_probe", description=__doc__)
    p.add_argument("--loop", choices=["fedbench", "bare", "paired"], required=True)
    p.add_argument("--backbone", default="resnet18")
    p.add_argument("--data", choices=["fashion-mnist", "synthetic"], default="fashion-mnist")
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--image-size", type=int, default=28, help="synthetic data only")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--channels-last", action="store_true", help="fedbench loop: NHWC weights and batches")
    p.add_argument("--compile", action="store_true", help="fedbench loop: torch.compile the backbone")
    p.add_argument("--precision", default="32-true", help="fedbench loop: Fabric precision, e.g. bf16-mixed")
    p.add_argument("--no-onednn", action="store_true", help="torch.backends.mkldnn.enabled = False")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where the loops run (auto: a CUDA GPU when there is one, else the CPU)")
    return p


def probe_device(choice: str) -> str:
    """The device the probe measures: ``choice``, or for "auto" CUDA when available, else the CPU."""
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible here")
    return choice


def main(argv: list[str] | None = None) -> int:
    skip_unused_imports()  # as every fedbench process (bench/cli.py main): imports only, no loop changes
    apply_allocator_policy()  # first: as in every fedbench process (FEDBENCH_ALLOCATOR=system opts out)
    print(json.dumps(measure(parser().parse_args(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
