"""Where each dataset comes from: the table `fedbench data get` reads (bench/commands/download.py).

A *fetchable* dataset lists its files (URLs, the checksums recorded for them, and where each checksum was
published) and how they unpack into the data home, in the layout its loader reads. A *manual* dataset
(behind a registration, a licence to accept, or a build script) lists the exact steps instead.

Checksums. ``sha256`` is recorded only where a value has been published for the very file (the
provenance says where); ``md5`` is the value the dataset's authors publish. Every recorded value is
checked. Where no SHA-256 is published, the first download that passes the recorded MD5 (or, with no
published checksum at all, the first download that unpacks into the expected layout) records its
SHA-256 in the data home (``.fedbench-checksums.json``: trust on first use), and every later download
into that data home is checked against it. Nothing here is computed by this project: no SHA-256 is
invented.

The name a fetchable dataset unpacks to (``target``) is the first of its data module's ``home_entries``
(tests/commands/test_data_get.py checks the two tables agree).
"""
from __future__ import annotations

from dataclasses import dataclass

KAGGLE_TOKEN = ("Create a Kaggle account and an API token (https://www.kaggle.com/settings, 'API' > 'Create New "
                "Token'), save it as ~/.kaggle/kaggle.json (chmod 600), and install the client: pip install kaggle")


@dataclass(frozen=True)
class RemoteFile:
    """One file to download: its name (kept by a ``--mirror``), the URLs tried in order, its checksums."""

    name: str
    urls: tuple[str, ...]
    sha256: str | None = None
    md5: str | None = None
    size: int | None = None  # bytes, where published
    provenance: str = ""  # where the recorded checksums were published


@dataclass(frozen=True)
class Source:
    """How a dataset gets into the data home.

    ``layout``: ``zip`` / ``tar`` (an archive; ``archive_root`` is the folder in it that becomes
    ``<home>/<target>``, None when the archive's top level is the dataset itself), ``file`` (the one file
    becomes ``<home>/<target>``) or ``folder`` (the files go into ``<home>/<target>/``). ``expect``: paths
    (relative to ``<home>/<target>``) that must exist after unpacking. ``steps``: a manual dataset's
    instructions, ``{home}`` standing for the data home.
    """

    dataset: str
    target: str
    licence: str
    homepage: str
    files: tuple[RemoteFile, ...] = ()
    layout: str = "manual"
    archive_root: str | None = None
    expect: tuple[str, ...] = ()
    steps: tuple[str, ...] = ()

    @property
    def fetchable(self) -> bool:
        return bool(self.files)


TORONTO = ("https://www.cs.toronto.edu/~kriz/", "https://cave.cs.toronto.edu/kriz/")
CIFAR_PROVENANCE = ("MD5: the authors' page https://www.cs.toronto.edu/~kriz/cifar.html; SHA-256: keras "
                    "(keras-team/keras, keras/src/datasets/{cifar10,cifar100}.py, file_hash) and torchvision "
                    "(pytorch/vision, torchvision/prototype/datasets/_builtin/cifar.py, _SHA256) agree")
FMNIST_BASE = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
FMNIST_PROVENANCE = ("MD5: the authors' README (zalandoresearch/fashion-mnist, b2617bb); SHA-256: torchvision "
                     "(pytorch/vision, torchvision/prototype/datasets/_builtin/mnist.py, FashionMNIST._CHECKSUMS)")
FMNIST = {  # file: (sha256, md5)
    "train-images-idx3-ubyte.gz": ("3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
                                   "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
    "train-labels-idx1-ubyte.gz": ("a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
                                   "25c81989df183df01b3e8a0aad5dffbe"),
    "t10k-images-idx3-ubyte.gz": ("346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
                                  "bef4ecab320f06d8554ea6380940ec79"),
    "t10k-labels-idx1-ubyte.gz": ("67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
                                  "bb300cfdad3c16e7a12a480ee83cd310"),
}
MEDMNIST_PROVENANCE = ("MD5: the authors' medmnist package (MedMNIST/MedMNIST 805b742, medmnist/info.py, MD5_128); "
                       "no SHA-256 published (recorded in the data home at first download)")
MEDMNIST_RECORD = "https://zenodo.org/records/10519652/files/"
KVASIR_CLASSES = ("dyed-lifted-polyps", "dyed-resection-margins", "esophagitis", "normal-cecum", "normal-pylorus",
                  "normal-z-line", "polyps", "ulcerative-colitis")
MEDMNIST_LICENCE = "MedMNIST+ (Yang et al., Scientific Data 2023): {}; cite MedMNIST v2 and the source dataset"


def medmnist(dataset: str, flag: str, md5: str, licence: str) -> Source:
    name = f"{flag}_128.npz"  # the loader's default image size (128) without resizing
    return Source(dataset, name, MEDMNIST_LICENCE.format(licence), "https://medmnist.com", layout="file",
                  files=(RemoteFile(name, (f"{MEDMNIST_RECORD}{name}?download=1",), md5=md5,
                                    provenance=MEDMNIST_PROVENANCE),))


def kaggle(dataset: str, target: str, slug: str, into: str) -> Source:
    """A public Kaggle dataset: it needs a Kaggle account (an API token), so it is fetched by hand."""
    return Source(dataset, target, f"as stated on https://www.kaggle.com/datasets/{slug}",
                  f"https://www.kaggle.com/datasets/{slug}", steps=(
                      KAGGLE_TOKEN,
                      f'kaggle datasets download -d {slug} -p "{into}" --unzip',
                      f"fedbench data get {dataset}   # says 'present' once the loader finds it"))


SOURCE_LIST = (
    Source("kvasir", "kvasir-dataset-v2",
           "the terms of use on https://datasets.simula.no/kvasir/; cite Pogorelov et al., MMSys 2017",
           "https://datasets.simula.no/kvasir/", layout="zip", archive_root="kvasir-dataset-v2", expect=KVASIR_CLASSES,
           files=(RemoteFile("kvasir-dataset-v2.zip", ("https://datasets.simula.no/downloads/kvasir/kvasir-dataset-v2.zip",),
                             provenance="no checksum published by Simula: SHA-256 recorded in the data home at first "
                                        "download"),)),
    Source("cifar10", "cifar-10-batches-py", "no licence stated; cite Krizhevsky, 2009 (tech report)",
           "https://www.cs.toronto.edu/~kriz/cifar.html", layout="tar", archive_root="cifar-10-batches-py",
           expect=("data_batch_1", "data_batch_5", "test_batch", "batches.meta"),
           files=(RemoteFile("cifar-10-python.tar.gz", tuple(u + "cifar-10-python.tar.gz" for u in TORONTO),
                             sha256="6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
                             md5="c58f30108f718f92721af3b95e74349a", size=170498071, provenance=CIFAR_PROVENANCE),)),
    Source("cifar100", "cifar-100-python", "no licence stated; cite Krizhevsky, 2009 (tech report)",
           "https://www.cs.toronto.edu/~kriz/cifar.html", layout="tar", archive_root="cifar-100-python",
           expect=("train", "test", "meta"),
           files=(RemoteFile("cifar-100-python.tar.gz", tuple(u + "cifar-100-python.tar.gz" for u in TORONTO),
                             sha256="85cd44d02ba6437773c5bbd22e183051d648de2e7d6b014e1ef29b855ba677a7",
                             md5="eb9058c3a382ffc7106e4002c42a8d85", provenance=CIFAR_PROVENANCE),)),
    Source("cinic10", "CINIC-10",
           "cite Darlow et al., 2018 (arXiv:1810.03505); its images come from ImageNet and CIFAR-10, whose terms apply",
           "https://github.com/BayesWatch/cinic-10", layout="tar", archive_root=None, expect=("train", "valid", "test"),
           files=(RemoteFile("CINIC-10.tar.gz", ("https://datashare.ed.ac.uk/bitstream/handle/10283/3192/CINIC-10.tar.gz",),
                             provenance="no checksum recorded here: SHA-256 recorded in the data home at first "
                                        "download"),)),
    Source("fashion-mnist", "fashion-mnist", "MIT (Zalando SE); cite Xiao et al., 2017",
           "https://github.com/zalandoresearch/fashion-mnist", layout="folder", expect=tuple(FMNIST),
           files=tuple(RemoteFile(name, (FMNIST_BASE + name,), sha256=sha, md5=md5, provenance=FMNIST_PROVENANCE)
                       for name, (sha, md5) in FMNIST.items())),
    medmnist("ham10000", "dermamnist", "2defd784463fa5243564e855ed717de1", "DermaMNIST is CC BY-NC 4.0"),
    medmnist("pbc", "bloodmnist", "adace1e0ed228fccda1f39692059dd4c", "BloodMNIST is CC BY 4.0"),
    kaggle("oct-c8", "OCT-C8", "obulisainaren/retinal-oct-c8", "{home}/OCT-C8"),
    kaggle("brain-tumor", "brain-tumor-classification-mri", "sartajbhuvaji/brain-tumor-classification-mri",
           "{home}/brain-tumor-classification-mri"),
    kaggle("skin-cancer", "Skin cancer ISIC The International Skin Imaging Collaboration",
           "nodoubttome/skin-cancer9-classesisic", "{home}"),
    Source("rsna-ich", "rsna-intracranial-hemorrhage-detection",
           "the competition's rules (non-commercial research); accept them on Kaggle first",
           "https://www.kaggle.com/competitions/rsna-intracranial-hemorrhage-detection", steps=(
               KAGGLE_TOKEN,
               "Accept the rules at https://www.kaggle.com/competitions/rsna-intracranial-hemorrhage-detection/rules",
               ('kaggle competitions download -c rsna-intracranial-hemorrhage-detection -p "{home}/rsna-download" '
               '&& unzip -q "{home}/rsna-download/*.zip" -d "{home}/rsna-download"'),
               ("Window every DICOM slice of stage_2_train/ (brain window) and save it as "
               '"{home}/rsna-intracranial-hemorrhage-detection/images/ID_<slice>.png"; copy stage_2_train.csv to '
               '"{home}/rsna-intracranial-hemorrhage-detection/"'),
               ("For FedNPR's clients: download ich_datasplit_10cl.npy from https://github.com/Jwicaksana/FedNPR into "
               '"{home}/rsna-intracranial-hemorrhage-detection/"'))),
    Source("fed-isic2019", "fed_isic2019",
           "ISIC 2019 (CC BY-NC 4.0) and HAM10000 (CC BY-NC 4.0): accepted when running FLamby's download script",
           "https://github.com/owkin/FLamby", steps=(
               "git clone https://github.com/owkin/FLamby && pip install -e 'FLamby[isic2019]'",
               "cd FLamby/flamby/datasets/fed_isic2019/dataset_creation_scripts",
               'python download_isic.py --output-folder "{home}/fed_isic2019"   # asks you to accept the licences',
               "python resize_images.py",
               'cp train_test_split "{home}/fed_isic2019/"')),
    Source("femnist", "femnist", "LEAF (BSD-2-Clause) over NIST Special Database 19",
           "https://github.com/TalwalkarLab/leaf", steps=(
               "git clone https://github.com/TalwalkarLab/leaf && cd leaf/data/femnist && ./preprocess.sh",
               'cp -r ../femnist "{home}/femnist"   # so that {home}/femnist/data/all_data/all_data_0.json exists')),
    Source("real-skin", "RealSkin", "those of its three sources (Kaggle ISIC skin cancer, ISIC 2019, HAM10000)",
           "https://github.com/AIPMLab/FACMIC", steps=(
               ("Build FACMIC's RealSkin folders as its README ('dataset') describes, under \"{home}/RealSkin/\": "
               "client_0..client_2 (the three sources) and client_3 (the global test set), one folder per class"),)),
)
SOURCES = {s.dataset: s for s in SOURCE_LIST}
