"""Schema checks for results/paper/*.json and spot-checks of transcribed cells against the papers."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from bench.reporting.paper_numbers import CELL_KEYS, PAPERS, load_paper_numbers, lookup

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "results" / "paper"
PAPER_FILES = {"fedcb": "fedcb-miccai2024.txt", "fedbm": "fedbm-tmi.txt", "fednpr": "fednpr.txt",
               "facmic": "facmic-miccai2024.txt", "fstcbdg": "fst-cbdg.txt"}
DATASETS = {"kvasir", "oct-c8", "ham10000", "pbc", "femnist", "fed-isic2019", "rsna-ich", "bt", "bt2", "sc",
            "real", "cifar10", "cifar100", "cinic10"}
METRICS = {"accuracy", "f1", "precision", "auc", "balanced_accuracy", "balanced_auc"}
PARTITION_RE = re.compile(r"^(iid|natural|none|average|dirichlet-classwise|dirichlet-[0-9.]+|lda-[0-9.]+|shards-\d+)$")


def papers_dir() -> Path | None:
    candidates = [Path(__file__).resolve().parents[3] / "shared" / "papers"]
    if os.environ.get("FEDBENCH_PAPERS"):
        candidates.append(Path(os.environ["FEDBENCH_PAPERS"]))
    for c in candidates:
        if c.is_dir() and all((c / f).exists() for f in PAPER_FILES.values()):
            return c
    return None


def load_doc(paper: str) -> dict:
    return json.loads((ROOT / f"{paper}.json").read_text(encoding="utf-8"))


# ------------------------------------------------------------------ schema


def test_all_papers_present():
    assert sorted(p.stem for p in ROOT.glob("*.json")) == sorted(PAPERS)


@pytest.mark.parametrize("paper", PAPERS)
def test_schema(paper):
    doc = load_doc(paper)
    assert set(doc) >= {"paper", "title", "source", "tables"}
    assert doc["paper"] == paper
    assert isinstance(doc["title"], str) and doc["title"]
    assert Path(doc["source"]).name == PAPER_FILES[paper]
    assert doc["tables"], "no tables"
    ids = [t["id"] for t in doc["tables"]]
    assert len(ids) == len(set(ids)), "duplicate table ids"
    seen = set()
    for t in doc["tables"]:
        assert set(t) >= {"id", "caption", "kind", "cells"}, t.get("id")
        assert isinstance(t["id"], str) and t["id"]
        assert isinstance(t["caption"], str) and t["caption"]
        assert t["kind"] in {"comparison", "ablation"}
        assert isinstance(t["cells"], list)
        if not t["cells"]:
            assert t.get("note"), f"table {t['id']} is empty without a note"
        for c in t["cells"]:
            where = f"{paper} table {t['id']}: {c}"
            assert set(c) >= set(CELL_KEYS), where
            assert c["dataset"] in DATASETS, where
            assert PARTITION_RE.match(c["partition"]), where
            assert c["metric"] in METRICS, where
            assert isinstance(c["method"], str) and c["method"].strip() == c["method"] and c["method"], where
            assert type(c["mean"]) is float and 0.0 <= c["mean"] <= 100.0, where
            assert c["std"] is None or (type(c["std"]) is float and c["std"] >= 0.0), where
            assert c["setting"] is None or (isinstance(c["setting"], str) and c["setting"]), where
            if "delta" in c:
                assert type(c["delta"]) is float, where
            key = (t["id"], c["dataset"], c["partition"], c["method"], c["metric"], c["setting"])
            assert key not in seen, f"duplicate cell {key}"
            seen.add(key)


def test_comparison_tables_present():
    for paper in PAPERS:
        kinds = [t["kind"] for t in load_doc(paper)["tables"] if t["cells"]]
        assert "comparison" in kinds and "ablation" in kinds, paper


# ------------------------------------------------------------------ loader


def test_loader_and_lookup():
    cells = load_paper_numbers()
    total = sum(len(t["cells"]) for p in PAPERS for t in load_doc(p)["tables"])
    assert len(cells) == total
    assert {c["paper"] for c in cells} == set(PAPERS)
    assert all({"paper", "table", *CELL_KEYS} <= set(c) for c in cells)
    fedbm = load_paper_numbers("fedbm")
    assert {c["paper"] for c in fedbm} == {"fedbm"}
    # also from an explicit root
    assert len(load_paper_numbers("fedbm", root=str(ROOT))) == len(fedbm)
    c = lookup(cells, paper="fedbm", table="I", dataset="oct-c8", partition="dirichlet-0.05",
               method="FedAvg", metric="accuracy")
    assert c is not None and c["mean"] == 74.82 and c["std"] == 5.98
    assert lookup(cells, paper="fedbm", method="NoSuchMethod") is None
    with pytest.raises(ValueError):
        lookup(cells, paper="fedbm", method="FedAvg")
    with pytest.raises(FileNotFoundError):
        load_paper_numbers("nosuchpaper")


# ------------------------------------------------------------------ spot checks against the texts

# (paper, table, dataset, partition, method, metric, setting, mean, std, anchor in text, printed number)
SPOT = [
    ("fedcb", "1", "oct-c8", "dirichlet-0.1", "Random", "f1", None, 82.03, 3.80, "Random", "82.03"),
    ("fedcb", "2", "oct-c8", "dirichlet-0.05", "FedAvg", "accuracy", None, 74.82, 5.98, "FedAvg", "74.82"),
    ("fedcb", "2", "oct-c8", "dirichlet-0.1", "FedREP", "accuracy", None, 59.37, 12.81, "FedREP", "59.37"),
    ("fedcb", "3", "kvasir", "dirichlet-0.1", "FedCB", "f1", None, 68.73, 3.36, "FedCB", "68.73"),
    ("fedcb", "4", "oct-c8", "dirichlet-0.1", "FedCB(50%)", "accuracy", "prompts=50%", 82.40, 3.17,
     "FedCB}(50", "82.40"),
    ("fedbm", "I", "oct-c8", "dirichlet-0.05", "FedNH", "f1", None, 78.61, 5.25, "FedNH", "78.61"),
    ("fedbm", "III", "ham10000", "dirichlet-0.1", "FedROD", "f1", None, 46.08, 0.87, "FedROD", "46.08"),
    ("fedbm", "IV", "pbc", "dirichlet-0.1", "Scaffold", "accuracy", None, 93.65, 2.42, "Scaffold", "93.65"),
    ("fedbm", "V", "femnist", "natural", "FedBM", "f1", None, 54.77, 0.81, "FedBM", "54.77"),
    ("fedbm", "VI", "kvasir", "dirichlet-0.1", "w/o LKCC", "f1", None, 16.07, 7.13, "w/o LKCC", "16.07"),
    ("fedbm", "VI", "oct-c8", "dirichlet-0.05", "w/o LKCC", "f1", None, 82.94, 2.47, "w/o LKCC", "82.94"),
    ("fedbm", "VIII", "oct-c8", "dirichlet-0.05", "Embedding (Averaging)", "accuracy", None, 76.75, 5.00,
     "Embedding (Averaging)", "76.75"),
    ("fedbm", "XII", "oct-c8", "dirichlet-0.05", "FedBM", "accuracy", "plm=Bert", 84.83, 2.44, "Bert", "84.83"),
    ("fednpr", "3", "rsna-ich", "dirichlet-classwise", "FedProx", "balanced_accuracy", None, 64.8, 0.5,
     "FedProx (MLSys20)", "64.8"),
    ("fednpr", "3", "fed-isic2019", "natural", "BalanceFL", "balanced_auc", None, 88.2, 0.4, "BalanceFL", "88.2"),
    ("fednpr", "3", "fed-isic2019", "natural", "FedNPR-Per", "balanced_accuracy", None, 76.2, 0.9,
     "FedNPR-Per (ours)", "76.2"),
    ("fednpr", "6", "rsna-ich", "dirichlet-classwise", "FedBABU+NPR", "balanced_accuracy", None, 71.7, None,
     "FedBABU+NPR", "71.7"),
    ("facmic", "2", "sc", "dirichlet-0.6", "FedCLIP", "accuracy", None, 55.93, None, "FedCLIP", "55.93"),
    ("facmic", "2", "real", "natural", "FACMIC", "balanced_accuracy", None, 63.61, None, "Ours", "63.61"),
    ("facmic", "4", "real", "natural", "FACMIC", "accuracy", "batch_size=8", 67.32, None, "Real", "67.32"),
    ("facmic", "5", "bt2", "iid", "FedCLIP", "accuracy", "trained-on-bt", 91.7, None, "FedCLIP", "91.7"),
    ("fstcbdg", "1", "cifar100", "iid", "CLIP-FC-Centralized", "accuracy", None, 42.9, None,
     "CLIP-FC-Centralized", "42.9"),
    ("fstcbdg", "2", "cifar10", "shards-3", "FedNTD", "accuracy", None, 64.1, None, "FedNTD", "64.1"),
    ("fstcbdg", "2", "cinic10", "lda-0.1", "FST-CBDG", "accuracy", None, 65.0, None, "FST-CBDG (ours)", "65.0"),
    ("fstcbdg", "4", "cifar100", "iid", "Equal sampling", "accuracy", None, 37.4, None, "Equal sampling", "37.4"),
]


def near(text: str, anchor: str, number: str, window: int = 200) -> bool:
    """Does ``number`` (not preceded by a digit) occur within ``window`` chars after an ``anchor``?"""
    num = re.compile(r"(?<![\d.])" + re.escape(number))
    start = text.find(anchor)
    while start != -1:
        if num.search(text, start + len(anchor), start + len(anchor) + window):
            return True
        start = text.find(anchor, start + 1)
    return False


def test_spot_checks_cover_every_paper():
    for paper in PAPERS:
        assert sum(s[0] == paper for s in SPOT) >= 3, paper


@pytest.mark.parametrize("spot", SPOT, ids=lambda s: f"{s[0]}-{s[1]}-{s[4]}-{s[3]}-{s[5]}")
def test_spot_values(spot):
    paper, table, dataset, partition, method, metric, setting, mean, std, _, number = spot
    cells = load_paper_numbers(paper)
    c = lookup(cells, table=table, dataset=dataset, partition=partition, method=method, metric=metric,
               setting=setting)
    assert c is not None, spot
    assert c["setting"] == setting
    assert c["mean"] == mean
    assert c["std"] == std
    assert float(number) == mean


EXCERPTS = json.loads((REPO / "tests" / "data" / "paper_excerpts.json").read_text(encoding="utf-8"))["excerpts"]


def spot_id(spot: tuple) -> str:
    return f"{spot[0]}-{spot[1]}-{spot[4]}-{spot[3]}-{spot[5]}"


@pytest.mark.parametrize("spot", SPOT, ids=spot_id)
def test_spot_in_paper_text(spot):
    """The printed number sits right after its anchor in the paper's text. The papers live outside the
    repository (../shared/papers or $FEDBENCH_PAPERS); tests/data/paper_excerpts.json keeps the
    lines each check needs, verbatim, so the check also runs where the papers are not. Where they
    are, the excerpt must still be a verbatim part of its paper."""
    paper, *_, anchor, number = spot
    excerpt = EXCERPTS[spot_id(spot)]
    assert near(excerpt, anchor, number), f"{number!r} not found near {anchor!r} in the excerpt {excerpt!r}"
    pdir = papers_dir()
    if pdir is not None:
        text = (pdir / PAPER_FILES[paper]).read_text(encoding="utf-8")
        assert excerpt in text, f"the excerpt for {spot_id(spot)} is not verbatim in {PAPER_FILES[paper]}"
        assert near(text, anchor, number), f"{number!r} not found near {anchor!r} in {PAPER_FILES[paper]}"


def test_every_spot_has_an_excerpt():
    assert sorted(EXCERPTS) == sorted(spot_id(s) for s in SPOT)
