"""Tiny datasets written in each dataset's OFFICIAL archive layout, for the loader tests and the table smoke run.

Every image is one solid colour (or grey level) chosen by its label (and centre), so a test can read the
label back from the decoded pixels. ``build_data_home`` writes every dataset under one data home by the
names its archive unpacks to, as a user would after downloading them all (datamodules/data_home.py).
"""
from __future__ import annotations

import csv
import gzip
import json
import pickle
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image


# ---- colours that encode the label ------------------------------------------------------------------------
def colour(label: int) -> tuple[int, int, int]:
    """A distinct solid colour per class, so decoded pixels reveal the label they were stored under."""
    return (30 + 20 * label, 220 - 20 * label, 128)


def grey(label: int) -> tuple[int, int, int]:
    v = 30 + 20 * label
    return (v, v, v)


def isic_colour(label: int, centre: int) -> tuple[int, int, int]:
    return (20 + 28 * label, 30 + 35 * centre, 128)


def ich_grey(label: int) -> int:
    return 20 + 50 * label


def femnist_level(label: int) -> int:
    """The uint8 grey level of a FEMNIST fixture image of class ``label`` (0..61)."""
    return 10 + 3 * label


# ---- class folders --------------------------------------------------------------------------------------
KVASIR_DIRS = ["dyed-lifted-polyps", "dyed-resection-margins", "esophagitis", "normal-cecum",
               "normal-pylorus", "normal-z-line", "polyps", "ulcerative-colitis"]
KVASIR_SIZES = [(720, 576), (1280, 1024), (1920, 1072), (1350, 1080)]  # the archive ships these sizes mixed
OCT_DIRS = ["AMD", "CNV", "CSR", "DME", "DR", "DRUSEN", "MH", "NORMAL"]
CINIC_DIRS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
BT_DIRS = ["glioma_tumor", "meningioma_tumor", "no_tumor", "pituitary_tumor"]  # Bhuvaji et al. spelling
SC_DIRS = ["actinic keratosis", "basal cell carcinoma", "dermatofibroma", "melanoma", "nevus",
           "pigmented benign keratosis", "seborrheic keratosis", "squamous cell carcinoma", "vascular lesion"]
SC_WRAPPER = "Skin cancer ISIC The International Skin Imaging Collaboration"


def write_class_tree(base: Path, class_dirs: list[str], per_class: int, ext: str = "jpg", mode: str = "RGB",
                     sizes: Sequence[tuple[int, int]] = ((14, 10),)) -> None:
    """``base/<class>/img_<i>.<ext>``: solid images of the class's colour, sizes cycling through ``sizes``."""
    for label, name in enumerate(class_dirs):
        folder = base / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            value = colour(label) if mode == "RGB" else grey(label)[0]
            Image.new(mode, sizes[(label + i) % len(sizes)], value).save(folder / f"img_{i:03d}.{ext}")


def write_kvasir(base: Path, per_class: int) -> None:
    """kvasir-dataset-v2/<8 class folders>/*.jpg, mixed sizes, with the archive's debris."""
    write_class_tree(base, KVASIR_DIRS, per_class, sizes=KVASIR_SIZES)
    (base / ".DS_Store").write_bytes(b"\0")  # archive debris is ignored
    (base / "polyps" / "readme.txt").write_text("not an image")
    (base / "polyps" / "._img_000.jpg").write_bytes(b"\0\1")  # macOS resource fork


def write_oct(base: Path, counts: dict[str, int]) -> None:
    """OCT-C8: RetinalOCT_Dataset/RetinalOCT_Dataset/{train,val,test}/<8 classes>/*.jpg, greyscale."""
    inner = base / "RetinalOCT_Dataset" / "RetinalOCT_Dataset"
    for split, n in counts.items():
        write_class_tree(inner / split, OCT_DIRS, n, mode="L")


# ---- MedMNIST+ --------------------------------------------------------------------------------------------
def write_medmnist(path: Path, size: int, counts: dict[str, int], num_classes: int) -> None:
    arrays = {}
    for split, n in counts.items():
        labels = np.arange(n) % num_classes
        images = np.zeros((n, size, size, 3), dtype=np.uint8)
        images[:] = np.array([colour(int(y)) for y in labels], dtype=np.uint8)[:, None, None, :]
        arrays[f"{split}_images"], arrays[f"{split}_labels"] = images, labels[:, None].astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)


# ---- CIFAR pickles --------------------------------------------------------------------------------------
def cifar_rows(labels: np.ndarray) -> np.ndarray:
    """Rows as in the official pickles: 1024 red, then green, then blue values (row-major 32x32)."""
    planes = np.array([colour(int(y) % 10) for y in labels], dtype=np.uint8)  # [N, 3]
    return np.repeat(planes, 1024, axis=1)


def dump(path: Path, obj: dict) -> None:
    with open(path, "wb") as fh:
        pickle.dump({k.encode(): v for k, v in obj.items()}, fh, protocol=2)


def write_cifar10(base: Path, per_batch: int = 6) -> None:
    """cifar-10-batches-py/: data_batch_1..5, test_batch (one of each class), batches.meta."""
    base.mkdir(parents=True)
    for i in range(1, 6):
        labels = [(i + j) % 10 for j in range(per_batch)]
        dump(base / f"data_batch_{i}", {"data": cifar_rows(np.array(labels)), "labels": labels})
    dump(base / "test_batch", {"data": cifar_rows(np.arange(10)), "labels": list(range(10))})
    dump(base / "batches.meta", {"label_names": [n.encode() for n in CINIC_DIRS]})  # CIFAR-10's classes


def write_cifar100(base: Path, train_labels: np.ndarray, test_labels: np.ndarray) -> None:
    """cifar-100-python/: train, test (fine and coarse labels), meta."""
    from datamodules.cifar import CIFAR100_FINE

    base.mkdir(parents=True)
    for name, labels in (("train", train_labels), ("test", test_labels)):
        rows, fine, coarse = cifar_rows(labels), labels.tolist(), [0] * len(labels)
        dump(base / name, {"data": rows, "fine_labels": fine, "coarse_labels": coarse})
    dump(base / "meta", {"fine_label_names": [n.encode() for n in CIFAR100_FINE], "coarse_label_names": []})


# ---- FLamby Fed-ISIC2019 ----------------------------------------------------------------------------------
ISIC_CODES = ["MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC"]


def build_isic(root: Path, with_target: bool = True, folds: Sequence[str] = ("train", "train", "test"),
               ) -> list[tuple[str, int, int, str]]:
    """FLamby layout: 6 centres x 8 classes x one solid-colour JPEG per fold entry."""
    images = root / "ISIC_2019_Training_Input_preprocessed"
    images.mkdir(parents=True)
    rows = []
    for centre in range(6):
        for label in range(8):
            for i, fold in enumerate(folds):
                name = f"ISIC_{centre}{label}{i:05d}" + ("_downsampled" if centre == 4 else "")
                Image.new("RGB", (20, 14), isic_colour(label, centre)).save(images / f"{name}.jpg", quality=95)
                rows.append((name, label, centre, fold))
    header = ["image", *ISIC_CODES, "UNK"] + (["target"] if with_target else []) + ["center", "fold", "fold2"]
    with open(root / "train_test_split", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header if with_target else ["image", "center", "fold", "fold2"])
        for name, label, centre, fold in rows:
            onehot = [f"{float(i == label):.1f}" for i in range(8)] + ["0.0"]
            if with_target:
                w.writerow([name, *onehot, label, centre, fold, f"{fold}_{centre}"])
            else:
                w.writerow([name, centre, fold, f"{fold}_{centre}"])
    if not with_target:
        with open(root / "ISIC_2019_Training_GroundTruth.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["image", *ISIC_CODES, "UNK"])
            for name, label, _, _ in rows:
                w.writerow([name, *[f"{float(i == label):.1f}" for i in range(8)], "0.0"])
    return rows


# ---- RSNA-ICH ----------------------------------------------------------------------------------------------
ICH_SUBTYPES = ["epidural", "intraparenchymal", "intraventricular", "subarachnoid", "subdural"]


def build_rsna_csv(root: Path, slices: int = 60) -> dict[str, int]:
    """Kaggle label file + images/ID_<x>.png; returns the slices a loader must keep, with labels."""
    (root / "images").mkdir(parents=True)
    keep, rows = {}, []
    rng = np.random.default_rng(0)
    for i in range(slices):
        sid = f"ID_{i:09x}"
        kind = i % 6  # 0-4: single subtype, 5: alternately healthy / two subtypes
        positives = {kind} if kind < 5 else (set() if i % 12 == 5 else {1, 3})
        label = kind if kind < 5 else 0
        for s, name in enumerate(ICH_SUBTYPES):
            rows.append((f"{sid}_{name}", int(s in positives)))
        rows.append((f"{sid}_any", int(bool(positives))))
        arr = np.full((12, 12), ich_grey(label), dtype=np.uint16) * 257  # a 16-bit PNG, as windowed CT
        Image.fromarray(arr).save(root / "images" / f"{sid}.png")
        if len(positives) == 1:
            keep[sid] = kind
    rows += rows[:6]  # the stage-2 file repeats some slices
    rng.shuffle(rows)
    with open(root / "stage_2_train.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["ID", "Label"])
        w.writerows(rows)
    return keep


# ---- LEAF FEMNIST ----------------------------------------------------------------------------------------
def femnist_writers(num_small: int = 55, seed: int = 0) -> dict[str, list[int]]:
    """{writer id: labels}: ``num_small`` writers with 9 samples (3 classes x 3, so a per-client 80/20
    split has a test part), one with 149 samples (kept) and two with 150 and 212 (dropped: >= 150)."""
    rng = np.random.default_rng(seed)
    writers = {f"f{i:04d}_{i % 90:02d}": np.repeat(rng.choice(62, 3, replace=False), 3).tolist()
               for i in range(num_small)}
    for name, n in (("f3100_01", 149), ("f3101_02", 150), ("f3102_03", 212)):
        writers[name] = (np.arange(n) % 62).tolist()
    return writers


def write_leaf_femnist(data_dir: Path, writers: dict[str, list[int]], layout: str = "all_data",
                       per_file: int = 40) -> None:
    """LEAF's JSON files under ``data_dir`` (LEAF's data/femnist/data): ``all_data/all_data_<i>.json`` with
    at most ``per_file`` writers each, or (layout "sample") ``train/`` + ``test/`` files where every writer's
    samples are split between the two, as ``preprocess.sh -t sample`` writes them. Pixels are floats in
    [0, 1] (level / 255), each image one grey level encoding its label."""
    def blob(items: list[tuple[str, list[int]]]) -> dict:
        return {"users": [w for w, _ in items], "num_samples": [len(y) for _, y in items],
                "user_data": {w: {"x": [[femnist_level(c) / 255.0] * 784 for c in y], "y": y} for w, y in items}}

    items = sorted(writers.items())
    if layout == "all_data":
        files = {f"all_data/all_data_{k}.json": items[s:s + per_file]
                 for k, s in enumerate(range(0, len(items), per_file))}
    else:
        cut = [(w, len(y) * 9 // 10) for w, y in items]
        files = {"train/all_data_0_niid_0_keep_0_train_9.json": [(w, writers[w][:c]) for w, c in cut],
                 "test/all_data_0_niid_0_keep_0_test_9.json": [(w, writers[w][c:]) for w, c in cut]}
    for rel, chunk in files.items():
        (data_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (data_dir / rel).write_text(json.dumps(blob(chunk)))


# ---- Fashion-MNIST IDX -------------------------------------------------------------------------------------
def write_idx(path: Path, array: np.ndarray) -> None:
    """An unsigned-byte IDX file, gzipped (the layout of the official downloads)."""
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + array.astype(np.uint8).tobytes())


def write_fashion_mnist(base: Path, train: int, test: int) -> None:
    base.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", train), ("t10k", test)):
        labels = np.arange(n) % 10
        images = np.stack([np.full((28, 28), grey(int(y))[0]) for y in labels])
        write_idx(base / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(base / f"{prefix}-labels-idx1-ubyte.gz", labels)


def write_ich_split_file(path: Path, keep: dict[str, int], num_clients: int = 10) -> None:
    """FedNPR's notebooks' client split (ich_datasplit_10cl.npy): np.save of {"train"/"test": {client: {"image":
    ids, "label": labels}}} as object arrays. Each class's slices are dealt round-robin over the clients; a
    client's first slice of a class is its test slice, the later ones train."""
    folds: dict[str, list[dict[str, int]]] = {"train": [{} for _ in range(num_clients)],
                                              "test": [{} for _ in range(num_clients)]}
    for label in sorted(set(keep.values())):
        for j, sid in enumerate(s for s in sorted(keep) if keep[s] == label):
            folds["test" if j < num_clients else "train"][j % num_clients][sid] = label
    np.save(path, {fold: {c: {"image": np.array(list(ids), dtype=object),
                              "label": np.array(list(ids.values()), dtype=object)} for c, ids in enumerate(clients)}
                   for fold, clients in folds.items()}, allow_pickle=True)


REAL_SKIN_CLASSES = ["actinic keratosis", "basal cell carcinoma", "dermatofibroma", "melanoma", "nevus",
                     "pigmented benign keratosis", "vascular lesion"]
REAL_SKIN_CODES = ["akiec", "bcc", "df", "mel", "nv", "bkl", "vasc"]  # HAM10000's spelling (client_2)


def write_real_skin(base: Path, per_class: dict[str, int]) -> None:
    """FACMIC's RealSkin: client_0..client_2 (SC, ISIC 2019, HAM10000) and client_3 (the global test set),
    each with one folder per class; HAM10000's folders use its class codes."""
    for client, (name, n) in enumerate(per_class.items()):
        dirs = REAL_SKIN_CODES if name == "client_2" else REAL_SKIN_CLASSES
        for label, d in enumerate(dirs):
            folder = base / name / d
            folder.mkdir(parents=True)
            for i in range(n):
                Image.new("RGB", (20 + i, 16), (20 + 30 * label, 40 * client, 90)).save(
                    folder / f"ISIC_{client}{label}{i}.jpg")


# ---- one data home holding every dataset ---------------------------------------------------------------------
def build_data_home(home: Path) -> dict[str, Path]:
    """Every dataset of the suite under ``home`` by its archive name, sized so that every table config can
    run with 3 clients (natural partitions: their own sites); returns {dataset: its folder}."""
    out = {
        "kvasir": home / "kvasir-dataset-v2",
        "oct-c8": home / "OCT-C8",
        "ham10000": home / "dermamnist.npz",
        "pbc": home / "bloodmnist.npz",
        "fed-isic2019": home / "fed_isic2019",
        "rsna-ich": home / "rsna-intracranial-hemorrhage-detection",
        "brain-tumor": home / "brain-tumor-classification-mri",
        "skin-cancer": home / SC_WRAPPER,
        "cifar10": home / "cifar-10-batches-py",
        "cifar100": home / "cifar-100-python",
        "cinic10": home / "CINIC-10",
        "femnist": home / "femnist",
        "fashion-mnist": home / "fashion-mnist",
        "real-skin": home / "RealSkin",
    }
    write_kvasir(out["kvasir"], 12)
    write_oct(out["oct-c8"], {"train": 8, "val": 2, "test": 3})
    write_medmnist(out["ham10000"], 28, {"train": 84, "val": 14, "test": 21}, 7)
    write_medmnist(out["pbc"], 28, {"train": 96, "val": 16, "test": 24}, 8)
    build_isic(out["fed-isic2019"], folds=("train",) * 4 + ("test",))
    write_ich_split_file(out["rsna-ich"] / "ich_datasplit_10cl.npy", build_rsna_csv(out["rsna-ich"], slices=200))
    write_class_tree(out["brain-tumor"] / "Training", BT_DIRS, 12, sizes=((512, 512), (236, 213), (630, 630)))
    write_class_tree(out["brain-tumor"] / "Testing", BT_DIRS, 3, sizes=((512, 512),))
    write_class_tree(out["skin-cancer"] / "Train", SC_DIRS, 10, sizes=((600, 450), (1024, 768)))
    write_real_skin(out["real-skin"], {"client_0": 6, "client_1": 6, "client_2": 6, "client_3": 3})
    # BT2 (FACMIC Table 5's test dataset, data.test_root brain-tumor-bt2): another brain-tumor set, not a dataset name
    write_class_tree(home / "brain-tumor-bt2" / "Training", BT_DIRS, 10, sizes=((512, 512), (256, 256)))
    write_class_tree(home / "brain-tumor-bt2" / "Testing", BT_DIRS, 2, sizes=((512, 512),))
    write_class_tree(out["skin-cancer"] / "Test", SC_DIRS, 2, sizes=((600, 450),))
    write_cifar10(out["cifar10"], per_batch=40)  # 20 images per class: shards-10 over 10 clients cuts every class into 10
    write_cifar100(out["cifar100"], np.arange(500) % 100, np.arange(100))
    for split, n in (("train", 10), ("valid", 2), ("test", 3)):
        write_class_tree(out["cinic10"] / split, CINIC_DIRS, n, ext="png", sizes=((32, 32),))
    write_leaf_femnist(out["femnist"] / "data", femnist_writers())
    write_fashion_mnist(out["fashion-mnist"], 300, 100)
    return out
