"""Issue 38.6: values that passed validation and then failed (a traceback, a 40 TB allocation, 64 ranks on
2 cores) are one clear error each, before any work: no Fabric is made, no data decoded, nothing written."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from official_layouts import write_class_tree
from test_table_checks import GOOD, table

import bench.assembly.experiment as E
from bench.cli import main
from bench.core.errors import FedbenchError


@pytest.fixture
def no_work(monkeypatch):
    """Starting ranks or decoding data fails the test: every refusal must come before them."""
    def started(*args, **kwargs):
        raise AssertionError("work started before the bad value was refused")

    monkeypatch.setattr(E, "make_fabric", started)
    monkeypatch.setattr(E, "setup_datamodule", started)


def run(tmp_path, *options: str) -> list[str]:
    return ["run", "--fed.rounds", "1", "--accelerator", "cpu", "--output_dir", str(tmp_path / "runs"),
            "--data.cache_dir", str(tmp_path / "cache"), *options]


def one_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("fedbench: error") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("seeds", [[], None, [-1], [0, 0], ["0"], "0"])
def test_table_seeds_must_name_at_least_one_seed(tmp_path, capsys, seeds):
    argv = table(tmp_path, GOOD[:1])
    config = Path(argv[2])
    spec = yaml.safe_load(config.read_text())
    if seeds is None:
        del spec["seeds"]
    else:
        spec["seeds"] = seeds
    config.write_text(yaml.safe_dump(spec))
    for mode in ([], ["--render-only"]):
        assert main([*argv, *mode]) == 2
        assert (f"t.yaml: seeds must list at least one seed, whole numbers >= 0 without repeats (e.g. seeds: "
                f"[0, 1, 2]), got {seeds!r}." in one_error(capsys))
    assert not (tmp_path / "tables").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("dataset", ["class-folder", "fashion-mnist", "kvasir"])
@pytest.mark.parametrize("option", ["--data.root", "--data.test_root"])
def test_a_data_root_that_is_a_file_is_one_error(tmp_path, capsys, no_work, dataset, option):
    afile = tmp_path / "images.zip"
    afile.write_bytes(b"PK\x03\x04")
    extra = ["--data.test_dataset", dataset] if option == "--data.test_root" else []
    assert main(run(tmp_path, "--data.name", dataset, option, str(afile), *extra)) == 2
    assert (f"{option[2:]} '{afile}' is a file, not a folder: pass the folder that holds the dataset (where its "
            "archive unpacks), e.g. the file's parent folder." in one_error(capsys))


def test_an_image_size_no_batch_fits_in_memory_is_refused_before_decoding(tmp_path, capsys, no_work):
    assert main(run(tmp_path, "--data.name", "digits", "--data.image_size", "100000")) == 2
    err = one_error(capsys)
    assert "data.image_size 100000: one training batch of 32 images at 100000x100000 takes 1.3 TB as float32, " \
           "more than this machine's " in err and "Use a smaller data.image_size" in err  # digits: 1 channel


def test_a_dataset_too_large_to_decode_is_refused_before_allocating(tmp_path, monkeypatch):
    """A size whose batch fits but whose decoded dataset does not: refused where the size of the dataset is
    known, before the tensor is allocated (resize and image-file decoding alike)."""
    import datamodules.tensors as T
    from datamodules.base import DATASETS

    monkeypatch.setattr(T, "machine_memory", lambda: 5_000_000)  # a 5 MB machine
    dm = DATASETS.get("digits")(cache_dir=str(tmp_path / "cache"), image_size=64)
    with pytest.raises(FedbenchError, match=r"data.image_size 64: the 1797 decoded images would take 7\.4 MB "
                                            r"\(1797 x 1 x 64 x 64 bytes\), more than this machine's 5\.0 MB"):
        dm.setup()
    write_class_tree(tmp_path / "own" / "train", ["a", "b"], per_class=3)
    from datamodules.image_files import decode_image_files

    paths = sorted((tmp_path / "own").rglob("*.jpg"))
    with pytest.raises(FedbenchError, match=r"the 6 decoded images would take 72\.0 MB \(6 x 3 x 2000 x 2000"):
        decode_image_files(paths, 2000)


def test_more_cpu_ranks_than_cores_is_refused(tmp_path, capsys, no_work):
    cores = len(os.sched_getaffinity(0))
    assert main(run(tmp_path, "--data.name", "digits", "--devices", str(cores + 1))) == 2
    assert (f"--devices {cores + 1} would start {cores + 1} CPU ranks (processes), but this machine has {cores} "
            f"core(s) for them: use --devices {cores} or fewer" in one_error(capsys))


def test_a_table_with_more_ranks_than_cores_is_refused_before_any_run(tmp_path, capsys, no_work):
    cores = len(os.sched_getaffinity(0))
    assert main([*table(tmp_path, GOOD[:1]), "--devices", str(4 * cores)]) == 2
    assert f"--devices {4 * cores} would start {4 * cores} CPU ranks" in one_error(capsys)
    assert not (tmp_path / "runs").exists()
