"""Where fedbench lives and where it caches decoded data and features; and the one check of every file or
folder name built from a config value (table, dataset, experiment, run and regression entry names,
dashboard files), so that no value can write outside the folder it names a file in."""
from __future__ import annotations

import os
from pathlib import Path

from bench.core.errors import FedbenchError

REPO_ROOT = Path(__file__).resolve().parents[2]  # a checkout; installed: site-packages (configs/ is shipped there)
DEFAULT_CACHE_DIR = os.environ.get("FEDBENCH_CACHE", str(Path.home() / ".cache" / "fedbench"))
_SEPARATORS = {"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())


def plain_name(value: object, what: str, where: str = "") -> str:
    """``value`` as one file or folder name (no separator, not '.' or '..', no control character, no
    surrounding blank): what every name built from a config value must be before it becomes part of a
    path. ``what`` names the option (e.g. "table"), ``where`` the folder it is a name in. One
    FedbenchError otherwise."""
    text = value if isinstance(value, str) else ""
    bad = (not text or text in (".", "..") or text != text.strip() or any(s in text for s in _SEPARATORS)
           or any(ord(ch) < 32 for ch in text))
    if bad:
        inside = f" (it names a file or folder in {where})" if where else ""
        raise FedbenchError(f"{what} must be a plain name: not empty, no '/' or '\\', not '.' or '..'{inside}; "
                            f"got {value!r}.")
    return text


def shipped(path: str | os.PathLike) -> Path:
    """``path`` itself when it exists or is absolute; else the same relative path under REPO_ROOT when
    that exists: the configs/ and results/paper/ of a checkout, which a wheel installs next to its
    packages (pyproject.toml), so ``--config configs/tables/x.yaml`` works from any working directory."""
    p = Path(path)
    return REPO_ROOT / p if not p.is_absolute() and not p.exists() and (REPO_ROOT / p).exists() else p
