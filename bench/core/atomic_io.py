"""Atomic file writes: a temporary file beside the target, renamed into place; nothing half-written."""
from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch


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


def claim_json(path: str | os.PathLike, obj: Any) -> bool:
    """Write ``obj`` as JSON to ``path`` only if no file is there, atomically (a hard link of a complete
    temporary file: it either appears whole or not at all); False when ``path`` already existed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write((json.dumps(_clean(obj), indent=1, allow_nan=False) + "\n").encode("utf-8"))
        make_readable(tmp)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        Path(tmp).unlink(missing_ok=True)


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` through ``atomic_write``: no half-written checkpoint or cache file."""
    atomic_write(path, lambda fh: torch.save(obj, fh))
