"""A cheap fingerprint of a dataset's files: names, sizes and modification times, no contents read.

Adding, deleting, replacing or touching a file under the data root changes it, so a decode cache
(or a checkpoint) made from other files is noticed. One ``stat`` per file: about a second for
hundreds of thousands of files.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path


def tree_fingerprint(root: str | os.PathLike | None, skip: tuple[str | os.PathLike, ...] = ()) -> str:
    """SHA-1 (16 hex digits) over (relative path, size, mtime_ns) of every file under ``root``
    (symlinks followed; folders in ``skip``, e.g. a cache kept inside the root, left out).
    A single file as ``root`` is fingerprinted alone; no root gives '-'."""
    if root is None:
        return "-"
    base = Path(root).expanduser()
    skipped = {os.path.realpath(s) for s in skip}
    digest = hashlib.sha1()
    if base.is_file():
        st = base.stat()
        digest.update(f"{base.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return digest.hexdigest()[:16]
    seen = set(skipped)  # real paths already walked: a symlink loop is walked once
    for folder, dirs, files in os.walk(base, followlinks=True):
        real = [os.path.realpath(os.path.join(folder, d)) for d in dirs]
        dirs[:] = sorted(d for d, r in zip(dirs, real) if r not in seen)
        seen.update(real)
        rel = os.path.relpath(folder, base)
        for name in sorted(files):
            try:
                st = os.stat(os.path.join(folder, name))
            except OSError:  # a dangling link: its name still counts
                digest.update(f"{rel}/{name}\0broken\n".encode())
                continue
            digest.update(f"{rel}/{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]
