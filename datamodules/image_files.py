"""Image files on disk -> uint8 tensors, and the class-folder layouts archives unpack to.

Decoding happens once, at decode time (the result is cached by :func:`cached_decode`):
each file is opened with PIL, converted to RGB or L, resized straight to ``size x size``
(no aspect-preserving crop: the papers' code resizes the same way) and copied into one
preallocated uint8 [N, C, size, size] tensor.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from bench.core.errors import CorruptDataError, DatasetNotFoundError

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


def list_image_files(folder: Path) -> list[Path]:
    """Image files directly in ``folder`` (by extension, case-insensitive), sorted by name."""
    return sorted(
        p for p in folder.iterdir() if p.is_file() and _visible(p) and p.suffix.lower() in IMAGE_EXTENSIONS
    )


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
    base: Path, class_dirs: Sequence[FolderSpec], *, dataset: str, hint: str = ""
) -> tuple[list[Path], np.ndarray]:
    """Image paths under ``base/<class folder>/`` and their labels (label = position in ``class_dirs``).

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
        files = list_image_files(folder)
        if not files:
            raise DatasetNotFoundError(
                f"Dataset {dataset!r}: class folder '{folder}' holds no image files "
                f"({', '.join(sorted(IMAGE_EXTENSIONS))}). {hint}".rstrip()
            )
        paths.extend(files)
        labels.extend([label] * len(files))
    return paths, np.asarray(labels, dtype=np.int64)
