"""Issue 42, item 4: on non-degenerate data bf16-mixed trains as float32 does, within float32's own seed spread.

FedAvg, ResNet-18 at 16 px (layer4 at 1x1, the shape where bf16 was reported to diverge), 2 iid clients,
3 rounds, on Kvasir-layout images of per-image noise tinted by class (bench/reporting/gpu_bench.py's
generator: no two images alike). Measured (this 2-core CPU, channels_last as the speed option that makes
CPU bf16 affordable: 0.6 s a step against 4 s without): the mean training loss over the 3 rounds was
1.6474 / 1.6068 / 1.6853 for float32 seeds 0 / 1 / 2 (range 0.0785) and 1.6298 / 1.5681 for bf16-mixed
seeds 0 / 1: bf16 is 0.018 and 0.039 from float32 at the same seed, within the seed range; no tensor went
non-finite in any run.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.cli import main
from bench.records import load_record, record_path
from bench.reporting.gpu_bench import write_kvasir

pytestmark = pytest.mark.slow


def mean_train_loss(tmp_path: Path, root: Path, precision: str, seed: int) -> float:
    out = tmp_path / f"{precision}-{seed}"
    argv = ["run", "--data.name", "kvasir", "--data.root", str(root), "--data.image_size", "16",
            "--data.cache_dir", str(tmp_path / "cache"), "--method.backbone", "resnet18",
            "--partition.scheme", "iid", "--partition.num_clients", "2", "--partition.min_size", "2",
            "--fed.rounds", "3", "--fed.batch_size", "8", "--fed.lr_decay", "0.99", "--fed.test_rounds", "all",
            "--fed.keep_optimizer_state", "true",
            "--channels_last", "true", "--precision", precision, "--seed", str(seed), "--accelerator", "cpu",
            "--threads", "1", "--progress", "false", "--output_dir", str(out / "runs"),
            "--checkpoint_dir", str(out / "ckpt")]
    assert main(argv) == 0  # exit 0: every client model and every round's global model stayed finite
    record = load_record(record_path(str(out / "runs"), "default", "fedavg_kvasir_iid_c2_s" + str(seed)))
    assert record["execution"]["precision"] == precision
    losses = [h["train_loss"] for h in record["history"]]
    assert len(losses) == 3
    return sum(losses) / len(losses)


def test_bf16_mixed_ends_within_float32_seed_spread_on_non_degenerate_data(tmp_path):
    root = write_kvasir(tmp_path / "data", per_class=12)
    fp32 = [mean_train_loss(tmp_path, root, "32-true", seed) for seed in (0, 1, 2)]
    bf16 = mean_train_loss(tmp_path, root, "bf16-mixed", 0)
    spread = max(fp32) - min(fp32)
    assert spread > 0.02  # the yardstick is real (measured 0.0785)
    assert abs(bf16 - fp32[0]) <= spread, (bf16, fp32)  # measured 0.018
    assert bf16 != fp32[0]  # bf16 autocast really ran: its numbers are not float32's
