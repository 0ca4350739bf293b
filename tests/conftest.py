"""Shared test setup: offline hubs, small thread counts, and helpers to run experiments."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def tiny_cfg(tmp_path):
    """A RunConfig for fast runs on sklearn digits with the small CNN (it has BatchNorm, so buffer
    aggregation is exercised), writing under tmp_path."""
    from bench.config import RunConfig

    def make(**overrides) -> RunConfig:
        cfg = RunConfig()
        cfg.data.name = "digits"
        cfg.data.cache_dir = str(tmp_path / "cache")
        cfg.partition.num_clients = 6
        cfg.partition.beta = 0.5
        cfg.partition.min_size = 20
        cfg.fed.rounds = 3
        cfg.fed.sample_ratio = 0.5
        cfg.fed.batch_size = 32
        cfg.method.backbone = "simple-cnn"
        cfg.method.lr = 0.05
        cfg.output_dir = str(tmp_path / "runs")
        cfg.checkpoint_dir = str(tmp_path / "ckpt")
        cfg.accelerator = "cpu"
        cfg.threads = 1
        cfg.progress = False
        cfg.save_final_state = True
        for key, value in overrides.items():
            obj = cfg
            *path, last = key.split(".")
            for p in path:
                obj = getattr(obj, p)
            setattr(obj, last, value)
        return cfg

    return make


@pytest.fixture
def captured(monkeypatch):
    """Run experiments in process and keep the Federation (client states, module, history) and the
    module's initial state."""
    from bench.federation import Federation

    box: dict = {}
    original = Federation.run

    def run(self):
        box["fed"] = self
        box["initial_state"] = {k: v.detach().clone() for k, v in self.module.state_dict().items()}
        return original(self)

    monkeypatch.setattr(Federation, "run", run)
    return box


def run_in_process(cfg):
    """Run one experiment on a single in-process Fabric rank; return (record, final state)."""
    from bench.experiment import make_fabric, run_experiment

    fabric = make_fabric(cfg)
    fabric.launch()
    record = run_experiment(cfg, fabric)
    return record, load_final_state(cfg)


def load_final_state(cfg):
    from bench.records import record_path

    return torch.load(record_path(cfg.output_dir, cfg.experiment, cfg.run_name()).with_suffix(".pt"))


def cli_args(cfg) -> list[str]:
    """The `fedbench run` flags that reproduce cfg."""
    import dataclasses
    import json

    from bench.config import OPTION_GROUPS, TOP_LEVEL_KEYS

    args = []
    for group in OPTION_GROUPS:
        for key, value in dataclasses.asdict(getattr(cfg, group)).items():
            if value is None:
                continue
            args += [f"--{group}.{key}", json.dumps(value) if isinstance(value, (dict, list, bool)) else str(value)]
    for key in TOP_LEVEL_KEYS:
        value = getattr(cfg, key)
        if value is not None:
            args += [f"--{key}", json.dumps(value) if isinstance(value, bool) else str(value)]
    return args


def digits_run_argv(tmp_path: Path) -> list[str]:
    """`fedbench run` argv for a 2-round digits run on 4 clients, everything written under tmp_path
    (the bad-input tests add the option under test)."""
    return ["run", "--data.name", "digits", "--data.cache_dir", str(tmp_path / "cache"),
            "--method.backbone", "simple-cnn", "--fed.rounds", "2", "--partition.num_clients", "4",
            "--output_dir", str(tmp_path / "runs"), "--checkpoint_dir", str(tmp_path / "ckpt"),
            "--threads", "1", "--progress", "false"]


def run_subprocess(cfg, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `fedbench run` in a fresh process (needed for --devices 2: Fabric relaunches the script)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "bench.cli", "run", *cli_args(cfg)], check=False, cwd=REPO,
                          env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"fedbench run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def max_state_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) if a[k].numel() else 0.0 for k in a)


class Killed(Exception):
    """Raised by a patched checkpointer to simulate a run killed after a checkpoint."""


def kill_after(tiny_cfg, monkeypatch, round_idx: int, **cfg) -> None:
    """Run ``tiny_cfg(**cfg)`` in this process, killed (``Killed``) right after it checkpoints ``round_idx``."""
    from bench.checkpoint import Checkpointer

    original = Checkpointer.save

    def save_then_die(self, r, snapshot, clients):
        original(self, r, snapshot, clients)
        if r == round_idx:
            raise Killed

    monkeypatch.setattr(Checkpointer, "save", save_then_die)
    with pytest.raises(Killed):
        run_in_process(tiny_cfg(**cfg))
    monkeypatch.setattr(Checkpointer, "save", original)


def kill_and_resume(tiny_cfg, monkeypatch, base: dict, kill_after_round: int = 1):
    """Run ``base`` uninterrupted, then killed right after checkpointing round ``kill_after_round``
    and resumed; assert both end with identical state and history. Returns (resumed record, cfg)."""
    from bench.checkpoint import Checkpointer

    full_rec, full_state = run_in_process(tiny_cfg(**base, experiment="full"))
    kill_after(tiny_cfg, monkeypatch, kill_after_round, **base, experiment="killed")
    cfg = tiny_cfg(**base, experiment="killed", resume=True)
    assert Checkpointer(cfg, None).latest().name == f"round_{kill_after_round:05d}"
    resumed_rec, resumed_state = run_in_process(cfg)
    assert max_state_diff(full_state, resumed_state) == 0.0
    assert [h["metrics"] for h in resumed_rec["history"]] == [h["metrics"] for h in full_rec["history"]]
    return resumed_rec, cfg


# Test files of the end-to-end kind: each took >= 6 s (setup + calls) in a full `make test` with its
# --durations=0 report (measured 2026-11-25, 2 cores, 843 tests). `make test-fast` leaves them out:
# the rest (unit tests of the core, methods on tiny tensors, rendering) is the fast inner loop. A new
# test file is fast until it is listed here.
SLOW_FILES = {
    "test_all_methods_rank_invariance.py",
    "test_allocator.py",
    "test_bad_files.py",
    "test_baselines_a.py",
    "test_baselines_b.py",
    "test_bench.py",
    "test_checkpoint_identity.py",
    "test_clip_finetune.py",
    "test_clip_methods.py",
    "test_code_version.py",
    "test_collective_timeout.py",
    "test_coverage.py",
    "test_data_home.py",
    "test_errors_once.py",
    "test_fedcb_fedbm.py",
    "test_fednpr.py",
    "test_femnist.py",
    "test_full_disk.py",
    "test_gpu_paths.py",
    "test_ich_split_file.py",
    "test_missing_data.py",
    "test_multi_node.py",
    "test_npr_compositions.py",
    "test_precision.py",
    "test_process_lifetime.py",
    "test_quiet_progress.py",
    "test_rank_balance.py",
    "test_rank_invariance.py",
    "test_rank_launch.py",
    "test_readme_quickstart.py",
    "test_record_identity.py",
    "test_regression.py",
    "test_resume_safety.py",
    "test_setup_facets.py",
    "test_smoke_tables.py",
    "test_speed_options.py",
    "test_table_jobs.py",
    "test_table_output.py",
    "test_table_shard.py",
    "test_table_uncertainty.py",
    "test_thread_layout.py",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)


DOC_PAGES = ("README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")))


def doc_section(heading: str) -> str:
    """The text under ``## <heading>`` in the README or the docs/ page that has it, to the next ``## ``."""
    for page in DOC_PAGES:
        text = (REPO / page).read_text()
        if f"\n## {heading}\n" in text:
            return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    raise AssertionError(f"no page of the README or docs/ has a section '## {heading}'")


def readme_module(heading: str, tmp_path: Path, name: str):
    """The first ```python block under ``## <heading>`` (README or docs/), saved as ``<name>.py`` and imported
    (what a reader who copies it into a file of their own gets)."""
    import importlib.util
    import re

    section = doc_section(heading)
    path = tmp_path / f"{name}.py"
    path.write_text(re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
