"""Every option is checked before any work: one clear error (exit 2, no traceback, no file written)
instead of a silent substitution or a raw traceback (issue 14, item 6); non-finite and collapsed
models are caught for every optimizer."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import digits_run_argv
from PIL import Image

from bench.assembly.records import load_record, record_path
from bench.cli import main


def written_files(tmp_path: Path) -> list[str]:
    """Files a run left behind, outside the dataset cache and the fixtures (data/, a_file)."""
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
                  if p.is_file() and p.relative_to(tmp_path).parts[0] not in ("cache", "data", "a_file"))


def run_cli(tmp_path: Path, extra: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(digits_run_argv(tmp_path) + extra)
    except SystemExit as exc:  # jsonargparse rejects unknown options and values of the wrong type
        code = exc.code
    return code, capsys.readouterr().err


def one_class_folder(root: Path) -> Path:
    for split, n in (("train", 60), ("test", 20)):
        (root / split / "only").mkdir(parents=True)
        for i in range(n):
            Image.fromarray(np.full((8, 8, 3), i, dtype=np.uint8)).save(root / split / "only" / f"{i}.png")
    return root


CASES = [
    (["--data.image_size", "0"], "data.image_size must be >= 8 (or null for the dataset's default size), got 0."),
    (["--data.image_size", "-4"], "data.image_size must be >= 8 (or null for the dataset's default size), got -4."),
    (["--data.max_train_samples", "0"], "data.max_train_samples must be >= 1 (or null for no cap), got 0."),
    (["--data.max_train_samples", "-5"], "data.max_train_samples must be >= 1 (or null for no cap), got -5."),
    (["--data.max_test_samples", "0"], "data.max_test_samples must be >= 1 (or null for no cap), got 0."),
    (["--data.val_fraction", "0"], ("data.val_fraction 0 leaves no validation split, which the 'global' protocol "
                                    "of 'fedavg' uses")),
    (["--data.val_fraction", "1"], ("data.val_fraction must be in [0, 1) (0: no validation split, per-client "
                                    "protocol only), got 1.0.")),
    (["--data.client_split_file", "split.npy"], ("data.client_split_file is a published client split, which 'digits' "
                                                 "does not read (only rsna-ich); leave it unset.")),
    (["--fed.client_test", "site", "--fed.protocol", "per_client"], ("fed.client_test site takes each client's "
                                                                     "test split from its site, which needs the "
                                                                     "natural partition")),
    (["--fed.client_test", "site", "--partition.scheme", "natural"], ("fed.client_test site gives each client its "
                                                                      "own test split, which only the per-client "
                                                                      "protocol uses ('fedavg' is scored 'global')")),
    (["--fed.lr_decay", "-1"], "fed.lr_decay must be in (0, 1] (the lr is multiplied by it every round), got -1.0."),
    (["--fed.lr_gamma", "0"], "fed.lr_gamma must be in (0, 1], got 0.0."),
    (["--method.lr", "-0.1"], "method.lr must be a finite number > 0, got -0.1."),
    (["--method.lr", "nan"], "--method.lr: expected float, got 'nan'"),
    (["--method.momentum", "1.5"], "method.momentum must be in [0, 1), got 1.5."),
    (["--threads", "-2"], "threads must be >= 1 (or null for Lightning's choice), got -2."),
    (["--devices", "0"], "devices must be >= 1, got 0."),
    (["--timeout", "0"], "timeout must be a number of minutes > 0, got 0.0."),
    (["--seed", "-1"], "seed must be >= 0, got -1."),
    (["--precision", "17-weird"], ("--precision: expected one of '32-true', '64-true', '16-mixed', 'bf16-mixed', "
                                 "'16-true', 'bf16-true', got '17-weird'")),
    (["--precision", "16-true", "--accelerator", "cpu"], ("precision '16-true' is not supported; choose "
                                                         "one of ['32-true', '64-true', 'bf16-mixed', '16-mixed']")),
    (["--precision", "16-mixed", "--accelerator", "cpu"], "--precision 16-mixed needs a CUDA GPU"),
    (["--accelerator", "gpu"], "--accelerator gpu was requested but this machine has no GPU available"),
    (["--accelerator", "cuda"], "--accelerator cuda was requested but this machine has no CUDA available"),
    (["--method.name", "fedprox", "--method.args", '{mu: "abc"}'], ("method.args.mu of 'fedprox' must be float, "
                                                                   "got 'abc' (str).")),
    (["--method.name", "fedrep", "--method.args", "{head_epochs: 2.5}"], ("method.args.head_epochs of 'fedrep' "
                                                                         "must be int, got 2.5 (float).")),
    (["--method.name", "clip-fc", "--method.args", "{init: texts}"], ("method.args.init of 'clip-fc' must be one "
                                                                     "of ['text', 'random'], got 'texts' (str).")),
    (["--method.args", "{lr: 0.1}"], ("method.args sets ['lr']: these come from the data or the method's own "
                                     "options (e.g. --method.lr)")),
    (["--output_dir", "{tmp}/a_file/runs"], ("--output_dir '{tmp}/a_file/runs' cannot be created: '{tmp}/a_file' "
                                            "is a file, not a folder.")),
    (["--checkpoint_every", "1", "--checkpoint_dir", "{tmp}/a_file/ckpt"], ("--checkpoint_dir '{tmp}/a_file/ckpt' "
                                                                           "cannot be created")),
    (["--fed.round", "3"], "unrecognized arguments: --fed.round 3"),
    (["--resume", "forc"], "Given value: forc"),
    (["--data.name", "class-folder", "--data.root", "{tmp}/data", "--partition.args.min_size", "2"],
     ("Dataset 'class-folder' under '{tmp}/data' gives 1 class(es) to train on (['only']; 1 declared): "
     "classification needs at least two.")),
    (["--method.optimizer", "adam", "--method.lr", "1e8"],
     "The model became NaN/inf after local training in round 0, client 0 (backbone."),  # BatchNorm statistics
]
IDS = ["image-size-0", "image-size-negative", "train-cap-0", "train-cap-negative", "test-cap-0", "val-fraction-0",
       "val-fraction-1", "split-file-unsupported", "client-test-site-not-natural", "client-test-site-global",
       "lr-decay-negative", "lr-gamma-0", "lr-negative", "lr-nan", "momentum", "threads-negative", "devices-0",
       "timeout-0", "seed-negative", "precision-unknown", "precision-unsupported", "precision-fp16-on-cpu", "accelerator-gpu-missing",
       "accelerator-cuda-missing", "method-arg-str-for-float", "method-arg-float-for-int", "method-arg-literal",
       "method-arg-reserved", "output-dir-unwritable", "checkpoint-dir-unwritable", "abbreviated-option",
       "resume-value", "single-class-dataset", "adam-nonfinite-state"]


@pytest.mark.parametrize(("extra", "message"), CASES, ids=IDS)
def test_bad_option_is_one_clear_error_before_any_work(tmp_path, capsys, monkeypatch, extra, message):
    from lightning.fabric.accelerators import CUDAAccelerator, MPSAccelerator

    # the same outcome on a GPU box: this machine has no GPU, as far as the check can tell
    monkeypatch.setattr(CUDAAccelerator, "is_available", staticmethod(lambda: False))
    monkeypatch.setattr(MPSAccelerator, "is_available", staticmethod(lambda: False))
    (tmp_path / "a_file").write_text("a file where a folder should be")
    if "class-folder" in extra:
        one_class_folder(tmp_path / "data")
    tmp = str(tmp_path)
    code, err = run_cli(tmp_path, [e.replace("{tmp}", tmp) for e in extra], capsys)
    assert code == 2, err
    assert message.replace("{tmp}", tmp) in err
    assert "Traceback" not in err
    assert written_files(tmp_path) == []


def test_adam_at_a_huge_lr_warns_that_the_model_collapsed(tmp_path, capsys):
    """Issue item 6: Adam at lr 1e6 ended at chance with rc 0 and nothing said. The loss and the
    weights stay finite, but the global model predicts one class: the record and stderr say so."""
    code, err = run_cli(tmp_path, ["--method.optimizer", "adam", "--method.lr", "1e6", "--accelerator", "cpu"],
                        capsys)
    assert code == 0, err
    record = load_record(record_path(str(tmp_path / "runs"), "default", "fedavg_digits_dir0.5_c4_s0"))
    assert record["best"]["test/predicted_classes"] == 1.0
    assert len(record["warnings"]) == 1 and "predicts a single class for every test image" in record["warnings"][0]
    assert "fedbench: warning: fedavg_digits_dir0.5_c4_s0: the global model predicts a single class" in err


def test_healthy_run_has_no_warning(tiny_cfg):
    from conftest import run_in_process

    record, _ = run_in_process(tiny_cfg(**{"fed.rounds": 2}))
    assert record["warnings"] == [] and record["best"]["test/predicted_classes"] > 1
