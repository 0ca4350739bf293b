"""`make gpu-check`: what only a real GPU can show (issue 31), in a few minutes, pass/fail per item.

    python -m bench.perf.gpu_check            # on the CUDA device(s) at hand
    python -m bench.perf.gpu_check --device cpu   # the same checks on the CPU (what the test suite runs)

Checks 1-6, 12 and 13 run on sklearn's digits (offline) with the small CNN:
1. per-client round: FedRep (a per-client protocol) runs two rounds on the device (round 0 used to
   crash on CUDA: a CPU metrics table added into the CUDA round buffer);
2. float16 loss scaling: a 16-mixed FedAvg run records loss scaling on CUDA and ends with finite metrics;
3. strict float32: under gpu_math "strict" a float32 matmul matches float64 to float32 accuracy
   (TF32 would be ~1e-3 off); "fast" is reported, not judged (TF32 needs an Ampere+ GPU);
4. determinism: FedProto (class feature sums, prototypes) twice under "strict" gives identical numbers;
5. devices auto: one rank per visible GPU (up to the clients per round);
6. host syncs: one FedAvg round's local steps under ``torch.cuda.set_sync_debug_mode("warn")`` -
   reported (count of sync warnings), not judged.
Checks at the table's shape (ResNet-18 with BatchNorm, 128 px, batch 8; bench/perf/gpu_check_shape.py,
issue 42; `--size/--steps/--bf16-steps` shrink them, as the CPU dry run does by default):
7. conv and matmul math under each gpu_math mode against float64 (strict judged);
8. bitwise-equal weights for two identical trainings under strict and tf32;
9. GPU against CPU within a stated tolerance (strict judged, tf32 reported);
10. bf16-mixed against float32: finite weights, last losses within 5 %;
11. peak memory of one client's step (reported);
12. checkpoint and resume: a FedAvg run stopped after a checkpoint and resumed equals the one that went through;
13. `--jobs 2` on the machine's device(s) (two workers on one GPU): the same records and weights as one process.
The NCCL stall timeout needs two GPUs and a stalled rank: `fedbench run --devices 2 --timeout 0.2` with
a rank stopped by hand (README, "GPUs") shows it.

Exit status 0 when every judged item passed, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
import warnings
from collections.abc import Callable

import torch

from bench.assembly.config import RunConfig
from bench.core.numerics import apply_gpu_math
from bench.perf.gpu_check_shape import max_difference


def tiny_config(root: str, method: str, accelerator: str, **overrides) -> RunConfig:
    cfg = RunConfig()
    cfg.method.name, cfg.method.backbone, cfg.method.lr = method, "simple-cnn", 0.05
    cfg.data.name, cfg.data.cache_dir = "digits", f"{root}/cache"
    cfg.partition.num_clients, cfg.partition.args = 4, {"beta": 0.5, "min_size": 20}
    cfg.fed.rounds, cfg.fed.sample_ratio, cfg.fed.batch_size = 2, 1.0, 32
    cfg.accelerator, cfg.devices, cfg.progress = accelerator, 1, False
    cfg.output_dir, cfg.checkpoint_dir = f"{root}/runs", f"{root}/ckpt"
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def run(cfg: RunConfig) -> dict:
    from bench.assembly.experiment import make_fabric, run_experiment

    fabric = make_fabric(cfg)
    fabric.launch()
    return run_experiment(cfg, fabric)


def check_per_client_round(root: str, accelerator: str) -> tuple[bool, str]:
    record = run(tiny_config(root, "fedrep", accelerator, experiment="per_client"))
    acc = record["final"]["test/accuracy"]
    return math.isfinite(acc), f"FedRep, 2 rounds on {record['execution']['device']}: test accuracy {acc:.2f}"


def check_loss_scaling(root: str, accelerator: str) -> tuple[bool, str]:
    precision = "16-mixed" if accelerator == "cuda" else "bf16-mixed"  # the CPU has no float16 autocast
    record = run(tiny_config(root, "fedavg", accelerator, precision=precision, experiment="fp16"))
    ex, acc = record["execution"], record["final"]["test/accuracy"]
    expected = ex["device"].startswith("cuda")
    ok = ex["loss_scaling"] == expected and math.isfinite(acc)
    return ok, f"{precision} on {ex['device']}: loss scaling {ex['loss_scaling']} (expected {expected}), accuracy {acc:.2f}"


def check_strict_float32(device: torch.device) -> tuple[bool, str]:
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(512, 512, generator=gen, device="cpu") for _ in range(2))  # drawn on the CPU: same values anywhere
    exact = a.double() @ b.double()
    errors = {}
    for mode in ("strict", "fast"):
        apply_gpu_math(mode, device.type)
        errors[mode] = ((a.to(device) @ b.to(device)).double().cpu() - exact).abs().max().item() / exact.abs().max().item()
    apply_gpu_math("strict", device.type)
    return errors["strict"] < 1e-5, (f"relative matmul error: strict {errors['strict']:.1e} (float32: < 1e-5), "
                                     f"fast {errors['fast']:.1e} (TF32 on Ampere+: ~1e-3)")


def check_determinism(root: str, accelerator: str) -> tuple[bool, str]:
    runs = [run(tiny_config(f"{root}/{i}", "fedproto", accelerator, experiment="determinism")) for i in range(2)]
    curves = [[h["metrics"].get("test/accuracy") for h in r["history"] if h.get("metrics")] for r in runs]
    return curves[0] == curves[1], f"FedProto twice under strict: {curves[0]} vs {curves[1]}"


def outcome(cfg: RunConfig) -> tuple[dict, dict]:
    """A finished run's record and final state (``save_final_state``)."""
    from bench.assembly.records import record_path

    path = record_path(cfg.output_dir, cfg.experiment, cfg.run_name())
    return json.loads(path.read_text()), torch.load(path.with_suffix(".pt"))


class StopAfterCheckpoint(Exception):
    """Ends a run right after it checkpointed (item 12's stand-in for a killed job)."""


def check_resume(root: str, accelerator: str) -> tuple[bool, str]:
    """A FedAvg run stopped right after checkpointing round 0 of 3 and resumed ends with the same weights
    and metrics as the run that went through (its checkpoint saved and loaded on the device)."""
    from bench.engine.checkpoint import Checkpointer

    def config(folder: str, **extra) -> RunConfig:
        cfg = tiny_config(folder, "fedavg", accelerator, experiment="resume", checkpoint_every=1, **extra)
        cfg.fed.rounds, cfg.fed.keep_optimizer_state, cfg.save_final_state = 3, True, True
        return cfg

    full = run(config(f"{root}/full"))
    original = Checkpointer.save

    def save_then_stop(self, r, snapshot, clients):
        original(self, r, snapshot, clients)
        if r == 0:
            raise StopAfterCheckpoint

    Checkpointer.save = save_then_stop
    try:
        run(config(f"{root}/stopped"))
    except StopAfterCheckpoint:
        pass
    finally:
        Checkpointer.save = original
    resumed = run(config(f"{root}/stopped", resume=True))
    a, b = outcome(config(f"{root}/full"))[1], outcome(config(f"{root}/stopped"))[1]
    gap = max_difference(a, b)
    same = [h.get("metrics") for h in full["history"]] == [h.get("metrics") for h in resumed["history"]]
    began = (resumed.get("resumed") or {}).get("from_round")
    return began == 0 and gap == 0.0 and same and a.keys() == b.keys(), (
        f"stopped after round 0 of 3, resumed from round {began} on {resumed['execution']['device']}: weights "
        f"{gap:.1e} apart, metrics {'equal' if same else 'DIFFERENT'} (must resume from 0 and be equal)")


def check_jobs_share_the_device(root: str, accelerator: str) -> tuple[bool, str]:
    """Two FedAvg runs (seeds 0 and 1) as ``fedbench table --jobs 2`` runs them, both workers on this machine's
    device(s) (several per GPU when K exceeds the GPUs), give the records and final weights of the same runs
    done one after the other in this process."""
    from types import SimpleNamespace

    from bench.assembly.workers import cpu_cores
    from bench.scheduling.table_jobs import run_jobs

    def config(folder: str, seed: int) -> RunConfig:
        cfg = tiny_config(folder, "fedavg", accelerator, experiment="jobs", seed=seed, save_final_state=True)
        cfg.data.cache_dir = f"{root}/cache"
        return cfg

    run_jobs([SimpleNamespace(cfg=config(f"{root}/jobs", s)) for s in (0, 1)], 2, None, "gpu-check --jobs 2",
             lambda r: f"seed {r.cfg.seed}")
    alone, threads = [config(f"{root}/alone", s) for s in (0, 1)], torch.get_num_threads()
    torch.set_num_threads(max(1, cpu_cores() // 2))  # a worker's threads: CPU float sums depend on them
    try:
        for cfg in alone:
            run(cfg)
    finally:
        torch.set_num_threads(threads)
    gaps, devices, same = [], [], True
    for cfg in alone:
        (rec_a, state_a), (rec_j, state_j) = outcome(cfg), outcome(config(f"{root}/jobs", cfg.seed))
        gaps.append(max_difference(state_a, state_j))
        same &= [h.get("metrics") for h in rec_a["history"]] == [h.get("metrics") for h in rec_j["history"]]
        devices.append(rec_j["execution"]["device"])
    return max(gaps) == 0.0 and same, (f"2 jobs on {', '.join(devices)}: weights {max(gaps):.1e} apart from one process's, "
                                       f"metrics {'equal' if same else 'DIFFERENT'} (must be equal)")


def check_devices_auto(accelerator: str) -> tuple[bool, str]:
    from bench.assembly.workers import auto_layout, visible_gpus

    gpus = len(visible_gpus(accelerator))
    cfg = tiny_config("/tmp", "fedavg", accelerator)
    ranks, _, why = auto_layout(cfg, False, 8, can_launch=True)
    expected = max(1, min(gpus, 8)) if gpus else ranks
    return ranks == expected, f"{gpus} visible GPU(s): devices auto -> {why}"


def check_host_syncs(root: str, accelerator: str, device: torch.device) -> tuple[bool | None, str]:
    if device.type != "cuda":
        return None, "CPU: no host syncs to count"
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run(tiny_config(root, "fedavg", accelerator, experiment="syncs"))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    return None, f"one 2-round FedAvg run: {syncs} synchronizing calls (reported, not judged)"


def shape_checks(device: torch.device, args) -> list[tuple[str, Callable[[], tuple[bool | None, str]]]]:
    """Items 7-11 (bench/perf/gpu_check_shape.py) at the table's shape on a GPU, smaller on the CPU."""
    from bench.perf import gpu_check_shape as shape

    gpu = device.type == "cuda"
    size = args.size or (128 if gpu else 32)
    steps, bf16_steps = args.steps or (8 if gpu else 2), args.bf16_steps or (60 if gpu else 4)
    return [("7 math modes", lambda: shape.check_math_modes(device)),
            ("8 bitwise weights", lambda: shape.check_bitwise_weights(device, size, steps)),
            ("9 GPU against CPU", lambda: shape.check_gpu_against_cpu(device, size, steps)),
            ("10 bf16-mixed", lambda: shape.check_bf16(device, size, bf16_steps)),
            ("11 step memory", lambda: shape.check_step_memory(device, size))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="GPU checks of fedbench (issue 31): pass/fail per item.")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (default): the GPU checks; cpu: the same checks on the CPU (a dry run)")
    parser.add_argument("--size", type=int, default=None, help="image size of checks 7-11 (cuda 128, cpu 32)")
    parser.add_argument("--steps", type=int, default=None, help="steps of checks 8-9 (cuda 8, cpu 2)")
    parser.add_argument("--bf16-steps", type=int, default=None, help="steps of check 10 (cuda 60, cpu 4)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu-check: no CUDA device visible (torch.cuda.is_available() is False): nothing to check here. "
              "Run it on a GPU machine, or `python -m bench.perf.gpu_check --device cpu` for a dry run.")
        return 0
    device = torch.device(args.device)
    accelerator = "cuda" if args.device == "cuda" else "cpu"
    with tempfile.TemporaryDirectory(prefix="fedbench-gpu-check-") as root:
        checks: list[tuple[str, Callable[[], tuple[bool | None, str]]]] = [
            ("1 per-client round", lambda: check_per_client_round(f"{root}/1", accelerator)),
            ("2 float16 loss scaling", lambda: check_loss_scaling(f"{root}/2", accelerator)),
            ("3 strict float32", lambda: check_strict_float32(device)),
            ("4 determinism", lambda: check_determinism(f"{root}/4", accelerator)),
            ("5 devices auto", lambda: check_devices_auto(accelerator)),
            ("6 host syncs", lambda: check_host_syncs(f"{root}/6", accelerator, device)),
            *shape_checks(device, args),
            ("12 checkpoint and resume", lambda: check_resume(f"{root}/12", accelerator)),
            ("13 jobs sharing the device", lambda: check_jobs_share_the_device(f"{root}/13", accelerator)),
        ]
        failed = 0
        for name, check in checks:
            start = time.perf_counter()
            try:
                ok, detail = check()
            except Exception as err:  # noqa: BLE001 (a crash is this item's failure; the others still run)
                ok, detail = False, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            verdict = {True: "PASS", False: "FAIL", None: "INFO"}[ok]
            failed += ok is False
            print(f"{verdict}  {name}: {detail} ({time.perf_counter() - start:.0f} s)", flush=True)
    print(f"gpu-check on {device}: {'all judged items passed' if not failed else f'{failed} item(s) failed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
