"""Datasets stored as class folders: a generic loader plus CINIC-10, brain tumour MRI and ISIC skin cancer.

Two layouts are read:

* split folders: ``<root>/train/<class>/*``, ``<root>/test/<class>/*`` and optionally
  ``<root>/val/<class>/*`` (``Train``/``Training``, ``valid``/``validation``, ``Test``/``Testing``
  are accepted too); without a val folder, ``setup`` carves one from train;
* flat (generic ``class-folder`` only): ``<root>/<class>/*``, split 7:1:2 (train/val/test),
  stratified, with a fixed seed so that every run (and the cache) sees the same split.

Named datasets fix their class folders and class names (the concepts fed to language models);
the generic ``class-folder`` dataset takes its classes from the folder names, sorted.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import torch

from bench.core.errors import DatasetNotFoundError, FedbenchWarning
from datamodules.base import DATASETS, FederatedDataModule
from datamodules.image_files import (
    FolderSpec,
    ScanLog,
    _visible,
    decode_image_files,
    find_dir_with,
    list_subfolders,
    resolve_folder,
    scan_class_folders,
)
from datamodules.splits import stratified_split
from datamodules.tensors import TensorSplit

SPLIT_DIRS: dict[str, tuple[str, ...]] = {
    "train": ("train", "Train", "Training", "training", "TRAIN"),
    "val": ("val", "Val", "valid", "Valid", "validation", "Validation", "VAL"),
    "test": ("test", "Test", "Testing", "testing", "TEST"),
}
FLAT_SPLIT = (0.7, 0.1, 0.2)
FLAT_SPLIT_SEED = 0


class ClassFolderDataset(FederatedDataModule):
    """Base of the class-folder datasets (not registered itself).

    Subclasses set ``class_dirs`` (one folder name, or alternative names, per label, in label
    order) and ``class_names``. ``search_depth`` says how many wrapper folders the archive may
    add above the split folders.
    """

    class_dirs: ClassVar[Sequence[FolderSpec]]
    split_dirs: ClassVar[dict[str, tuple[str, ...]]] = SPLIT_DIRS
    search_depth: ClassVar[int] = 2
    allow_flat: ClassVar[bool] = False
    recursive: ClassVar[bool] = False  # read a class folder's sub-folders too (the generic dataset does)

    def folder_specs(self) -> Sequence[FolderSpec]:
        """The class folders in label order (the generic dataset discovers them)."""
        return self.class_dirs

    def split_root(self, root: Path) -> Path | None:
        """The folder holding the train and test folders, or None (flat layout / not found)."""
        return find_dir_with(root, [self.split_dirs["train"], self.split_dirs["test"]], self.search_depth)

    def _missing_splits_error(self, root: Path) -> DatasetNotFoundError:
        train, test = self.split_dirs["train"][0], self.split_dirs["test"][0]
        return DatasetNotFoundError(
            f"Dataset {self.name!r}: no '{train}/' and '{test}/' folders (each with one folder per class) "
            f"found under '{root}'. {self.download_hint} {self.root_hint()}"
        )

    def decode(self) -> dict[str, TensorSplit]:
        root = self.require_root()
        base = self.split_root(root)
        specs = self.folder_specs()
        log = ScanLog()
        if base is None:
            if not self.allow_flat:
                raise self._missing_splits_error(root)
            self.check_strays(root, specs, "", log)
            paths, labels = scan_class_folders(root, specs, dataset=self.name, hint=self.download_hint,
                                               recursive=self.recursive, log=log)
            images = decode_image_files(
                paths, self.image_size, self.in_channels, desc=f"decoding {self.name}"
            )
            labels_t = torch.from_numpy(labels)
            parts = stratified_split(labels, list(FLAT_SPLIT), FLAT_SPLIT_SEED)
            out = {
                name: TensorSplit(images[torch.from_numpy(idx)], labels_t[torch.from_numpy(idx)])
                for name, idx in zip(("train", "val", "test"), parts, strict=True)
            }
        else:
            out = self.decode_splits(base, specs, log)
        line = log.summary(self.name, root, sum(len(split) for split in out.values()))
        if line:
            warnings.warn(line, FedbenchWarning, stacklevel=2)
        return out

    def decode_splits(self, base: Path, specs: Sequence[FolderSpec], log: ScanLog) -> dict[str, TensorSplit]:
        """The split layout: every split folder present, its class folders read in label order."""
        out: dict[str, TensorSplit] = {}
        split_names = {n for names in self.split_dirs.values() for n in names}
        log.ignored += [f"{e}{'/' if e.is_dir() else ''}" for e in sorted(base.iterdir())
                        if e.name not in split_names and _visible(e)]
        for split, names in self.split_dirs.items():
            folder = resolve_folder(base, names)
            if folder is None:  # only val may be absent: train and test located the base
                continue
            self.check_strays(folder, specs, split, log)
            paths, labels = scan_class_folders(folder, specs, dataset=self.name, hint=self.download_hint,
                                               recursive=self.recursive, log=log)
            images = decode_image_files(
                paths, self.image_size, self.in_channels, desc=f"decoding {self.name} {split}"
            )
            out[split] = TensorSplit(images, torch.from_numpy(labels))
        return out

    def check_strays(self, folder: Path, specs: Sequence[FolderSpec], split: str, log: ScanLog) -> None:
        """Entries of a split folder (or of the root, flat) that are no class folder: logged as ignored."""
        known = {n for spec in specs for n in ((spec,) if isinstance(spec, str) else spec)}
        log.ignored += [f"{e}{'/' if e.is_dir() else ''}" for e in sorted(folder.iterdir())
                        if e.name not in known and _visible(e)]


@DATASETS.register("class-folder")
class ClassFolder(ClassFolderDataset):
    """Any dataset of class folders (see the module docstring for the two layouts).

    ``class_names`` is an instance attribute read from the files: the sorted names of the class
    folders (of ``train/`` in the split layout, of the root in the flat layout), so label ``i``
    is the i-th folder name in sorted order. Name the folders after the concepts (for example
    ``basal cell carcinoma``) when a method feeds class names to a language model.
    """

    search_depth = 0
    allow_flat = True
    recursive = True  # images in sub-folders of a class folder belong to it (torchvision's ImageFolder)
    decode_version = 2  # 2: sub-folders of a class folder read (1 dropped them): caches of 1 are re-decoded
    in_channels = 3
    default_image_size = 224
    mean = (0.485, 0.456, 0.406)  # ImageNet statistics (pretrained backbones)
    std = (0.229, 0.224, 0.225)
    download_hint = (
        "Put the images in one folder per class, either <root>/train/<class>/*.jpg and "
        "<root>/test/<class>/*.jpg (optionally <root>/val/<class>/*.jpg), or <root>/<class>/*.jpg "
        "(then split 7:1:2 with a fixed seed); .jpg, .jpeg, .png, .bmp and .tif files are read."
    )

    @property  # type: ignore[override]
    def class_names(self) -> list[str]:
        if getattr(self, "_class_names", None) is None:
            root = self.require_root()
            base = self.split_root(root)
            if base is None and any((root / n).is_dir() for names in self.split_dirs.values() for n in names):
                raise self._missing_splits_error(root)
            classes = list_subfolders(resolve_folder(base, self.split_dirs["train"]) if base else root)
            if not classes:
                raise DatasetNotFoundError(
                    f"Dataset {self.name!r}: no class folders under '{base or root}'. {self.download_hint}"
                )
            self._class_names = classes
        return list(self._class_names)

    def folder_specs(self) -> Sequence[FolderSpec]:
        return self.class_names

    def check_strays(self, folder: Path, specs: Sequence[FolderSpec], split: str, log: ScanLog) -> None:
        """The classes are train/'s folders: a class folder only in test/ or val/ is an error (never learnt,
        it could only be predicted wrong); stray files are logged as for any dataset."""
        extra = [e.name for e in sorted(folder.iterdir()) if e.is_dir() and _visible(e) and e.name not in specs]
        if split in ("test", "val") and extra:
            train = resolve_folder(folder.parent, self.split_dirs["train"])
            raise DatasetNotFoundError(
                f"Dataset {self.name!r}: class folder(s) {extra} in '{folder}' have no folder in '{train}' (the "
                f"classes are train/'s folders: {list(specs)}); a class absent from training can never be predicted. "
                f"Add its training images under '{train}', or move it out of '{folder}'.")
        super().check_strays(folder, specs, split, log)

    def cache_key(self) -> str:
        """The folder names are part of the key: adding or renaming a class re-decodes."""
        return f"{super().cache_key()}|{'/'.join(self.class_names)}"


@DATASETS.register("cinic10")
class CINIC10(ClassFolderDataset):
    """CINIC-10: 270,000 32x32 images (CIFAR-10 + downsampled ImageNet) in train/valid/test."""

    class_dirs: ClassVar[list[FolderSpec]] = [
        "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
    ]
    class_names: ClassVar[list[str]] = [str(d) for d in class_dirs]
    home_entries = ("CINIC-10", "cinic-10", "cinic10")
    in_channels = 3
    default_image_size = 32
    mean = (0.4789, 0.4723, 0.4305)  # published CINIC-10 statistics
    std = (0.2421, 0.2383, 0.2587)
    download_hint = (
        "Download CINIC-10.tar.gz from https://datashare.ed.ac.uk/handle/10283/3192 and unpack it "
        "into <data home>/CINIC-10/, so that its train/, valid/ and test/ folders each hold the "
        "10 class folders."
    )


@DATASETS.register("brain-tumor")
class BrainTumor(ClassFolderDataset):
    """BT, the brain tumour MRI dataset of FACMIC: 4 classes in Training/ and Testing/.

    Both Kaggle releases are read: Bhuvaji et al. (the paper's BT, folders ``glioma_tumor``,
    ``meningioma_tumor``, ``no_tumor``, ``pituitary_tumor``; 2,870 train / 394 test) and
    Nickparvar's (BT2, folders ``glioma``, ``meningioma``, ``notumor``, ``pituitary``).
    """

    class_dirs: ClassVar[list[FolderSpec]] = [
        ("glioma", "glioma_tumor"), ("meningioma", "meningioma_tumor"),
        ("notumor", "no_tumor"), ("pituitary", "pituitary_tumor"),
    ]
    class_names: ClassVar[list[str]] = ["glioma tumor", "meningioma tumor", "no tumor", "pituitary tumor"]
    home_entries = ("brain-tumor-classification-mri", "brain-tumor-mri-dataset", "brain-tumor")
    in_channels = 3
    default_image_size = 224
    mean = (0.485, 0.456, 0.406)  # ImageNet statistics (CLIP-style pretrained encoders)
    std = (0.229, 0.224, 0.225)
    download_hint = (
        "Download the Kaggle dataset 'Brain Tumor Classification (MRI)' "
        "(kaggle datasets download -d sartajbhuvaji/brain-tumor-classification-mri; or Nickparvar's "
        "'Brain Tumor MRI Dataset', masoudnickparvar/brain-tumor-mri-dataset) and unzip it into "
        "<data home>/brain-tumor-classification-mri/, so that its Training/<class>/ and Testing/<class>/ exist "
        "for the 4 classes "
        "(glioma, meningioma, notumor, pituitary; the *_tumor spellings work too)."
    )


@DATASETS.register("skin-cancer")
class SkinCancer(ClassFolderDataset):
    """SC, the 9-class ISIC skin cancer dataset of FACMIC (Kaggle, Katanskiy) in Train/ and Test/."""

    class_dirs: ClassVar[list[FolderSpec]] = [
        "actinic keratosis", "basal cell carcinoma", "dermatofibroma", "melanoma", "nevus",
        "pigmented benign keratosis", "seborrheic keratosis", "squamous cell carcinoma", "vascular lesion",
    ]
    class_names: ClassVar[list[str]] = [str(d) for d in class_dirs]
    home_entries = ("Skin cancer ISIC The International Skin Imaging Collaboration", "skin-cancer9-classesisic",
                    "skin-cancer")
    in_channels = 3
    default_image_size = 224
    mean = (0.485, 0.456, 0.406)  # ImageNet statistics (CLIP-style pretrained encoders)
    std = (0.229, 0.224, 0.225)
    download_hint = (
        "Download the Kaggle dataset 'Skin Cancer ISIC The International Skin Imaging Collaboration' "
        "(kaggle datasets download -d nodoubttome/skin-cancer9-classesisic) and unzip it into the data "
        "home; its folder 'Skin cancer ISIC The International Skin Imaging Collaboration' holds Train/ and "
        "Test/, each with the 9 class folders (actinic keratosis, ..., vascular lesion)."
    )
