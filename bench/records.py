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


def record_path(output_dir: str, experiment: str, run_name: str) -> Path:
    return Path(output_dir) / experiment / f"{run_name}.json"


def run_record_path(cfg) -> Path:
    """Where a RunConfig's record lives: its ``record_name`` (run name + result identity), so records of
    configurations that differ in any result option never collide."""
    return record_path(cfg.output_dir, cfg.experiment, cfg.record_name())


def latest_alias(cfg) -> Path:
    """``<run name>.json``: a link to the latest record written under that run name (whatever its budget),
    kept for people and scripts that look a run up by its readable name. Tables never read it."""
    return record_path(cfg.output_dir, cfg.experiment, cfg.run_name())


def point_latest_alias(path: Path, alias: Path, with_state: bool) -> None:
    """After writing the record ``path``: ``alias`` (and its .pt when the final state was saved) now
    links to it. Regular files at the alias (a record of a fedbench that named records by run name
    alone) are first moved to ``<run name>_<their identity>``, never overwritten."""
    legacy = [f for f in (alias, alias.with_suffix(".pt")) if f.exists() and not f.is_symlink()]
    if legacy:
        identity = legacy_identity(alias)
        for f in legacy:
            os.replace(f, f.with_name(f"{f.stem}_{identity}{f.suffix}"))
    link_latest(path, alias)
    state = alias.with_suffix(".pt")
    if with_state:
        link_latest(path.with_suffix(".pt"), state)
    elif state.is_symlink():
        state.unlink()


def legacy_identity(record: Path) -> str:
    """The result identity of the config stored in ``record`` ("legacy" when it cannot be read back)."""
    from bench.config import from_dict

    try:
        return from_dict(load_record(record)["config"]).result_identity()
    except Exception:  # noqa: BLE001 (absent, unreadable or foreign: keep it under a plain tag)
        return "legacy"


def link_latest(target: Path, alias: Path) -> None:
    """Point ``alias`` at ``target`` (a relative symlink, replaced atomically; a copy where the file
    system has no symlinks)."""
    tmp = alias.with_name(f".{alias.name}.link")
    tmp.unlink(missing_ok=True)
    try:
        os.symlink(target.name, tmp)
    except OSError:
        import shutil

        shutil.copyfile(target, tmp)
    os.replace(tmp, alias)


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
