"""Run records: one JSON per run (config, commit, partition, per-round metrics, best/final, timings)."""
from __future__ import annotations

import importlib.metadata
import json
import math
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parents[1]
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


def _clean(obj: Any) -> Any:
    """JSON-safe: NaN/inf become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def make_readable(path: str | os.PathLike) -> None:
    """Give a mkstemp file (mode 0600) the permissions a plain open() would (0666 minus umask)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> None:
    """Call ``write`` on a temporary file beside ``path``, then rename it into place (readable like a
    plain open() would make it); nothing is left behind on failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        make_readable(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))


def write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(_clean(obj), indent=1, allow_nan=False) + "\n")


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


def record_path(output_dir: str, experiment: str, run_name: str) -> Path:
    return Path(output_dir) / experiment / f"{run_name}.json"


def load_record(path: str | os.PathLike) -> dict:
    with open(path) as fh:
        return json.load(fh)
