"""Run records: one JSON per run (config, commit, partition, per-round metrics, best/final, timings)."""
from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from bench.core.errors import FedbenchError
from bench.core.paths import REPO_ROOT

# the distributions whose versions every run record and regression reference stores
RECORDED_PACKAGES = ("torch", "lightning", "timm", "transformers", "open_clip_torch", "torchmetrics")


def package_versions() -> dict[str, str | None]:
    """The installed versions of RECORDED_PACKAGES (None for one that is not installed)."""
    out: dict[str, str | None] = {}
    for name in RECORDED_PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], check=False, cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        commit = out.stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], check=False,
                               cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def summarise(history: list[dict], protocol: str) -> dict[str, Any]:
    """Best/final metrics. Global protocol: test metrics at the best-validation round (FedBM's rule)."""
    evaluated = [h for h in history if h.get("metrics")]
    if not evaluated:
        return {"final": {}, "best": {}, "best_round": None}
    final = evaluated[-1]["metrics"]
    if protocol == "global" and any("val/accuracy" in h["metrics"] for h in evaluated):
        best = max(evaluated, key=lambda h: (h["metrics"].get("val/accuracy", -1.0), -h["round"]))
        return {"final": final, "best": best["metrics"], "best_round": best["round"]}
    return {"final": final, "best": final, "best_round": evaluated[-1]["round"]}


def rank_idle(history: list[dict]) -> dict[str, Any]:
    """Per rank, the seconds of work before the rounds' all-reduces and of waiting at them (summed
    over rounds), and the share of the ranks' time lost waiting."""
    rounds = [h for h in history if h.get("rank_busy_seconds")]
    if not rounds:
        return {}
    busy = [sum(col) for col in zip(*(h["rank_busy_seconds"] for h in rounds))]
    idle = [sum(col) for col in zip(*(h["rank_idle_seconds"] for h in rounds))]
    total = sum(busy) + sum(idle)
    return {"busy_seconds": busy, "idle_seconds": idle, "idle_share": sum(idle) / total if total > 0 else 0.0}


def best_test_scores(record: dict) -> str:
    """The record's best test scores as one line: ``test/accuracy=91.20, test/f1=...``."""
    best = record.get("best", {})
    return ", ".join(f"{k}={v:.2f}" for k, v in best.items()
                     if k.startswith("test/") and isinstance(v, float) and k != "test/predicted_classes")


def record_path(output_dir: str, experiment: str, run_name: str) -> Path:
    return Path(output_dir) / experiment / f"{run_name}.json"


def run_record_path(cfg) -> Path:
    """A RunConfig's own record file, ``record_name`` (run name + result identity): where its record goes
    when the bare run name holds a record of another configuration. (``find_record`` finds either.)"""
    return record_path(cfg.output_dir, cfg.experiment, cfg.record_name())


def bare_record_path(cfg) -> Path:
    """``<run name>.json``: where a run's record goes when no record of another configuration is there."""
    return record_path(cfg.output_dir, cfg.experiment, cfg.run_name())


def same_result_config(rec: dict, cfg) -> bool:
    """Whether record ``rec`` was written under ``cfg``'s result config (options added since it was
    written count at their defaults)."""
    from bench.assembly.config import canonical, result_config, with_defaults

    recorded = with_defaults(rec.get("config", {}))
    return canonical(result_config(recorded)) == canonical(result_config(cfg.to_dict()))


def find_record(cfg) -> Path | None:
    """The record file of ``cfg``'s run, or None: its identity file, else the bare-name file when that
    holds a record of the same result config (a bare file of another configuration is never this run's;
    a broken one is, so that it is named and rerun)."""
    own = run_record_path(cfg)
    if own.exists():
        return own
    bare = bare_record_path(cfg)
    if bare.exists() and _holds(bare, cfg):
        return bare
    return None


def _holds(path: Path, cfg) -> bool:
    try:
        return same_result_config(load_record(path), cfg)
    except RecordError:
        return True


def write_run_record(cfg, record: dict, state: dict | None = None) -> tuple[Path, bool]:
    """Write a run's record (and its final ``state`` beside it, as .pt) where ``find_record`` will find it:
    the bare run name when it is free or holds this configuration, else the identity name. Records of
    different configurations never replace each other; claiming a free bare name is atomic, so two
    runs finishing at once cannot both take it. The record comes first: the state is written once the
    record's name is known, and a state that cannot be written (full disk) is a warning, not a lost
    record. Returns (path, whether a record of this configuration was replaced)."""
    from bench.core.atomic_io import claim_json, write_json

    path = find_record(cfg)
    replaced = path is not None
    if path is not None:
        write_json(path, record)
    elif claim_json(bare_record_path(cfg), record):
        path = bare_record_path(cfg)
    else:  # another configuration took the bare name first
        path = run_record_path(cfg)
        write_json(path, record)
    if state is not None:
        write_optional(path.with_suffix(".pt"), state, "the final state")
    return path, replaced


def write_optional(path: Path, state: dict, what: str) -> bool:
    """``torch.save`` an output the record does without (the final state); a failure is a warning."""
    import warnings

    from bench.core.atomic_io import atomic_torch_save
    from bench.core.errors import FedbenchWarning

    try:
        atomic_torch_save(state, path)
    except OSError as err:
        warnings.warn(f"{what} was not written to {path}: {err}. The run's record is complete.",
                      FedbenchWarning, stacklevel=3)
        return False
    return True


class RecordError(FedbenchError):
    """A run record that cannot be read back (truncated, not JSON, or not a JSON object)."""


def load_record(path: str | os.PathLike) -> dict:
    """The run record at ``path``; a broken one raises RecordError naming the file and what to do."""
    try:
        with open(path) as fh:
            rec = json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RecordError(f"Run record {path} is unreadable ({err}): it was cut short or edited. Delete it, or "
                          "rerun its table with --force (a table run without --render-only reruns it).") from err
    if not isinstance(rec, dict):
        raise RecordError(f"Run record {path} holds a JSON {type(rec).__name__}, not a record (a JSON object). "
                          "Delete it, or rerun its table with --force (a table run without --render-only reruns it).")
    return rec
