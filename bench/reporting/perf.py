"""`make bench`: throughput of fedbench's local training against a bare PyTorch loop (same samples,
same model, same device), and the frozen-feature cache speed-up of the CLIP methods."""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from bench.config import RunConfig
from bench.core.atomic_io import write_json
from bench.core.batches import DeviceData, EpochBatches
from bench.experiment import build_datamodule, build_module, make_fabric, to_device
from lightning_modules.base import run_epochs


def bare_loop(model, x: torch.Tensor, y: torch.Tensor, batch_size: int, lr: float, seed: int) -> float:
    """The reference: float tensors already normalised on the device, shuffled index slices."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    t = time.perf_counter()
    perm = torch.randperm(len(y), generator=gen).to(x.device)
    for b in range(0, len(y) - len(y) % batch_size, batch_size):
        idx = perm[b : b + batch_size]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    return time.perf_counter() - t


def fedbench_loop(fabric, module, data: DeviceData, batch_size: int, seed: int) -> float:
    """fedbench's client training: uint8 cache sliced per batch, derived shuffling, the local loop."""
    idx = torch.arange(len(data.labels), device=data.labels.device)
    batches = EpochBatches(data, idx, batch_size, seed, 0, 0, drop_last=True)
    optimizer = module.configure_optimizers()
    module.train()
    t = time.perf_counter()
    run_epochs(batches, 1, module.training_step, optimizer, fabric.autocast, where="in make bench")
    return time.perf_counter() - t


def throughput_ratio(backbone: str, samples: int, batch_size: int, repeats: int) -> dict:
    cfg = RunConfig()
    cfg.data.max_train_samples = samples
    cfg.method.backbone = backbone
    fabric = make_fabric(cfg)
    dm = build_datamodule(cfg)
    dm.setup()
    data = to_device(dm.train, dm, fabric.device)
    x, y = data.to_float(slice(None))
    n = len(y) - len(y) % batch_size
    module = build_module(cfg, dm).to(fabric.device)
    init = {k: v.clone() for k, v in module.state_dict().items()}
    ours, bare = [], []
    fedbench_loop(fabric, module, data, batch_size, 99)  # warm-up (allocator, kernels)
    for rep in range(repeats):  # interleaved, so machine noise hits both alike
        module.load_state_dict(init)
        ours.append(n / fedbench_loop(fabric, module, data, batch_size, rep))
        module.load_state_dict(init)
        bare.append(n / bare_loop(module, x, y, batch_size, cfg.method.lr, rep))
    ratios = [o / b for o, b in zip(ours, bare)]
    return {"backbone": backbone, "samples": n, "batch_size": batch_size, "device": str(fabric.device),
            "threads": torch.get_num_threads(), "fedbench_samples_per_s": ours, "bare_samples_per_s": bare,
            "ratios": ratios, "median_ratio": statistics.median(ratios)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fedbench bench", description=__doc__)
    parser.add_argument("--backbones", nargs="+", default=["resnet18", "simple-cnn"])
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-clip", action="store_true", help="skip the FACMIC feature-cache timing")
    parser.add_argument("--out", default="results/bench/perf.json")
    args = parser.parse_args(argv)
    report: dict = {"throughput": []}
    print("Local training throughput, fedbench vs a bare PyTorch loop (same samples, model, device):")
    for backbone in args.backbones:
        r = throughput_ratio(backbone, args.samples, args.batch_size, args.repeats)
        report["throughput"].append(r)
        print(f"  {backbone:12s} fedbench {statistics.median(r['fedbench_samples_per_s']):8.0f} samples/s   "
              f"bare {statistics.median(r['bare_samples_per_s']):8.0f} samples/s   "
              f"ratio {r['median_ratio']:.3f} (per repeat: {', '.join(f'{v:.3f}' for v in r['ratios'])})")
    if not args.skip_clip:
        try:
            from bench.reporting.perf_clip import facmic_cache_speedup
        except ImportError:
            print("  (FACMIC cache timing not available yet)")
        else:
            r = facmic_cache_speedup()
            report["facmic_cache"] = r
            print(f"FACMIC per-round time with the feature cache vs re-encoding: {r}")
    write_json(args.out, report)
    print(f"written: {args.out}")
    return 0
