"""FedNPR's published RSNA-ICH client split (issue 17): ``ich_datasplit_10cl.npy`` read without running
pickled code, checked, and turned into FedNPR's clients (the file's train / test lists per client)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_in_process
from PIL import Image
from test_fednpr import SUBTYPES, build_rsna_csv

from bench.core.errors import DatasetNotFoundError, FedbenchError
from bench.scheduling.table_runner import plan_runs
from bench.tables.columns import parse_column
from bench.tables.table_spec import TableSpec
from datamodules.base import DATASETS
from datamodules.client_split_file import read_client_split

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out


def write_client_split_file(path: Path, train: list[dict[str, int]], test: list[dict[str, int]]) -> None:
    """The notebooks' format: np.save of {"train"/"test": {client: {"image": ids, "label": labels}}}, both
    object arrays (what the authors' file holds)."""
    def fold(clients):
        return {c: {"image": np.array(list(ids), dtype=object), "label": np.array(list(ids.values()), dtype=object)}
                for c, ids in enumerate(clients)}

    np.save(path, {"train": fold(train), "test": fold(test)}, allow_pickle=True)


def unique_greys(root: Path, keep: dict[str, int]) -> dict[str, int]:
    """Give every kept slice of build_rsna_csv its own grey level (so an image shows which slice it is)."""
    greys = {}
    for n, sid in enumerate(sorted(keep)):
        greys[sid] = 10 + 4 * n
        Image.fromarray(np.full((12, 12), greys[sid] * 257, dtype=np.uint16)).save(root / "images" / f"{sid}.png")
    return greys


def client_lists(keep: dict[str, int], num_clients: int = 3) -> tuple[list[dict], list[dict]]:
    """Deal each class's slices round-robin to the clients (client 2 lacks class 4: client 0 takes its
    share); a client's first slice of a class is its test slice, the others train."""
    train: list[dict] = [{} for _ in range(num_clients)]
    test: list[dict] = [{} for _ in range(num_clients)]
    for label in range(5):
        for j, sid in enumerate(s for s in sorted(keep) if keep[s] == label):
            c = j % num_clients
            if c == 2 and label == 4:
                c = 0
            (test if j < num_clients else train)[c][sid] = label
    return train, test


def test_reads_the_notebooks_format(tmp_path):
    train = [{"ID_a": 3, "ID_b": 4}, {"ID_c": 0}]
    test = [{"ID_d": 1}, {"ID_e": 2, "ID_f": 0}]
    write_client_split_file(tmp_path / "s.npy", train, test)
    split = read_client_split(tmp_path / "s.npy", 5)
    assert split.num_clients == 2
    assert [a.tolist() for a in split.ids["train"]] == [["ID_a", "ID_b"], ["ID_c"]]
    assert [a.tolist() for a in split.labels["test"]] == [[1], [2, 0]]
    assert all(a.dtype == np.int64 for a in split.labels["train"])


class Payload:
    """What a crafted split file could carry: unpickling it calls os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_pickled_payload_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    np.save(tmp_path / "evil.npy", np.array({"train": Payload(marker)}, dtype=object), allow_pickle=True)
    with pytest.raises(DatasetNotFoundError, match=r"references (posix|os|nt)\.system.*not loaded"):
        read_client_split(tmp_path / "evil.npy", 5)
    assert not marker.exists()


@pytest.mark.parametrize("case, message", [
    ("keys", "must hold a dict with the keys ['train', 'test']"),
    ("label", "train client 0 has labels outside 0..4"),
    ("twice", "some sample ids appear twice"),
    ("clients", "1 clients in train but 2 in test"),
    ("missing", "not found. FedNPR's RSNA-ICH split is ich_datasplit_10cl.npy"),
    ("not-npy", "is not a NumPy .npy file"),
])
def test_a_malformed_client_split_file_is_one_clear_error(tmp_path, case, message):
    path = tmp_path / "s.npy"
    if case == "keys":
        np.save(path, {"train": {}}, allow_pickle=True)
    elif case == "label":
        write_client_split_file(path, [{"ID_a": 5}], [{"ID_b": 0}])
    elif case == "twice":
        write_client_split_file(path, [{"ID_a": 1}], [{"ID_a": 1}])
    elif case == "clients":
        write_client_split_file(path, [{"ID_a": 1}], [{"ID_b": 1}, {"ID_c": 2}])
    elif case == "not-npy":
        path.write_bytes(b"hello")
    with pytest.raises(DatasetNotFoundError, match=message.replace("(", r"\(").replace(")", r"\)").replace(
            "[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        read_client_split(path, 5)


def test_rsna_ich_with_the_client_split_file_gives_the_files_clients(tmp_path):
    root = tmp_path / "ich"
    keep = build_rsna_csv(root)
    greys = unique_greys(root, keep)
    train, test = client_lists(keep)
    write_client_split_file(tmp_path / "split.npy", train, test)
    dm = DATASETS.get("rsna-ich")(root=str(root), image_size=16, cache_dir=str(tmp_path / "c"),
                                  client_split_file=str(tmp_path / "split.npy"), val_fraction=0.0)
    dm.setup()
    assert dm.val is None and (len(dm.train), len(dm.test)) == (35, 15)
    for split, lists in ((dm.train, train), (dm.test, test)):
        for c, ids in enumerate(lists):
            mine = (split.groups == c).nonzero().flatten()
            assert split.labels[mine].tolist() == list(ids.values())  # the file's order and labels
            assert split.images[mine, 0, 8, 8].tolist() == [greys[i] for i in ids]  # each slice's own image
    assert 4 not in dm.train.labels[dm.train.groups == 2].tolist()
    # another file is another split: a different cache entry, never the old decode
    other_train, other_test = client_lists(keep, num_clients=2)
    write_client_split_file(tmp_path / "other.npy", other_train, other_test)
    other = DATASETS.get("rsna-ich")(root=str(root), image_size=16, cache_dir=str(tmp_path / "c"),
                                     client_split_file=str(tmp_path / "other.npy"))
    other.setup()
    assert set(other.test.groups.tolist()) == {0, 1}


def test_client_split_file_slices_must_exist_with_the_files_label(tmp_path):
    root = tmp_path / "ich"
    keep = build_rsna_csv(root)
    train, test = client_lists(keep)
    first = next(iter(train[0]))
    train[0]["ID_absent"] = 1
    write_client_split_file(tmp_path / "a.npy", train, test)
    dm = DATASETS.get("rsna-ich")(root=str(root), image_size=16, cache_dir=str(tmp_path / "c"),
                                  client_split_file=str(tmp_path / "a.npy"))
    with pytest.raises(DatasetNotFoundError, match="1 of the 36 train slices of the split file .*'ID_absent'"):
        dm.decode()
    del train[0]["ID_absent"]
    train[0][first] = (train[0][first] + 1) % 5
    write_client_split_file(tmp_path / "b.npy", train, test)
    dm = DATASETS.get("rsna-ich")(root=str(root), image_size=16, cache_dir=str(tmp_path / "c"),
                                  client_split_file=str(tmp_path / "b.npy"))
    with pytest.raises(DatasetNotFoundError, match=f"1 train slice.* another label .*{first}.*must follow "
                                                   + ", ".join(SUBTYPES)):
        dm.decode()


def test_only_rsna_ich_reads_a_client_split_file(tmp_path):
    with pytest.raises(FedbenchError, match="reads no client split file .* only rsna-ich do"):
        DATASETS.get("digits")(client_split_file=str(tmp_path / "s.npy"))


def test_fednpr_clients_from_the_client_split_file_end_to_end(tmp_path, tiny_cfg, captured):
    """The ICH table's column: natural partition over the file's clients, each trained on its train list
    and scored on its test list."""
    root = tmp_path / "ich"
    keep = build_rsna_csv(root)
    train, test = client_lists(keep)
    write_client_split_file(tmp_path / "split.npy", train, test)
    cfg = tiny_cfg(**{"data.name": "rsna-ich", "data.root": str(root), "data.image_size": 16,
                      "data.client_split_file": str(tmp_path / "split.npy"), "data.val_fraction": 0.0,
                      "partition.scheme": "natural", "partition.num_clients": 3, "fed.client_test": "site",
                      "method.name": "fednpr-per", "method.args": {"num_subclusters": 2, "lam": 0.05},
                      "method.optimizer": "adam", "method.lr": 1e-3, "fed.rounds": 2, "fed.sample_ratio": 1.0,
                      "fed.batch_size": 8})
    record, _ = run_in_process(cfg)
    fed = captured["fed"]
    for c, split in enumerate(fed.clients):
        assert fed.data.labels[split.train].tolist() == list(train[c].values())
        assert split.test_data is fed.test and fed.test.labels[split.test].tolist() == list(test[c].values())
    assert record["partition"]["counts"] == [np.bincount(list(t.values()), minlength=5).tolist() for t in train]
    assert record["history"][-1]["metrics"]["clients_evaluated"] == 3
    assert torch.isfinite(torch.tensor(record["history"][-1]["metrics"]["test/balanced_accuracy"]))


def test_the_published_split_column_needs_the_file(tmp_path):
    spec = {"table": "t", "dataset": "ich", "columns": ["dirichlet-classwise-file"], "seeds": [0],
            "base": {"data": {"name": "rsna-ich"}, "partition": {"num_clients": 10}, "fed": {"client_test": "site"}},
            "rows": [{"label": "FedNPR-Per", "method": {"name": "fednpr-per"}}]}
    with pytest.raises(FedbenchError, match="column dirichlet-classwise-file is a published client split: set "
                                            "data.client_split_file"):
        plan_runs(TableSpec.parse(spec, "t.yaml"))
    spec["base"]["data"]["client_split_file"] = "ich_datasplit_10cl.npy"
    (run,) = plan_runs(TableSpec.parse(spec, "t.yaml"))
    assert (run.cfg.partition.scheme, run.cfg.fed.client_test) == ("natural", "site")
    assert parse_column("dirichlet-classwise-file").paper_partition == "dirichlet-classwise"  # FedNPR's key


@pytest.mark.ddp
def test_client_split_file_clients_same_with_one_and_two_ranks(tmp_path, two_rank_runs):
    """Each client's test list lives in the test split, which every rank holds: clients scored on rank 1
    give the same numbers as on rank 0 (natural partition of 3 sites from a split file, per-client protocol,
    2 rounds: tests/rank_pairs.py, the 2-rank side from the shared launch)."""
    from conftest import max_state_diff, run_in_process

    record, state1 = run_in_process(two_rank_runs.one_cfg("ich_split_file", tmp_path))
    two_record, state2 = two_rank_runs.two("ich_split_file")
    assert max_state_diff(state1, state2) <= 1e-6
    for a, b in zip(record["history"], two_record["history"], strict=True):
        assert a["metrics"]["clients_evaluated"] == 3
        for k, v in a["metrics"].items():
            assert abs(v - b["metrics"][k]) <= 1e-6, (a["round"], k, v, b["metrics"][k])
