"""The data home: one folder under which every dataset is found by its official archive name.

``FEDBENCH_DATA`` (or ``--data-home``, which sets it for the process and its ranks) names the
folder; the default is ``./data``. A dataset with no explicit ``data.root`` is looked up there
under the names its archive unpacks to (``kvasir-dataset-v2/``, ``dermamnist*.npz``,
``fed_isic2019/``, ...: each datamodule's ``home_entries``). An explicit ``data.root`` always wins.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

DATA_HOME_ENV = "FEDBENCH_DATA"
DEFAULT_DATA_HOME = "data"
HOW_TO_SET = (f"set {DATA_HOME_ENV}=/path/to/folder or pass --data-home /path/to/folder "
              f"(default ./{DEFAULT_DATA_HOME})")


def data_home() -> Path:
    """The data home as an absolute path: $FEDBENCH_DATA, else ./data (not required to exist)."""
    raw = os.environ.get(DATA_HOME_ENV, "").strip() or DEFAULT_DATA_HOME
    return Path(raw).expanduser().resolve()


def set_data_home(path: str | os.PathLike) -> Path:
    """Make ``path`` the data home of this process and of the processes it starts (Fabric's ranks)."""
    home = Path(path).expanduser().resolve()
    os.environ[DATA_HOME_ENV] = str(home)
    return home


def locate(home: Path, entries: Sequence[str]) -> Path | None:
    """The dataset root under ``home``: the first entry (a name or a glob pattern) that exists.

    A folder entry is the root itself; a file entry (``dermamnist*.npz``) makes its folder the root.
    """
    for entry in entries:
        for match in sorted(home.glob(entry)) if any(c in entry for c in "*?[") else [home / entry]:
            if match.is_dir():
                return match
            if match.is_file():
                return match.parent
    return None
