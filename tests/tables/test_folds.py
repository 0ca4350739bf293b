"""K-fold cross-validation (data.fold of data.folds; FedNPR's five folds, issue 28 item 2): the folds
partition the dataset's pool, stratified by class and by site, fold k trains on the other folds, the
assignment is deterministic, bad values are one clear error before any work, a table with ``folds: K``
plans K runs (one per fold), and runs without a fold keep their names."""
from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch
import yaml
from conftest import digits_run_argv
from official_layouts import build_rsna_csv, write_ich_split_file
from test_bad_input import written_files

from bench.assembly.config import RunConfig, non_default, result_config
from bench.assembly.validation import validate_config
from bench.cli import main
from bench.core.errors import FedbenchError
from bench.scheduling.table_runner import fold_legend, load_table_config, plan_runs, run_label
from bench.tables.table_spec import TableSpec
from datamodules.base import DATASETS, FederatedDataModule
from datamodules.folds import stratified_folds
from datamodules.tensors import TensorSplit

N_SITES, N_CLASSES = 3, 4


class NumberedSites(FederatedDataModule):
    """503 samples whose pixels spell their index, over 3 sites with uneven class mixes (not registered)."""

    class_names: ClassVar[list[str]] = ["a", "b", "c", "d"]
    in_channels = 1
    default_image_size = 2
    cross_validation = "a test dataset"

    def decode(self) -> dict[str, TensorSplit]:
        n = 503
        index = torch.arange(n)
        images = torch.stack([index // 256, index % 256, index % 7, index % 3], 1).to(torch.uint8).view(n, 1, 2, 2)
        rng = np.random.default_rng(5)
        sites = torch.from_numpy(rng.integers(0, N_SITES, n))
        labels = torch.from_numpy((rng.integers(0, N_CLASSES, n) + sites.numpy()) % N_CLASSES)  # site-skewed
        cut = torch.from_numpy(rng.permutation(n))
        return {"train": TensorSplit(images[cut[:400]], labels[cut[:400]], sites[cut[:400]]),
                "val": TensorSplit(images[cut[400:450]], labels[cut[400:450]], sites[cut[400:450]]),
                "test": TensorSplit(images[cut[450:]], labels[cut[450:]], sites[cut[450:]])}


def ids(split: TensorSplit) -> list[int]:
    """The index each sample's pixels spell."""
    px = split.images.view(len(split), 4).long()
    return (px[:, 0] * 256 + px[:, 1]).tolist()


def numbered(tmp_path: Path, fold: int | None, val_fraction: float = 0.0, cache: str = "cache") -> NumberedSites:
    (tmp_path / "data").mkdir(exist_ok=True)
    dm = NumberedSites(root=str(tmp_path / "data"), cache_dir=str(tmp_path / cache), fold=fold, folds=5,
                       val_fraction=val_fraction)
    dm.setup()
    return dm


def test_the_folds_partition_the_pool_each_stratified_by_class_and_site(tmp_path):
    folds = [numbered(tmp_path, k) for k in range(5)]
    tested = [ids(dm.test) for dm in folds]
    every = sorted(itertools.chain.from_iterable(tested))
    assert every == list(range(503))  # every sample of train, val and test tested exactly once
    for dm, test in zip(folds, tested):
        assert set(ids(dm.train)).isdisjoint(test) and len(dm.train) + len(test) == 503
        assert dm.val is None  # val_fraction 0: all of the other folds train
    by_class = np.array([np.bincount(dm.test.labels.numpy(), minlength=N_CLASSES) for dm in folds])
    cells = np.array([[[int(((dm.test.groups == s) & (dm.test.labels == c)).sum()) for c in range(N_CLASSES)]
                       for s in range(N_SITES)] for dm in folds])
    assert (by_class.max(0) - by_class.min(0)).max() <= 1  # per class, within one
    assert (cells.max(0) - cells.min(0)).max() <= 1  # per site and class, within one
    assert max(map(len, tested)) - min(map(len, tested)) <= 1


def test_a_fold_is_deterministic_and_validation_is_carved_from_its_train(tmp_path):
    a, b = numbered(tmp_path, 2, 0.1), numbered(tmp_path, 2, 0.1, cache="decoded-again")
    assert ids(a.test) == ids(b.test) and ids(a.train) == ids(b.train) and ids(a.val) == ids(b.val)
    assert torch.equal(a.train.groups, b.train.groups)
    parts = [set(ids(a.train)), set(ids(a.val)), set(ids(a.test))]
    assert sum(map(len, parts)) == 503 and set.union(*parts) == set(range(503))
    assert set(ids(a.test)) == set(ids(numbered(tmp_path, 2).test))  # validation only shrinks the train folds
    without = numbered(tmp_path, None)  # no fold: the dataset's own splits, untouched
    assert (len(without.train), len(without.val), len(without.test)) == (400, 50, 53)


def test_stratified_folds_depend_on_the_seed_only_through_the_shuffle():
    labels = np.repeat(np.arange(3), [10, 7, 4])
    f0, f0_again, f1 = (stratified_folds(labels, 4, s) for s in (0, 0, 1))
    assert np.array_equal(f0, f0_again) and not np.array_equal(f0, f1)
    for f in (f0, f1):
        counts = np.array([np.bincount(f[labels == c], minlength=4) for c in range(3)])
        assert (counts.max(1) - counts.min(1)).max() <= 1 and counts.sum() == 21


def test_ich_folds_pool_each_clients_split_file_lists_and_keep_its_clients(tmp_path):
    """RSNA-ICH with FedNPR's split file: the file's train and test lists pooled, the folds stratified by
    client (site) and class, so that fed.client_test site gives each client about a fifth of each class."""
    root = tmp_path / "ich"
    keep = build_rsna_csv(root, slices=300)
    write_ich_split_file(root / "split.npy", keep, num_clients=3)
    ich = DATASETS.get("rsna-ich")
    folds = []
    for k in range(5):
        dm = ich(root=str(root), cache_dir=str(tmp_path / "cache"), client_split_file="split.npy", fold=k,
                 val_fraction=0.0)
        dm.setup()
        folds.append(dm)
        assert len(dm.train) + len(dm.test) == len(keep)
        assert sorted(torch.unique(dm.test.groups).tolist()) == [0, 1, 2]  # every client tests in every fold
    cells = np.array([[[int(((dm.test.groups == s) & (dm.test.labels == c)).sum()) for c in range(5)]
                       for s in range(3)] for dm in folds])
    assert (cells.max(0) - cells.min(0)).max() <= 1
    train = folds[0].train
    whole = np.array([[int(((train.groups == s) & (train.labels == c)).sum()) for c in range(5)]
                      for s in range(3)]) + cells[0]
    assert (cells.sum(0) == whole).all()  # each client's cells: its samples, tested once over the folds


@pytest.mark.parametrize(("data", "message"), [
    ({"name": "digits", "fold": 5}, "data.fold must be in 0..4 (the fold tested, of data.folds 5), got 5."),
    ({"name": "digits", "fold": -1}, "data.fold must be in 0..4"),
    ({"name": "digits", "fold": 0, "folds": 1}, "data.folds must be >= 2 (K-fold cross-validation), got 1."),
    ({"name": "digits", "folds": 3}, "data.folds 3 is set but data.fold is not"),
    ({"name": "fashion-mnist", "fold": 0}, "dataset 'fashion-mnist' has a fixed official test split"),
    ({"name": "digits", "fold": 0, "test_dataset": "digits"}, "data.test_dataset 'digits' tests on another one"),
], ids=["fold-k", "negative", "one-fold", "folds-alone", "official-test", "test-dataset"])
def test_bad_fold_values_are_one_clear_error(data, message):
    cfg = RunConfig()
    for key, value in data.items():
        setattr(cfg.data, key, value)
    with pytest.raises(FedbenchError) as err:
        validate_config(cfg)
    assert message in str(err.value)


def test_a_bad_fold_stops_a_run_before_any_work(tmp_path, capsys):
    assert main(digits_run_argv(tmp_path) + ["--data.fold", "7"]) == 2
    err = capsys.readouterr().err
    assert "data.fold must be in 0..4" in err and "Traceback" not in err
    assert written_files(tmp_path) == []


@pytest.mark.parametrize("config", ["fednpr_ich", "fednpr_isic", "fednpr-ablation_ich", "fednpr-ablation_isic"])
def test_fednpr_tables_plan_the_five_folds(config):
    spec = load_table_config(f"configs/tables/{config}.yaml")
    runs = plan_runs(spec)
    rows = list(dict.fromkeys(r.label for r in runs))
    assert len(runs) == 5 * len(rows)
    for label in rows:
        mine = [r for r in runs if r.label == label]
        assert [(r.seed, r.fold, r.cfg.data.fold, r.cfg.data.folds, r.cfg.seed) for r in mine] == [
            (k, k, k, 5, 0) for k in range(5)]
        assert len({r.cfg.record_name() for r in mine}) == 5  # one record per fold
        assert [f"fold{k}of5" in r.cfg.run_name() for k, r in enumerate(mine)] == [True] * 5
    assert run_label(runs[3]) == f"(column {runs[3].columns[0]}, fold 3/5, seed 0)"
    rendered = fold_legend(spec)
    assert rendered.title.startswith(spec.title) and "over 5 folds" in rendered.title
    assert rendered.seeds == (0,) and "over the 5 folds" in rendered.notes
    unfolded = load_table_config("configs/tables/fednpr_fashion-mnist.yaml")
    assert fold_legend(unfolded) is unfolded and unfolded.seeds == (0, 1, 2)


@pytest.mark.parametrize(("extra", "message"), [
    ({"folds": 5, "seeds": [0, 1]}, "seeds must name the one seed every fold trains with, got [0, 1]"),
    ({"folds": 1}, "folds must be a whole number >= 2"),
])
def test_bad_table_folds_are_one_clear_error(extra, message):
    raw = {**yaml.safe_load(Path("configs/tables/fednpr_isic.yaml").read_text()), **extra}
    with pytest.raises(FedbenchError) as err:
        TableSpec.parse(raw, "fednpr_isic.yaml")
    assert message in str(err.value)


def old_identity(cfg: RunConfig) -> str:
    """RunConfig.result_identity as computed before data.fold, data.folds and method.gray_stem existed: the
    same hash of the non-default result options, over configs without those three options."""
    def strip(d: dict) -> dict:
        d = json.loads(json.dumps(result_config(d), default=str))
        for group, key in (("data", "fold"), ("data", "folds"), ("method", "gray_stem")):
            d[group].pop(key)
        return d

    changed = json.dumps(non_default(strip(cfg.to_dict()), strip(RunConfig().to_dict())), sort_keys=True)
    return hashlib.sha1(changed.encode()).hexdigest()[:8]


@pytest.mark.parametrize("config", ["table2_fashion-mnist", "fednpr_fashion-mnist", "facmic_table2", "table2_kvasir"])
def test_a_run_without_a_fold_keeps_its_name_and_identity(config):
    for r in plan_runs(load_table_config(f"configs/tables/{config}.yaml")):
        assert r.cfg.data.fold is None and r.fold is None
        assert r.cfg.result_identity() == old_identity(r.cfg)
        assert r.cfg.run_name().endswith(f"_s{r.cfg.seed}")


FOLD_TABLE = """table: foldcheck
dataset: digits
title: "Fold check"
base:
  data: {{name: digits, cache_dir: {tmp_path}/cache}}
  partition: {{scheme: iid, num_clients: 2}}
  fed: {{rounds: 1, batch_size: 64}}
  method: {{backbone: simple-cnn-w8}}
  threads: 1
columns: [iid]
folds: 3
seeds: [0]
metrics: [accuracy]
rows:
  - {{label: FedAvg, method: {{name: fedavg}}}}
  - {{label: FedProx, method: {{name: fedprox, args: {{mu: 0.01}}}}}}
"""


def fold_table_argv(tmp_path: Path) -> list[str]:
    config = tmp_path / "foldcheck_digits.yaml"
    config.write_text(FOLD_TABLE.format(tmp_path=tmp_path))
    return ["table", "--config", str(config), "--devices", "1", "--output-dir", str(tmp_path / "runs"),
            "--tables-dir", str(tmp_path / "tables")]


def test_a_table_with_folds_runs_each_fold_once_and_says_so(tmp_path, capsys):
    """`fedbench table` on a folds table: one record per row and fold, every digit tested once per row,
    rows paired over the folds, and the rendered table says it is over the folds."""
    argv = fold_table_argv(tmp_path)
    assert main(argv) == 0, capsys.readouterr().err
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "runs" / "foldcheck_digits").glob("*_*.json"))
               if not p.is_symlink()]
    by_method = {}
    for rec in records:
        by_method.setdefault(rec["method"], []).append((rec["config"]["data"]["fold"], rec["splits"]["test"]))
    assert sorted(by_method) == ["fedavg", "fedprox"]
    for folds in by_method.values():
        assert sorted(f for f, _ in folds) == [0, 1, 2] and sum(n for _, n in folds) == 1797
    md = (tmp_path / "tables" / "foldcheck_digits.md").read_text()
    assert md.startswith("# Fold check — mean ± std over 3 folds (3-fold cross-validation, seed 0)")
    assert "Ours: mean ± sample std over the 3 folds (data.fold 0..2; seed 0 in every fold)" in md
    assert "per fold the row minus FedAvg (same partition, same fold)" in md and "per seed" not in md
    table = json.loads((tmp_path / "tables" / "foldcheck_digits.json").read_text())
    cells = {c["method"]: c for c in table["cells"]}
    assert cells["FedAvg"]["seeds"] == [0, 1, 2] and len(cells["FedAvg"]["values"]) == 3
    assert cells["FedProx"]["paired"]["seeds"] == [0, 1, 2]  # paired fold by fold


def test_folds_option_runs_only_those_folds_as_a_reduced_table(tmp_path, capsys):
    """`--folds 1` (as --seeds for seeds; the smoke tables use it): one record per row for fold 1 only, a
    reduced table that names the folds it is over; a fold outside 0..K-1, or --folds on a table without
    folds, is one error before any run."""
    argv = fold_table_argv(tmp_path)
    assert main(argv + ["--folds", "1"]) == 0, capsys.readouterr().err
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "runs" / "foldcheck_digits").glob("*_*.json"))
               if not p.is_symlink()]
    assert sorted((r["method"], r["config"]["data"]["fold"], r["config"]["data"]["folds"]) for r in records) == \
        [("fedavg", 1, 3), ("fedprox", 1, 3)]
    md_path = tmp_path / "tables" / "reduced" / "foldcheck_digits__folds-1.md"
    md = md_path.read_text()
    assert not (tmp_path / "tables" / "foldcheck_digits.md").exists()
    assert "mean ± std over fold 1 of the 3 folds (3-fold cross-validation, seed 0)" in md.splitlines()[0]
    assert "- folds [1] of the config's 3 (data.fold 0..2)" in md
    table = json.loads(md_path.with_suffix(".json").read_text())
    assert {c["method"]: c["seeds"] for c in table["cells"]} == {"FedAvg": [1], "FedProx": [1]}
    # the full table rendered from these records: every cell has 1 of its 3 folds, and says so in folds
    render = [a for i, a in enumerate(argv) if "--devices" not in argv[max(i - 1, 0):i + 1]]  # (runs nothing)
    assert main(render + ["--render-only"]) == 0, capsys.readouterr().err
    full = (tmp_path / "tables" / "foldcheck_digits.md").read_text()
    assert full.count("(1/3 folds)") == 2 and "seeds)" not in full
    before = sorted(p.name for p in (tmp_path / "runs").rglob("*"))
    for wrong, says in (("3", "choose among the config's folds 0..2"), ("x", "--folds: expected int items, got 'x'")):
        try:
            code = main(argv + ["--folds", wrong])
        except SystemExit as stop:  # a value the parser cannot read ("x") stops there, as a mistyped flag does
            code = stop.code
        assert code == 2
        assert says in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "runs").rglob("*")) == before
    seeds_table = tmp_path / "seeds.yaml"
    seeds_table.write_text(FOLD_TABLE.format(tmp_path=tmp_path).replace("folds: 3\n", "").replace("[0]", "[0, 1]"))
    assert main(["table", "--config", str(seeds_table), "--folds", "0"]) == 2
    assert "this table has no folds (it repeats over seeds; use --seeds)" in capsys.readouterr().err
