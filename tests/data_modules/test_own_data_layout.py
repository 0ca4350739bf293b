"""Issue 38.7: your own class folders, read as you laid them out. Images in sub-folders of a class folder
belong to that class (torchvision's ImageFolder reads them too); a class folder only in test/ (or val/)
is one error; everything skipped (files that are not images, hidden files, entries outside the class
folders) is named in one summary line."""
from __future__ import annotations

import warnings

import pytest
import torch
from official_layouts import colour, write_class_tree

from bench.cli import main
from bench.core.errors import DatasetNotFoundError, FedbenchWarning
from datamodules.base import DATASETS


def setup(root, tmp_path):
    dm = DATASETS.get("class-folder")(root=str(root), cache_dir=str(tmp_path / "cache"), image_size=8,
                                      val_fraction=0.25)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dm.setup()
    return dm, [str(w.message) for w in caught if issubclass(w.category, FedbenchWarning)]


def build(root, nested: bool = True):
    """train/a: 3 images + 5 in a/scans/day1 (colour of label 0); train/b: 4; test/a, test/b: 2 each."""
    write_class_tree(root / "train", ["a", "b"], per_class=4)
    if nested:
        write_class_tree(root / "train" / "a" / "scans", ["day1"], per_class=5)  # label 0's colour
    write_class_tree(root / "test", ["a", "b"], per_class=2)


def test_images_in_sub_folders_of_a_class_are_read_as_that_class(tmp_path):
    build(tmp_path / "own")
    dm, said = setup(tmp_path / "own", tmp_path)
    labels = torch.cat([dm.train.labels, dm.val.labels])
    assert (labels == 0).sum().item() == 9 and (labels == 1).sum().item() == 4  # 4 + 5 nested; 4
    images = torch.cat([dm.train.images, dm.val.images]).float().mean(dim=(2, 3))
    for label in (0, 1):  # every nested image is labelled as its class folder
        assert torch.allclose(images[labels == label], torch.tensor(colour(label), dtype=torch.float), atol=4)
    assert said == [(f"Dataset 'class-folder' at '{tmp_path / 'own'}': read 17 images; 5 of them from sub-folders "
                    "of a class folder.")]


def test_a_plain_layout_says_nothing_and_reads_what_it_read_before(tmp_path):
    build(tmp_path / "own", nested=False)
    dm, said = setup(tmp_path / "own", tmp_path)
    assert said == [] and len(dm.train) + len(dm.val) == 8 and dm.test.labels.tolist() == [0, 0, 1, 1]


def test_every_skipped_file_is_in_one_summary_line(tmp_path):
    root = tmp_path / "own"
    build(root, nested=False)
    (root / "train" / "a" / "notes.txt").write_text("x")
    (root / "train" / "b" / "Thumbs.db").write_bytes(b"x")
    (root / "test" / "b" / "scan.dcm").write_bytes(b"x")
    (root / "train" / "a" / ".DS_Store").write_bytes(b"x")
    (root / "README.md").write_text("my data")
    (root / "train" / "labels.csv").write_text("x")
    dm, said = setup(root, tmp_path)
    assert len(dm.train) + len(dm.val) == 8
    assert said == [(f"Dataset 'class-folder' at '{root}': read 12 images; skipped 3 file(s) that are not images "
                    "(1 .db, 1 .dcm, 1 .txt; read: .bmp, .jpeg, .jpg, .png, .tif, .tiff); skipped 1 hidden file(s) "
                    f"or folder(s) (.*, __MACOSX); left out 2 entries that are no class folder or image: {root / 'README.md'}, "
                    f"{root / 'train' / 'labels.csv'}.")]


@pytest.mark.parametrize("split", ["test", "val"])
def test_a_class_only_in_test_or_val_is_one_error(tmp_path, capsys, split):
    root = tmp_path / "own"
    build(root, nested=False)
    write_class_tree(root / split, ["a", "b", "c"], per_class=2)
    with pytest.raises(DatasetNotFoundError) as info:
        setup(root, tmp_path)
    assert str(info.value) == (
        f"Dataset 'class-folder': class folder(s) ['c'] in '{root / split}' have no folder in '{root / 'train'}' "
        "(the classes are train/'s folders: ['a', 'b']); a class absent from training can never be predicted. "
        f"Add its training images under '{root / 'train'}', or move it out of '{root / split}'.")
    assert main(["run", "--data.name", "class-folder", "--data.root", str(root), "--data.image_size", "8",
                 "--data.cache_dir", str(tmp_path / "cache"), "--output_dir", str(tmp_path / "runs"),
                 "--fed.rounds", "1", "--partition.num_clients", "2", "--accelerator", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("fedbench: error") == 1 and "class folder(s) ['c'] in" in err and "Traceback" not in err


def test_a_link_loop_or_a_dangling_link_in_a_class_folder_is_named_not_followed_forever(tmp_path):
    root = tmp_path / "own"
    build(root, nested=False)
    (root / "train" / "a" / "again").symlink_to(root / "train" / "a")  # a loop
    (root / "train" / "b" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")  # dangling
    dm, said = setup(root, tmp_path)
    assert len(dm.train) + len(dm.val) == 8
    assert said == [(f"Dataset 'class-folder' at '{root}': read 12 images; left out 2 entries that are no class "
                     f"folder or image: {root / 'train' / 'a' / 'again'}/ (a link to a folder already read), "
                     f"{root / 'train' / 'b' / 'gone.jpg'} (not a readable file).")]
