"""The data home (issue 21): datasets found under $FEDBENCH_DATA / --data-home by their archive names, an
explicit data.root winning, and `fedbench table` on a Kvasir-layout fixture with overrides, no YAML edit."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO
from official_layouts import build_data_home, write_kvasir, write_medmnist

from bench.cli import main
from datamodules.base import DATASETS
from datamodules.data_home import DATA_HOME_ENV, locate

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

KVASIR = REPO / "configs" / "tables" / "table2_kvasir.yaml"


def test_locate_takes_the_first_existing_entry(tmp_path):
    (tmp_path / "kvasir").mkdir()
    assert locate(tmp_path, ("kvasir-dataset-v2", "kvasir")) == tmp_path / "kvasir"
    (tmp_path / "kvasir-dataset-v2").mkdir()
    assert locate(tmp_path, ("kvasir-dataset-v2", "kvasir")) == tmp_path / "kvasir-dataset-v2"
    (tmp_path / "bloodmnist_64.npz").write_bytes(b"")
    assert locate(tmp_path, ("bloodmnist*.npz",)) == tmp_path  # a file entry: its folder is the root
    assert locate(tmp_path, ("dermamnist*.npz",)) is None


def test_every_dataset_is_found_under_the_data_home_by_its_archive_name(tmp_path, monkeypatch):
    home = tmp_path / "home"
    folders = build_data_home(home)
    monkeypatch.setenv(DATA_HOME_ENV, str(home))
    for name, where in folders.items():
        dm = DATASETS.get(name)(cache_dir=str(tmp_path / "cache"), image_size=8)
        assert (dm.root, dm.root_source) == (str(where if where.is_dir() else where.parent), "data home"), name
        dm.setup()
        assert len(dm.train) > 0 and len(dm.test) > 0, name


def test_explicit_root_wins_then_home_then_default(tmp_path, monkeypatch):
    home, mine, default = tmp_path / "home", tmp_path / "mine", tmp_path / "medmnist-default"
    for folder in (home, mine, default):
        write_medmnist(folder / "dermamnist.npz", 28, {"train": 14, "val": 7, "test": 7}, 7)
    monkeypatch.setenv(DATA_HOME_ENV, str(home))
    monkeypatch.setattr(DATASETS.get("ham10000"), "default_root", str(default))
    assert DATASETS.get("ham10000")(root=str(mine)).root == str(mine)
    assert DATASETS.get("ham10000")().root == str(home)
    (home / "dermamnist.npz").unlink()
    assert DATASETS.get("ham10000")().root == str(default)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(DATA_HOME_ENV)  # default data home: ./data
    (tmp_path / "data").mkdir()
    write_medmnist(tmp_path / "data" / "dermamnist_64.npz", 64, {"train": 14, "val": 7, "test": 7}, 7)
    assert DATASETS.get("ham10000")().root == str(tmp_path / "data")


def test_kvasir_table_runs_from_the_data_home_with_overrides_and_no_yaml_edit(tmp_path, monkeypatch, capsys):
    """Issue 21's command on a Kvasir-v2 layout (class folders of JPEGs of the archive's mixed sizes).
    Two more overrides than the issue's command: the FedBM row asks for BiomedCLIP, which is not
    reachable offline, and 10 clients of >= 10 samples do not fit a 96-image fixture."""
    yaml_before = KVASIR.read_bytes()
    home = tmp_path / "home"
    write_kvasir(home / "kvasir-dataset-v2", 12)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(DATA_HOME_ENV, raising=False)
    sets = ["fed.rounds=1", "data.image_size=16", "method.args.text_encoder=minilm", "partition.num_clients=3",
            "data.cache_dir=" + str(tmp_path / "cache"), "threads=1"]
    argv = ["table", "--config", str(KVASIR), "--data-home", str(home), "--seeds", "0", "--rows", "FedAvg,FedBM",
            "--output-dir", str(tmp_path / "runs"), "--tables-dir", str(tmp_path / "tables")]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 0, capsys.readouterr().err
    assert KVASIR.read_bytes() == yaml_before

    # the runs went to their own experiment, never the full-budget one
    experiments = [p.name for p in (tmp_path / "runs").iterdir()]
    assert len(experiments) == 1 and experiments[0].startswith("table2_kvasir__set-")
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "runs" / experiments[0]).glob("*.json"))]
    assert sorted((r["method"], r["config"]["partition"]["args"]["beta"]) for r in records) == [
        ("fedavg", 0.05), ("fedavg", 0.1), ("fedbm", 0.05), ("fedbm", 0.1)]
    for rec in records:
        assert rec["overrides"] == {"fed.rounds": 1, "data.image_size": 16, "method.args.text_encoder": "minilm",
                                    "partition.num_clients": 3, "data.cache_dir": str(tmp_path / "cache"),
                                    "threads": 1}
        assert rec["data_root"] == str(home / "kvasir-dataset-v2") and rec["config"]["data"]["root"] is None
        assert rec["config"]["fed"]["rounds"] == 1 and len(rec["history"]) == 1
        assert rec["config"]["seed"] == 0 and rec["config"]["data"]["image_size"] == 16
        assert rec["splits"] == {"train": 64, "val": 16, "test": 16}  # 7:1:2 of 12 per class, rounded per class
    fedbm = {r["config"]["partition"]["args"]["beta"]: r["config"]["method"]["args"] for r in records if r["method"] == "fedbm"}
    assert fedbm[0.05]["tau"] == 12.5 and fedbm[0.1]["tau"] == 7.5  # the rows' own options kept
    assert {a["text_encoder"] for a in fedbm.values()} == {"minilm"}

    # the table is filed under its own name and says it is reduced
    tables = sorted(str(p.relative_to(tmp_path / "tables")) for p in (tmp_path / "tables").rglob("*.md"))
    assert tables == [("reduced/table2_kvasir__set-fed.rounds=1_set-data.image_size=16_set-method.args.text_encoder="
                       "minilm_set-partition.num_clients=3_seeds-0_rows-FedAvg,FedBM.md")]
    md = (tmp_path / "tables" / tables[0]).read_text()
    assert md.splitlines()[0].endswith("REDUCED RUN, not the config's budget")
    assert "- --set fed.rounds=1" in md and "- seeds [0] of the config's [0, 1, 2]" in md
    from bench.scheduling.table_runner import load_table_config

    labels = dict.fromkeys(r.label for r in load_table_config(str(KVASIR)).rows)
    assert f"- 2 of the config's {len(labels)} rows: FedAvg, FedBM" in md and len(labels) > 2
    assert "Weights: resnet18 (from scratch) (FedAvg); resnet18 (from scratch) + text encoder minilm (FedBM)." in md
    rows = [line for line in md.splitlines() if line.startswith("| Fed")]
    blocks = [line for line in md.splitlines() if line.startswith("### ")]  # a wide table: one block per β
    assert blocks == ["### β=0.05", "### β=0.1"]
    assert [r.split(" | ")[0].split(" <sup>")[0] for r in rows] == ["| FedAvg", "| FedBM"] * 2 and "missing" not in "".join(rows)


def test_table_configs_leave_the_root_to_the_data_home():
    from bench.scheduling.table_runner import load_table_config

    for path in sorted(Path(REPO / "configs" / "tables").glob("*.yaml")):
        spec = load_table_config(str(path))
        datas = [spec.base.get("data", {})] + [r.overrides.get("data", {}) for r in spec.rows]
        assert all("root" not in d for d in datas), f"{path.name} sets data.root; the data home does that"
