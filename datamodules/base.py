"""The dataset interface: a LightningDataModule that decodes once into uint8 tensors."""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import lightning as L
import torch

from bench.core.errors import DatasetNotFoundError, FedbenchError
from bench.core.paths import DEFAULT_CACHE_DIR
from bench.core.registry import Registry
from datamodules.fingerprint import tree_fingerprint
from datamodules.splits import stratified_split, stratified_subset
from datamodules.tensors import TensorSplit, cached_decode

DATASETS: Registry[type[FederatedDataModule]] = Registry("dataset", "datamodules")


class FederatedDataModule(L.LightningDataModule):
    """A dataset of the suite: its files, class names, splits, image size and normalisation.

    Subclasses implement :meth:`decode` (read the official layout under ``root`` and return
    uint8 splits at ``image_size``) and set the class attributes. ``setup`` decodes once into
    an on-disk cache; afterwards ``train``/``val``/``test`` are :class:`TensorSplit`.
    """

    class_names: ClassVar[list[str]]
    in_channels: ClassVar[int] = 3
    default_image_size: ClassVar[int] = 224
    default_root: ClassVar[str | None] = None
    mean: ClassVar[tuple[float, ...]] = (0.485, 0.456, 0.406)
    std: ClassVar[tuple[float, ...]] = (0.229, 0.224, 0.225)
    download_hint: ClassVar[str] = ""
    decode_version: ClassVar[int] = 1

    def __init__(
        self,
        root: str | None = None,
        image_size: int | None = None,
        cache_dir: str = DEFAULT_CACHE_DIR,
        max_train_samples: int | None = None,
        max_test_samples: int | None = None,
        val_fraction: float = 0.1,
        split_seed: int = 0,
    ) -> None:
        super().__init__()
        self.root = root if root is not None else self.default_root
        self.image_size = int(image_size or self.default_image_size)
        self.cache_dir = cache_dir
        self.max_train_samples = max_train_samples
        self.max_test_samples = max_test_samples
        self.val_fraction = val_fraction
        self.split_seed = split_seed
        self.fingerprint = "-"  # of the source files, set by setup
        self.train: TensorSplit
        self.val: TensorSplit
        self.test: TensorSplit

    # ---- subclass API -------------------------------------------------------------------
    def decode(self) -> dict[str, TensorSplit]:
        """Read the files under ``self.root``; return 'train', 'test' and optionally 'val'."""
        raise NotImplementedError

    # ---- shared machinery ---------------------------------------------------------------
    @property
    def name(self) -> str:
        return getattr(type(self), "registry_name", type(self).__name__)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def require_root(self, *must_exist: str) -> Path:
        """The data root, or one clear error naming what to download and where to put it."""
        root = Path(self.root).expanduser() if self.root else None
        missing = [m for m in must_exist if root is None or not (root / m).exists()]
        if root is None or not root.exists() or missing:
            where = f"'{root}'" if root else "(no --data.root given)"
            what = f" (missing: {', '.join(missing)})" if missing and root and root.exists() else ""
            raise DatasetNotFoundError(
                f"Dataset {self.name!r} not found at {where}{what}. {self.download_hint} "
                f"Then pass --data.root /path/to/it."
            )
        return root

    def source_paths(self) -> list[Path]:
        """The files or folders the decoded data comes from (fingerprinted to notice changed files);
        datasets that read a few archive files under a shared root name just those."""
        return [Path(self.root).expanduser()] if self.root else []

    def source_fingerprint(self) -> str:
        """Names, sizes and mtimes of every source file (datamodules/fingerprint.py)."""
        skip = (self.cache_dir,)
        return "+".join(tree_fingerprint(p, skip) for p in self.source_paths()) or "-"

    def cache_key(self) -> str:
        root = str(Path(self.root).expanduser().resolve()) if self.root else "-"
        return f"{self.name}|{root}|{self.image_size}|v{self.decode_version}"

    def setup(self, stage: str | None = None) -> None:
        if getattr(self, "_is_setup", False):
            return
        self.fingerprint = self.source_fingerprint()
        splits = cached_decode(self.cache_dir, self.cache_key(), self.decode, self.fingerprint)
        train = splits["train"]
        if "val" in splits:
            val = splits["val"]
        else:
            tr_idx, va_idx = stratified_split(
                train.labels.numpy(), [1 - self.val_fraction, self.val_fraction], self.split_seed
            )
            train, val = train.subset(torch.from_numpy(tr_idx)), train.subset(torch.from_numpy(va_idx))
        test = splits["test"]
        if self.max_train_samples:
            train = train.subset(torch.from_numpy(stratified_subset(train.labels.numpy(), self.max_train_samples, self.split_seed)))
        if self.max_test_samples:
            keep = self.max_test_samples
            val = val.subset(torch.from_numpy(stratified_subset(val.labels.numpy(), keep, self.split_seed)))
            test = test.subset(torch.from_numpy(stratified_subset(test.labels.numpy(), keep, self.split_seed)))
        for split_name, split in (("train", train), ("val", val), ("test", test)):
            if len(split) == 0:
                raise DatasetNotFoundError(f"Dataset {self.name!r}: the {split_name} split is empty under {self.root!r}.")
            if int(split.labels.max()) >= self.num_classes or int(split.labels.min()) < 0:
                raise ValueError(f"{self.name}: labels outside 0..{self.num_classes - 1} in the {split_name} split")
        present = sorted(set(train.labels.tolist()))
        if self.num_classes < 2 or len(present) < 2:
            names = [self.class_names[i] for i in present]
            raise FedbenchError(
                f"Dataset {self.name!r} under {self.root!r} gives {len(present)} class(es) to train on ({names}; "
                f"{self.num_classes} declared): classification needs at least two. Add a folder per class, "
                "or raise data.max_train_samples.")
        self.train, self.val, self.test = train, val, test
        self._is_setup = True

    def normalisation(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel mean and std shaped [1, C, 1, 1] for images scaled to [0, 1]."""
        mean = torch.tensor(self.mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        return mean, std
