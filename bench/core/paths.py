"""Where fedbench lives and where it caches decoded data and features."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CACHE_DIR = os.environ.get("FEDBENCH_CACHE", str(Path.home() / ".cache" / "fedbench"))
