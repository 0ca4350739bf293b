"""Decoded datasets as uint8 tensors, plus the on-disk cache they are decoded into once."""
from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.core.atomic_io import NoSpaceError, atomic_torch_save
from bench.core.errors import FedbenchError, FedbenchWarning, first_line


@dataclass
class TensorSplit:
    """One split of a dataset, decoded: images uint8 [N, C, H, W], labels int64 [N].

    ``groups`` optionally holds a site / centre id per sample (used by the natural partition).
    ``origin`` names its content without reading it: a digest of the decoded dataset's cache key and
    source-file fingerprint and the split's name, then of every ``subset`` taken (None: unknown, e.g. a
    split built in memory). The CLIP feature cache keys by it instead of hashing every image per run.
    """

    images: torch.Tensor
    labels: torch.Tensor
    groups: torch.Tensor | None = None
    origin: str | None = None

    def __post_init__(self) -> None:
        for name in ("images", "labels", "groups"):
            value = getattr(self, name)
            if not (isinstance(value, torch.Tensor) or name == "groups" and value is None):
                raise TypeError(f"{name} must be a tensor, got {type(value).__name__}")
        if self.images.dtype != torch.uint8 or self.images.ndim != 4:
            raise TypeError(f"images must be uint8 [N, C, H, W], got {self.images.dtype} {tuple(self.images.shape)}")
        if self.labels.ndim != 1 or self.labels.is_floating_point() or self.labels.is_complex():
            raise TypeError(f"labels must be integers [N], got {self.labels.dtype} {tuple(self.labels.shape)}")
        self.labels = self.labels.long()
        if len(self.images) != len(self.labels):
            raise ValueError(f"{len(self.images)} images but {len(self.labels)} labels")
        if self.groups is not None and tuple(self.groups.shape) != (len(self.labels),):
            raise ValueError(f"groups must be one id per sample [{len(self.labels)}], got {tuple(self.groups.shape)}")

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, index: torch.Tensor) -> TensorSplit:
        index = torch.as_tensor(index, dtype=torch.long)
        groups = None if self.groups is None else self.groups[index]
        return TensorSplit(self.images[index], self.labels[index], groups, subset_origin(self.origin, index))


def subset_origin(origin: str | None, index: torch.Tensor) -> str | None:
    """The origin of the rows ``index`` of a split whose origin is ``origin`` (None stays None)."""
    if origin is None:
        return None
    rows = index.detach().to("cpu", torch.int64).contiguous().numpy()
    return hashlib.sha256(origin.encode() + memoryview(rows).cast("B")).hexdigest()


def split_origin(key: str, fingerprint: str, name: str) -> str | None:
    """The origin of split ``name`` of the dataset decoded under ``key`` from files with ``fingerprint``
    (None without a fingerprint: then nothing names the content but the content itself)."""
    if not fingerprint or fingerprint == "-":
        return None
    return hashlib.sha256(f"{key}\n{fingerprint}\n{name}".encode()).hexdigest()


def machine_memory() -> int | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def check_decoded_size(n: int, channels: int, size: int) -> None:
    """Refuse, before allocating, to decode ``n`` images of ``channels`` x size x size uint8 when they
    would not fit in this machine's memory (``data.image_size`` far too large): one clear error."""
    need, have = n * channels * size * size, machine_memory()
    if have is not None and need > have:
        raise FedbenchError(
            f"data.image_size {size}: the {n} decoded images would take {human_bytes(need)} ({n} x {channels} x "
            f"{size} x {size} bytes), more than this machine's {human_bytes(have)} of memory. Use a smaller "
            "data.image_size (unset: the dataset's default size).")


def resize_uint8(images: torch.Tensor, size: int) -> torch.Tensor:
    """Resize a uint8 [N, C, H, W] batch to size x size once, at decode time (antialiased bilinear)."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images.contiguous()
    check_decoded_size(images.shape[0], images.shape[1], size)
    out = []
    for chunk in images.split(1024):
        x = F.interpolate(chunk.float(), size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        out.append(x.round_().clamp_(0, 255).to(torch.uint8))
    return torch.cat(out)


def _read_cache(path: Path) -> dict | None:
    """A decode cache file's contents, or None (with a warning naming it, and the file deleted) when it
    cannot be read: a truncated or foreign file is rebuilt instead of failing every later run."""
    try:
        raw = torch.load(path, weights_only=True)
        if not isinstance(raw, dict):
            raise TypeError(f"holds a {type(raw).__name__}, not a dict")
        return raw
    except FileNotFoundError:
        return None
    except Exception as err:  # noqa: BLE001 - truncated/corrupt/foreign file: rebuild it
        first = first_line(err, 160)
        warnings.warn(f"decode cache {path} is unreadable ({first}); deleting it and decoding the dataset "
                      "again.", FedbenchWarning, stacklevel=3)
        path.unlink(missing_ok=True)
        return None


def cached_splits(raw: dict, required: Sequence[str], grouped: Sequence[str]) -> dict[str, TensorSplit]:
    """The TensorSplits stored in a decode cache file's ``splits``; TypeError/ValueError when they are
    not what this version writes (another layout, a missing split or group ids, wrong types)."""
    stored = raw.get("splits")
    if not isinstance(stored, dict) or not all(isinstance(v, dict) for v in stored.values()):
        raise TypeError("its 'splits' is not a mapping of split name -> fields")
    missing = [name for name in required if name not in stored]
    if missing:
        raise ValueError(f"it has no {', '.join(repr(m) for m in missing)} split (holds {sorted(map(str, stored))})")
    splits = {name: TensorSplit(**fields) for name, fields in stored.items()}
    ungrouped = [name for name in grouped if splits[name].groups is None]
    if ungrouped:
        raise ValueError(f"its {', '.join(repr(u) for u in ungrouped)} split has no group ids")
    return splits


def cached_decode(
    cache_dir: str | os.PathLike, key: str, decode: Callable[[], dict[str, TensorSplit]], fingerprint: str = "-",
    required: Sequence[str] = (), grouped: Sequence[str] = (),
    check: Callable[[dict[str, TensorSplit]], None] | None = None,
) -> dict[str, TensorSplit]:
    """Return the decoded splits for ``key``, decoding with ``decode()`` only when the cache file is
    missing, unreadable, was built from other files (``fingerprint``, see datamodules/fingerprint.py),
    or holds another format than this version writes (a file of an older or other fedbench: any
    other layout, without one of the ``required`` split names, or without group ids in a ``grouped``
    split, is decoded again and replaced). ``check(splits)`` may refuse a loaded file's contents with a
    ValueError (labels outside the dataset's classes): it is decoded again, with a notice."""
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"{digest}.pt"
    raw = _read_cache(path) if path.exists() else None
    if raw is not None:
        if raw.get("key") == key and raw.get("fingerprint") == fingerprint:
            try:
                splits = cached_splits(raw, (*required, *grouped), grouped)
                if check is not None:
                    check(splits)
                return splits
            except (TypeError, ValueError) as err:
                warnings.warn(f"decode cache {path} is in another format than this fedbench writes ({err}); "
                              "decoding the dataset again.", FedbenchWarning, stacklevel=2)
        else:
            why = ("was written by an older fedbench (no file fingerprint)" if "fingerprint" not in raw else
                   "was written for another dataset or decoding (its key differs)" if raw.get("key") != key else
                   "was built from other files than those now under the data root (files added, removed or changed)")
            warnings.warn(f"decode cache {path} {why}; decoding again.", FedbenchWarning, stacklevel=2)
    splits = decode()
    contents = {"key": key, "fingerprint": fingerprint, "splits": {name: vars(s) for name, s in splits.items()}}
    try:
        atomic_torch_save(contents, path)
    except OSError as err:  # a full disk too (NoSpaceError, also for torch's RuntimeError over ENOSPC)
        fix = "Free space on it" if isinstance(err, NoSpaceError) else "Make it writable"
        warnings.warn(f"cannot write the decode cache {path} ({err.strerror or err}); running uncached: the "
                      f"dataset will be decoded again next time. {fix}, or set --data.cache_dir to another folder.",
                      FedbenchWarning, stacklevel=2)
    return splits
