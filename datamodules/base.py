"""The dataset interface: a LightningDataModule that decodes once into uint8 tensors."""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import lightning as L
import torch

from bench.core.errors import DatasetNotFoundError, FedbenchError
from bench.core.paths import DEFAULT_CACHE_DIR
from bench.core.registry import Registry
from datamodules.data_home import HOW_TO_SET, data_home, locate
from datamodules.fingerprint import tree_fingerprint
from datamodules.folds import fold_split, pooled
from datamodules.splits import stratified_split, stratified_subset
from datamodules.tensors import TensorSplit, cached_decode, split_origin

DATASETS: Registry[type[FederatedDataModule]] = Registry("dataset", "datamodules")


def splittable_datasets() -> list[str]:
    """The datasets that read a published client split file (``data.client_split_file``)."""
    return [n for n in DATASETS.names() if DATASETS.get(n).client_split_format is not None]


class FederatedDataModule(L.LightningDataModule):
    """A dataset of the suite: its files, class names, splits, image size and normalisation.

    Subclasses implement :meth:`decode` (read the official layout under ``root`` and return
    uint8 splits at ``image_size``) and set the class attributes. ``setup`` decodes once into
    an on-disk cache; afterwards ``train``/``val``/``test`` are :class:`TensorSplit`.

    Where the files are: an explicit ``root`` wins; otherwise the first of ``home_entries`` (the
    names the official archive unpacks to) found under the data home (datamodules/data_home.py),
    else ``default_root`` when it exists. ``run_seed`` is the run's seed, for datasets whose
    sample selection is part of a trial (FEMNIST draws its writers from it); the others ignore it.
    """

    class_names: ClassVar[list[str]]
    in_channels: ClassVar[int] = 3
    default_image_size: ClassVar[int] = 224
    default_root: ClassVar[str | None] = None
    home_entries: ClassVar[tuple[str, ...]] = ()  # names (or globs) under the data home, preferred first
    mean: ClassVar[tuple[float, ...]] = (0.485, 0.456, 0.406)
    std: ClassVar[tuple[float, ...]] = (0.229, 0.224, 0.225)
    download_hint: ClassVar[str] = ""
    decode_version: ClassVar[int] = 1
    # the published client split file this dataset can read (``data.client_split_file``), None: it reads none
    client_split_format: ClassVar[str | None] = None
    # why K-fold cross-validation (``data.fold``, datamodules/folds.py) may re-split this dataset: it has no
    # fixed official test split, or a paper cross-validates it; None: its official test split stays
    cross_validation: ClassVar[str | None] = None

    def __init__(
        self,
        root: str | None = None,
        image_size: int | None = None,
        cache_dir: str = DEFAULT_CACHE_DIR,
        max_train_samples: int | None = None,
        max_test_samples: int | None = None,
        val_fraction: float = 0.1,
        split_seed: int = 0,
        run_seed: int = 0,
        client_split_file: str | None = None,
        fold: int | None = None,
        folds: int = 5,
    ) -> None:
        super().__init__()
        if fold is not None and self.cross_validation is None:
            raise FedbenchError(f"Dataset {self.name!r} has a fixed official test split: data.fold (K-fold "
                                "cross-validation) does not apply to it; leave data.fold unset.")
        self.fold, self.folds = fold, folds
        if client_split_file is not None and self.client_split_format is None:
            raise FedbenchError(f"Dataset {self.name!r} reads no client split file (data.client_split_file "
                                f"{client_split_file!r}); only {', '.join(splittable_datasets()) or 'none'} do.")
        self.client_split_file = client_split_file
        self.root_source = "data.root"
        self.data_home: Path | None = None
        if root is None:
            root, self.root_source = self.resolve_root()
        self.root = root
        self.run_seed = run_seed
        if client_split_file is not None and root is not None and not Path(client_split_file).expanduser().is_absolute():
            # a relative split file is looked for in the dataset's folder (e.g. under the data home), then here
            beside = Path(root).expanduser() / client_split_file
            self.client_split_file = str(beside) if beside.exists() or not Path(client_split_file).exists() \
                else client_split_file
        self.image_size = int(image_size or self.default_image_size)
        self.cache_dir = cache_dir
        self.max_train_samples = max_train_samples
        self.max_test_samples = max_test_samples
        self.val_fraction = val_fraction
        self.split_seed = split_seed
        self.fingerprint = "-"  # of the source files, set by setup
        self.train: TensorSplit
        self.val: TensorSplit | None  # None with val_fraction 0 (and no val split of the dataset's own)
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

    def resolve_root(self) -> tuple[str | None, str]:
        """(root, where it came from) when no explicit root is given: the data home, else the default."""
        if self.home_entries:
            self.data_home = data_home()
            found = locate(self.data_home, self.home_entries)
            if found is not None:
                return str(found), "data home"
        if self.default_root and Path(self.default_root).expanduser().exists():
            return self.default_root, "default"
        return (None, "none") if self.home_entries else (self.default_root, "default")

    def root_hint(self) -> str:
        """How to tell fedbench where the dataset is (ends every missing-data message)."""
        if self.root_source == "data.root":
            return ("Then pass --data.root /path/to/it (tables: --set data.root=/path/to/it), or leave data.root "
                    f"unset and unpack it under the data home: {HOW_TO_SET}.")
        if not self.home_entries:
            return "Then pass --data.root /path/to/it (tables: --set data.root=/path/to/it)."
        return (f"To use another data home, {HOW_TO_SET}; an explicit data.root (--data.root; tables: "
                "--set data.root=/path/to/it) wins over the data home.")

    def require_root(self, *must_exist: str) -> Path:
        """The data root, or one clear error naming what to download and where to put it."""
        root = Path(self.root).expanduser() if self.root else None
        missing = [m for m in must_exist if root is None or not (root / m).exists()]
        if root is None and self.data_home is not None:
            default = f", then at the default location '{self.default_root}'" if self.default_root else ""
            raise DatasetNotFoundError(
                f"Dataset {self.name!r} not found: looked for '{self.data_home / self.home_entries[0]}' "
                f"(under the data home '{self.data_home}'){default}. {self.download_hint} {self.root_hint()}"
            )
        if root is None or not root.exists() or missing:
            where = f"'{root}'" if root else "(no --data.root given)"
            what = f" (missing: {', '.join(missing)})" if missing and root and root.exists() else ""
            raise DatasetNotFoundError(
                f"Dataset {self.name!r} not found at {where}{what}. {self.download_hint} {self.root_hint()}"
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

    def check_labels(self, splits: dict[str, TensorSplit]) -> None:
        """ValueError when a split's labels fall outside 0..num_classes-1 (a damaged or foreign cache)."""
        for name, split in splits.items():
            if len(split) and (int(split.labels.min()) < 0 or int(split.labels.max()) >= self.num_classes):
                raise ValueError(f"its {name!r} split has labels outside 0..{self.num_classes - 1} "
                                 f"(min {int(split.labels.min())}, max {int(split.labels.max())})")

    def load_splits(self) -> tuple[TensorSplit, TensorSplit, TensorSplit]:
        """(train, val, test) from the decoded cache (keyed by the source files' fingerprint, set by
        setup); val is carved from train when the data has none."""
        splits = cached_decode(self.cache_dir, self.cache_key(), self.decode, self.fingerprint,
                               required=("train", "test"), check=self.check_labels)
        for name, split in splits.items():
            split.origin = split_origin(self.cache_key(), self.fingerprint, name)
        if self.fold is not None:  # fold k of K over every decoded sample; validation is carved from its train
            train, test = fold_split(pooled(splits), self.fold, self.folds, self.split_seed)
            for name, split in (("train", train), ("test", test)):
                split.origin = split_origin(self.cache_key(), self.fingerprint,
                                            f"{name} of fold {self.fold}/{self.folds}, split seed {self.split_seed}")
            splits = {"train": train, "test": test}
        train = splits["train"]
        val: TensorSplit | None
        if "val" in splits:
            val = splits["val"]
        elif self.val_fraction == 0:  # no validation split: the per-client protocol never validates
            val = None
        else:
            tr_idx, va_idx = stratified_split(
                train.labels.numpy(), [1 - self.val_fraction, self.val_fraction], self.split_seed
            )
            train, val = train.subset(torch.from_numpy(tr_idx)), train.subset(torch.from_numpy(va_idx))
        return train, val, splits["test"]

    def setup(self, stage: str | None = None) -> None:
        if getattr(self, "_is_setup", False):
            return
        self.fingerprint = self.source_fingerprint()
        train, val, test = self.load_splits()
        if self.max_train_samples:
            train = train.subset(torch.from_numpy(stratified_subset(train.labels.numpy(), self.max_train_samples, self.split_seed)))
        if self.max_test_samples:
            keep = self.max_test_samples
            if val is not None:
                val = val.subset(torch.from_numpy(stratified_subset(val.labels.numpy(), keep, self.split_seed)))
            test = test.subset(torch.from_numpy(stratified_subset(test.labels.numpy(), keep, self.split_seed)))
        for split_name, split in (("train", train), ("val", val), ("test", test)):
            if split is None:
                continue
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
