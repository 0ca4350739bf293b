"""OCT-C8: 24,000 retinal OCT scans, 8 classes, official train/val/test folders (FedBM / FedCB)."""
from __future__ import annotations

from typing import ClassVar

from datamodules.base import DATASETS
from datamodules.class_folder import ClassFolderDataset


@DATASETS.register("oct-c8")
class OCTC8(ClassFolderDataset):
    """OCT-C8 read from ``train/``, ``val/`` and ``test/``, each with the 8 class folders.

    The archive nests them in wrapper folders (``RetinalOCT_Dataset/RetinalOCT_Dataset/``);
    those are found automatically. The greyscale scans are converted to RGB (3 channels), as the
    papers' ImageNet-style ResNet-18 expects.
    """

    class_dirs: ClassVar[list[str]] = ["AMD", "CNV", "CSR", "DME", "DR", "DRUSEN", "MH", "NORMAL"]
    # concept names in label order; the FedBM code swaps DR and MH by mistake, we do not
    class_names: ClassVar[list[str]] = [
        "Age-related macular degeneration", "Choroidal neovascularization", "Central serous retinopathy",
        "Diabetic macular edema", "Diabetic retinopathy", "Choroidal drusen", "Macular hole", "Normal retina",
    ]
    home_entries = ("OCT-C8", "RetinalOCT_Dataset", "oct-c8")
    in_channels = 3
    default_image_size = 128
    mean = (0.485, 0.456, 0.406)  # ImageNet statistics, as in the FedBM protocol
    std = (0.229, 0.224, 0.225)
    download_hint = (
        "Download the Kaggle dataset 'Retinal OCT Images (OCT-C8)' "
        "(kaggle datasets download -d obulisainaren/retinal-oct-c8) and unzip it into <data home>/OCT-C8/, "
        "so that train/, val/ and test/ folders (possibly inside RetinalOCT_Dataset/RetinalOCT_Dataset/) "
        "each hold the 8 class folders AMD, CNV, CSR, DME, DR, DRUSEN, MH, NORMAL."
    )
