"""Atomic file writes: a temporary file beside the target, renamed into place; nothing half-written.

A write that fails for want of room (``OSError`` ENOSPC/EDQUOT, or the ``RuntimeError`` torch's zip
writer raises over it: "[enforce fail at inline_container.cc:...] unexpected pos ...") becomes a
:class:`NoSpaceError` naming the folder, the space free and about how much the file needed; the
temporary file is removed.
"""
from __future__ import annotations

import errno
import json
import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from bench.core.errors import FedbenchError, FedbenchWarning

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
TORCH_WRITE_FAILED = ("unexpected pos", "PytorchStreamWriter failed writing", "file write failed")


class WriteError(FedbenchError, OSError):
    """A file could not be written (an OSError, so that callers that tolerate I/O errors still do)."""


class NoSpaceError(WriteError):
    """The file system is full: the message names the folder, the space free and the space needed."""


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


def megabytes(n: float) -> str:
    mb = n / 2**20
    return f"{mb:.3f}" if mb < 0.1 else f"{mb:.2f}" if mb < 1 else f"{mb:.1f}" if mb < 10 else f"{mb:.0f}"


def free_bytes(folder: str | os.PathLike) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _chained_errno(err: BaseException) -> int | None:
    """The errno of the first OSError in ``err``'s chain (torch's writer raises over the OSError)."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, OSError) and err.errno is not None:
            return err.errno
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None


def write_failure(err: BaseException, path: Path, needed: int | None) -> WriteError | None:
    """The WriteError that ``err`` (raised while writing ``path``) stands for, or None when it is to be
    re-raised as it is: any other OSError (permission denied, ...: callers tell those apart), a bug, an
    interrupt."""
    if isinstance(err, WriteError):
        return err
    code = _chained_errno(err)
    torch_write = isinstance(err, RuntimeError) and any(m in str(err) for m in TORCH_WRITE_FAILED)
    if not torch_write and not (isinstance(err, OSError) and code in NO_SPACE):
        return None
    free = free_bytes(path.parent)
    if code in NO_SPACE or (code is None and torch_write and needed is not None and free is not None
                            and free < needed):
        room = "" if free is None else f" ({megabytes(free)} MB free" + (
            f", about {megabytes(needed)} MB needed)" if needed else ")")
        return NoSpaceError(f"no space left on {path.parent}{room}")
    reason = os.strerror(code) if code is not None else " ".join(str(err).split())[:200]
    return WriteError(f"cannot write {path} ({reason})")


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any], needed: int | None = None) -> None:
    """Call ``write`` on a temporary file beside ``path``, then rename it into place (readable like a
    plain open() would make it); nothing is left behind on failure. A failed write (full disk, I/O
    error, read-only folder) raises WriteError (NoSpaceError when the disk is full; ``needed``: about
    how many bytes the file takes, for its message)."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        make_readable(tmp)
        os.replace(tmp, path)
    except BaseException as err:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        failure = write_failure(err, path, needed)
        if failure is None or failure is err:
            raise
        raise failure from err


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    data = text.encode("utf-8")
    atomic_write(path, lambda fh: fh.write(data), needed=len(data))


def write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(_clean(obj), indent=1, allow_nan=False) + "\n")


def claim_json(path: str | os.PathLike, obj: Any) -> bool:
    """Write ``obj`` as JSON to ``path`` only if no file is there, atomically: a hard link of a complete
    temporary file, so it either appears whole or not at all. On a file system without hard links (FAT,
    some network mounts) the name is claimed with an exclusive create instead and filled at once (a
    reader could see it empty for that moment). False when ``path`` already existed."""
    path = Path(path)
    data = (json.dumps(_clean(obj), indent=1, allow_nan=False) + "\n").encode("utf-8")
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        make_readable(tmp)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError as err:
            if err.errno not in NO_HARD_LINKS:
                raise
            return _claim_exclusive(path, data)
        return True
    except OSError as err:
        if tmp is not None:  # first, so that the space it took counts as free in the message
            Path(tmp).unlink(missing_ok=True)
        failure = write_failure(err, path, len(data))
        if failure is None or failure is err:
            raise
        raise failure from err
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


# os.link's errors on a file system without hard links (vfat: EPERM; some FUSE/SMB mounts: ENOTSUP,
# EOPNOTSUPP, ENOSYS; EXDEV/EMLINK for good measure)
NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV, errno.EMLINK}


def _claim_exclusive(path: Path, data: bytes) -> bool:
    """``claim_json`` without hard links: O_CREAT|O_EXCL claims the name (only one process can), then the
    data is written; a failed write removes the claimed file, so no half-written record stays."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return False
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return True


def tensor_bytes(obj: Any) -> int:
    """The bytes of the tensors in ``obj`` (nested dicts, lists, tuples; a shared storage counted once):
    about what ``torch.save`` writes."""
    import torch  # here: the JSON writers (records, regression references) import no torch

    seen: set[int] = set()
    total = 0
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` through ``atomic_write``: no half-written checkpoint or cache file; a full disk
    raises NoSpaceError (torch's own error for it is a RuntimeError about stream positions)."""
    import torch

    atomic_write(path, lambda fh: torch.save(obj, fh), needed=tensor_bytes(obj) + 4096)


def save_cache(obj: Any, path: str | os.PathLike, what: str) -> bool:
    """``atomic_torch_save`` for a cache, which a run can do without: a failed write (full disk,
    read-only folder) is a warning, and the run goes on uncached. Whether it was written."""
    try:
        atomic_torch_save(obj, path)
    except OSError as err:
        warnings.warn(f"cannot write {what} {path}: {err}; running uncached (it will be computed again next "
                      "time).", FedbenchWarning, stacklevel=3)
        return False
    return True
