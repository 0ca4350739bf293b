"""Image files on disk -> uint8 tensors, and the class-folder layouts archives unpack to.

Decoding happens once, at decode time (the result is cached by :func:`cached_decode`):
each file is opened with PIL, converted to RGB or L, resized straight to ``size x size``
(no aspect-preserving crop: the papers' code resizes the same way) and copied into one
preallocated uint8 [N, C, size, size] tensor.
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from bench.core.errors import CorruptDataError, DatasetNotFoundError
from datamodules.tensors import check_decoded_size

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff"})
PROGRESS_MIN_FILES = 500  # show a progress bar from this many files on
_SKIP_DIRS = frozenset({"__MACOSX"})
_CHUNK = 1024

# a class's folder: one name, or alternatives accepted for the same class (archive versions differ)
FolderSpec = str | Sequence[str]


def _to_8bit(img: Image.Image) -> Image.Image:
    """16-bit and float greyscale images scaled to 8 bit (PIL's own convert would clip them)."""
    if img.mode.startswith("I;16") or img.mode in ("I", "F"):
        arr = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
        return Image.fromarray(np.clip(np.round(arr * (255.0 / top)), 0, 255).astype(np.uint8), mode="L")
    return img


def load_image(path: str | os.PathLike, size: int, in_channels: int) -> np.ndarray:
    """One file decoded to uint8 [C, size, size]; a file PIL cannot read raises CorruptDataError."""
    mode = "RGB" if in_channels == 3 else "L"
    try:
        with Image.open(path) as img:
            if img.format == "JPEG":  # let libjpeg decode at a reduced scale (>= size), much faster
                img.draft(mode, (size, size))
            img = _to_8bit(img).convert(mode).resize((size, size), Image.Resampling.BILINEAR)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        raise CorruptDataError(
            f"Cannot decode image file '{path}': {err}. Re-download the dataset archive and unpack it again "
            f"(or delete this file)."
        ) from err
    arr = np.array(img, dtype=np.uint8)
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


def decode_image_files(
    paths: Sequence[str | os.PathLike],
    size: int,
    in_channels: int = 3,
    desc: str = "decoding images",
    num_threads: int | None = None,
) -> torch.Tensor:
    """Decode ``paths`` into a uint8 [N, in_channels, size, size] tensor (order kept).

    Files are decoded by a small thread pool (PIL releases the GIL while decoding); a tqdm bar
    is shown from :data:`PROGRESS_MIN_FILES` files on. The first unreadable file raises
    :class:`CorruptDataError` naming it.
    """
    if in_channels not in (1, 3):
        raise ValueError(f"in_channels must be 1 or 3, got {in_channels}")
    check_decoded_size(len(paths), in_channels, size)
    out = torch.empty((len(paths), in_channels, size, size), dtype=torch.uint8)
    if not paths:
        return out
    threads = num_threads or min(8, os.cpu_count() or 1)
    bar = tqdm(total=len(paths), desc=desc, unit="img", disable=len(paths) < PROGRESS_MIN_FILES)
    with bar, ThreadPoolExecutor(max_workers=threads) as pool:
        for start in range(0, len(paths), _CHUNK):  # bounded number of pending futures
            chunk = paths[start : start + _CHUNK]
            for i, arr in enumerate(pool.map(lambda p: load_image(p, size, in_channels), chunk), start):
                out[i] = torch.from_numpy(arr)
            bar.update(len(chunk))
    return out


def _visible(entry: Path) -> bool:
    return not entry.name.startswith(".") and entry.name not in _SKIP_DIRS


@dataclass
class ScanLog:
    """What a scan of class folders read beyond the plain layout and what it left out, for one summary line."""

    nested: int = 0  # images read from sub-folders of a class folder
    not_images: Counter = field(default_factory=Counter)  # skipped files by extension ("" for none)
    hidden: int = 0  # skipped dot-files and __MACOSX entries
    ignored: list[str] = field(default_factory=list)  # folders / files outside the class folders, left out

    def summary(self, dataset: str, root: Path, read: int) -> str | None:
        """One line naming everything skipped (None when nothing was skipped or read from sub-folders)."""
        parts = []
        if self.nested:
            parts.append(f"{self.nested} of them from sub-folders of a class folder")
        skipped = sum(self.not_images.values())
        if skipped:
            kinds = ", ".join(f"{n} {ext or '(no extension)'}" for ext, n in sorted(self.not_images.items()))
            parts.append(f"skipped {skipped} file(s) that are not images ({kinds}; read: "
                         f"{', '.join(sorted(IMAGE_EXTENSIONS))})")
        if self.hidden:
            parts.append(f"skipped {self.hidden} hidden file(s) or folder(s) (.*, __MACOSX)")
        if self.ignored:
            shown = ", ".join(self.ignored[:5]) + (f" and {len(self.ignored) - 5} more" if len(self.ignored) > 5 else "")
            parts.append(f"left out {len(self.ignored)} entr{'y' if len(self.ignored) == 1 else 'ies'} that are no "
                         f"class folder or image: {shown}")
        return f"Dataset {dataset!r} at '{root}': read {read} images; " + "; ".join(parts) + "." if parts else None


def list_image_files(folder: Path, recursive: bool = False, log: ScanLog | None = None) -> list[Path]:
    """Image files in ``folder`` (by extension, case-insensitive), sorted by path relative to it: directly in
    it, or with ``recursive`` in its sub-folders too (as torchvision's ImageFolder reads a class). ``log``
    counts what is skipped (not an image, hidden) and the images found in sub-folders."""
    log = log if log is not None else ScanLog()
    out = _image_files(folder, recursive, log, 0, {os.path.realpath(folder)})
    return sorted(out, key=lambda p: p.relative_to(folder).as_posix())


def _image_files(folder: Path, recursive: bool, log: ScanLog, depth: int, seen: set[str]) -> list[Path]:
    """``seen``: the real paths of the folders walked, so a symlink loop is walked once."""
    out = []
    for entry in sorted(folder.iterdir()):
        if not _visible(entry):
            log.hidden += 1
        elif entry.is_dir():
            real = os.path.realpath(entry)
            if not recursive:
                log.ignored.append(f"{entry}/")
            elif real in seen:
                log.ignored.append(f"{entry}/ (a link to a folder already read)")
            else:
                seen.add(real)
                out += _image_files(entry, True, log, depth + 1, seen)
        elif not entry.is_file():  # a dangling link, a socket: never read (nor before sub-folders were)
            log.ignored.append(f"{entry} (not a readable file)")
        elif entry.suffix.lower() in IMAGE_EXTENSIONS:
            out.append(entry)
            log.nested += depth > 0
        else:
            log.not_images[entry.suffix.lower()] += 1
    return out


def list_subfolders(folder: Path) -> list[str]:
    """Names of the visible sub-folders of ``folder``, sorted (``__MACOSX`` and dot-folders skipped)."""
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and _visible(p))


def _alternatives(spec: FolderSpec) -> tuple[str, ...]:
    return (spec,) if isinstance(spec, str) else tuple(spec)


def resolve_folder(parent: Path, spec: FolderSpec) -> Path | None:
    """The first existing sub-folder of ``parent`` among the alternatives of ``spec``, if any."""
    for name in _alternatives(spec):
        if (parent / name).is_dir():
            return parent / name
    return None


def find_dir_with(root: Path, children: Sequence[FolderSpec], max_depth: int = 2) -> Path | None:
    """The shallowest folder at or below ``root`` (up to ``max_depth`` levels) holding all ``children``.

    Archives often unpack into one or two wrapper folders (``RetinalOCT_Dataset/...``);
    this finds the level where the expected folders live. Breadth-first, sorted: deterministic.
    """
    level = [root] if root.is_dir() else []
    for _ in range(max_depth + 1):
        for folder in level:
            if all(resolve_folder(folder, c) is not None for c in children):
                return folder
        level = [folder / name for folder in level for name in list_subfolders(folder)]
    return None


def scan_class_folders(
    base: Path, class_dirs: Sequence[FolderSpec], *, dataset: str, hint: str = "", recursive: bool = False,
    log: ScanLog | None = None,
) -> tuple[list[Path], np.ndarray]:
    """Image paths under ``base/<class folder>/`` (with ``recursive``, in its sub-folders too) and their
    labels (label = position in ``class_dirs``); ``log`` collects what was skipped (list_image_files).

    A missing or empty class folder raises :class:`DatasetNotFoundError` naming the folder,
    the dataset and ``hint`` (what to download and where to put it).
    """
    paths: list[Path] = []
    labels: list[int] = []
    for label, spec in enumerate(class_dirs):
        folder = resolve_folder(base, spec)
        names = " or ".join(repr(n) for n in _alternatives(spec))
        if folder is None:
            expected = ", ".join(_alternatives(s)[0] for s in class_dirs)
            raise DatasetNotFoundError(
                f"Dataset {dataset!r}: class folder {names} is missing under '{base}' "
                f"(expected one folder per class: {expected}). {hint}".rstrip()
            )
        files = list_image_files(folder, recursive, log)
        if not files:
            raise DatasetNotFoundError(
                f"Dataset {dataset!r}: class folder '{folder}' holds no image files "
                f"({', '.join(sorted(IMAGE_EXTENSIONS))}). {hint}".rstrip()
            )
        paths.extend(files)
        labels.extend([label] * len(files))
    return paths, np.asarray(labels, dtype=np.int64)
