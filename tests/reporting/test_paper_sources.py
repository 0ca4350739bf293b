"""Every facet of every paper protocol says where it comes from (stated / code / ours), and † follows it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_tables import SPEC, write_fake_records

from bench.commands.coverage import count_sources
from bench.core.errors import FedbenchError
from bench.reporting.paper_numbers import load_paper_numbers, lookup
from bench.reporting.paper_sources import FACETS, KINDS, applicable_facets, inferred_facets
from bench.reporting.tables import render_table

TABLE_FACETS = {"eval", "round", "hyperparameters", "partition"}


@pytest.fixture(scope="module")
def cells():
    return load_paper_numbers()


def cell(cells, **keys):
    found = lookup(cells, **keys)
    assert found is not None, keys
    return found


def test_every_facet_of_every_published_protocol_has_a_kind_and_a_source(cells):
    assert len(cells) == 734
    for c in cells:
        proto = c["protocol"]
        facets = applicable_facets(proto)
        assert TABLE_FACETS <= set(facets), (c["paper"], c["table"], c["method"])
        for facet in facets:
            src = proto["sources"][facet]
            assert src["kind"] in KINDS and len(src["where"]) > 10, (c["paper"], c["table"], c["method"], facet)
        assert proto["inferred"] == any(proto["sources"][f]["kind"] != "stated" for f in facets)
    for path in sorted(Path("results/paper").glob("*.json")):
        for table in json.loads(path.read_text())["tables"]:
            proto = table["protocol"]
            setup = set(proto.get("setup") or {})
            assert TABLE_FACETS | setup <= set(proto["sources"]), (path.name, table["id"])
            for record in (proto, *(table.get("method_protocols") or {}).values()):
                assert not {"inferred", "setup_inferred"} & set(record), (path.name, table["id"])  # derived now


def test_dagger_follows_the_sources(cells):
    # FedBM's round rule (best validation sum of 5 metrics) is read from its main.py: inferred
    fedavg = cell(cells, paper="fedbm", table="II", dataset="kvasir", partition="dirichlet-0.1", method="FedAvg",
                  metric="accuracy")
    assert fedavg["protocol"]["sources"]["round"]["kind"] == "code" and "main.py" in fedavg["protocol"]["sources"]["round"]["where"]
    assert fedavg["protocol"]["inferred"] and inferred_facets(fedavg) == ["eval", "round", "hyperparameters"]
    fedcb = cell(cells, paper="fedcb", table="2", partition="dirichlet-0.05", method="FedCB", metric="f1")
    assert "round" in inferred_facets(fedcb)
    # FACMIC's Table 2 states all of it for the fine-tuning baselines' accuracy: not inferred
    bt = cell(cells, paper="facmic", table="2", dataset="bt", partition="iid", method="FedAVG", metric="accuracy")
    assert inferred_facets(bt) == [] and not bt["protocol"]["inferred"]
    assert set(bt["protocol"]["sources"]) >= {"eval", "round", "model", "clients", "rounds", "partition"}
    # ... but not at which round Real's BACC is taken
    real = {m: cell(cells, paper="facmic", table="2", dataset="real", method="FedAVG", metric=m)
            for m in ("accuracy", "balanced_accuracy")}
    assert inferred_facets(real["accuracy"]) == [] and inferred_facets(real["balanced_accuracy"]) == ["round"]
    central = cell(cells, paper="facmic", table="2", dataset="real", method="Centralized", metric="accuracy")
    assert inferred_facets(central) == ["model", "epochs"]
    assert central["protocol"]["sources"]["model"]["kind"] == "code"  # Real's Centralized: the first main.py
    assert cell(cells, paper="facmic", table="2", dataset="bt", method="Centralized",
                metric="accuracy")["protocol"]["sources"]["model"]["kind"] == "ours"
    # FST-CBDG: zero-shot CLIP is all stated; the trained rows' round is ours; CLIP-FC-Centralized's epochs are ours
    zs = cell(cells, paper="fstcbdg", table="1", dataset="cifar10", method="CLIP-ZS")
    assert inferred_facets(zs) == []
    fc = cell(cells, paper="fstcbdg", table="1", dataset="cifar10", method="CLIP-FC-Centralized")
    assert inferred_facets(fc) == ["round", "hyperparameters"]
    assert "10 epochs" in fc["protocol"]["sources"]["hyperparameters"]["where"]
    assert fc["protocol"]["sources"]["hyperparameters"]["kind"] == "ours"


def test_values_from_code_are_marked_code(cells):
    """FACMIC's baselines' own weights (FedProx mu, MOON mu / tau, FedFocal gamma) and FST-CBDG's batch and
    FedNTD's tau / beta come from the public code, not the papers (issue 37.3)."""
    for method in ("FedProx", "MOON", "FedFocal"):
        for table in ("2", "5"):
            c = cell(cells, paper="facmic", table=table, dataset="bt" if table == "2" else "bt2", partition="iid",
                     method=method, metric="accuracy")
            src = c["protocol"]["sources"]["hyperparameters"]
            assert src["kind"] == "code" and src["where"].startswith("AIPMLab/FACMIC 514c500 utils/training.py")
            assert "hyperparameters" in inferred_facets(c)
    fedavg = cell(cells, paper="facmic", table="2", dataset="bt", partition="iid", method="FedAVG", metric="accuracy")
    assert fedavg["protocol"]["sources"]["hyperparameters"]["kind"] == "stated"  # nothing of its own
    ntd = cell(cells, paper="fstcbdg", table="1", dataset="cifar10", partition="iid", method="FedNTD")
    assert ntd["protocol"]["sources"]["hyperparameters"]["kind"] == "code"
    assert "Lee-Gihun/FedNTD config/fedntd.json" in ntd["protocol"]["sources"]["hyperparameters"]["where"]
    fst = cell(cells, paper="fstcbdg", table="1", dataset="cifar10", partition="iid", method="FST-CBDG")
    assert fst["protocol"]["sources"]["hyperparameters"]["kind"] == "ours"  # its sigma is ours


def test_fednpr_has_inferred_cells(cells):
    npr = [c for c in cells if c["paper"] == "fednpr"]
    assert sum(c["protocol"]["inferred"] for c in npr) == len(npr) == 116  # its reporting round is the notebooks'
    fedavg = cell(cells, paper="fednpr", table="3", dataset="rsna-ich", method="FedAvg", metric="balanced_accuracy")
    assert inferred_facets(fedavg) == ["eval", "round"]
    assert {fedavg["protocol"]["sources"][f]["kind"] for f in ("eval", "round")} == {"code"}
    # the baselines have no code: their per-client scoring is ours
    prox = cell(cells, paper="fednpr", table="3", dataset="rsna-ich", method="FedProx", metric="balanced_accuracy")
    assert inferred_facets(prox) == ["eval", "round", "hyperparameters"]
    assert prox["protocol"]["sources"]["eval"]["kind"] == "ours"
    local = cell(cells, paper="fednpr", table="3", dataset="fed-isic2019", method="Local Learning", metric="balanced_auc")
    assert {"rounds", "local_epochs"} <= set(inferred_facets(local))


def test_counts_per_kind_cover_every_cell(cells):
    counts = count_sources(cells)
    assert list(counts) == [f for f in FACETS if f in counts]
    for facet in ("eval", "round", "partition", "hyperparameters"):
        assert sum(counts[facet].values()) == 734
    assert counts["round"]["code"] > 0 and counts["round"]["ours"] > 0 and counts["partition"]["stated"] == 734


DEMO = {"paper": "demo", "title": "fixture", "source": "nowhere",
        "tables": [{"id": "T1", "kind": "comparison", "caption": "c",
                    "protocol": {"eval": "global", "round": "final", "setup": {"clients": 10},
                                 "sources": {"eval": {"kind": "stated", "where": "Sec. 4", "quote": "the global model"},
                                             "round": {"kind": "code", "where": "demo/repo main.py: last round"},
                                             "clients": {"kind": "stated", "where": "Sec. 4", "quote": "10 clients"},
                                             "partition": {"kind": "stated", "where": "Table 1 columns",
                                                           "quote": ["Table 1", "iid"]},
                                             "hyperparameters": {"kind": "stated", "where": "Sec. 4", "quote": "SGD"}}},
                    "cells": [{"dataset": "digits", "partition": "iid", "method": m, "metric": "accuracy",
                               "mean": 50.0, "std": 1.0, "setting": None} for m in ("FedAvg", "Central")]}]}


def write_demo(tmp_path, mutate=None) -> Path:
    doc = json.loads(json.dumps(DEMO))
    if mutate:
        mutate(doc["tables"][0])
    (tmp_path / "demo.json").write_text(json.dumps(doc))
    return tmp_path


def test_inferred_is_derived_from_the_sources(tmp_path):
    got = {c["method"]: c for c in load_paper_numbers("demo", str(write_demo(tmp_path)))}
    assert got["FedAvg"]["protocol"]["inferred"] and inferred_facets(got["FedAvg"]) == ["round"]

    def stated(table):
        table["protocol"]["sources"]["round"] = {"kind": "stated", "where": "Sec. 4", "quote": "the last round"}
        table["method_protocols"] = {"Central": {"model": ["central"], "setup": {"clients": 1},
                                                 "sources": {"model": {"kind": "ours", "where": "our reading"},
                                                             "clients": {"kind": "stated", "where": "Sec. 4",
                                                                         "quote": "one client"}}}}
    got = {c["method"]: c for c in load_paper_numbers("demo", str(write_demo(tmp_path, stated)))}
    assert not got["FedAvg"]["protocol"]["inferred"] and inferred_facets(got["FedAvg"]) == []
    assert inferred_facets(got["Central"]) == ["model"]  # the exception's sources replace the table's


def _set(path: list[str], value):
    def mutate(table):
        node = table
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return mutate


@pytest.mark.parametrize("mutate, says", [
    (_set(["protocol", "sources", "round", "kind"], "guessed"), "unknown source kind 'guessed'"),
    (_set(["protocol", "sources", "lr"], {"kind": "code", "where": "x.py"}), "unknown facet 'lr'"),
    (_set(["protocol", "sources", "eval"], {"kind": "stated", "where": "Sec. 4"}), "a 'stated' source must quote"),
    (_set(["protocol", "sources", "eval", "quote"], ["the global model", " "]), "a 'stated' source must quote"),
    (_set(["protocol", "sources", "eval", "quote"], []), "a 'stated' source must quote"),
    (_set(["protocol", "sources", "round", "quote"], "last round"), "a 'code' source has no 'quote'"),
    (_set(["protocol", "sources", "round", "page"], 3), "a facet source is"),
    (_set(["protocol", "sources", "round", "where"], " "), "'where' is empty"),
    (_set(["protocol", "sources", "round"], {"digits": {"kind": "code", "where": "x.py"}}), "needs a 'default'"),
    (_set(["protocol", "inferred"], True), "'inferred' is derived from 'sources'"),
    (lambda t: t["protocol"]["sources"].pop("hyperparameters"), "no source for hyperparameters"),
    (_set(["method_protocols"], {"Central": {"round": "any"}}), "changes round without saying where from"),
])
def test_a_malformed_source_is_one_clear_error_naming_the_file(tmp_path, mutate, says):
    root = write_demo(tmp_path, mutate)
    with pytest.raises(FedbenchError, match="demo.json") as err:
        load_paper_numbers("demo", str(root))
    assert says in str(err.value)


def test_the_legend_names_the_inferred_facets_and_links_the_departures(tmp_path):
    runs = write_fake_records(tmp_path, with_fedrep=False)
    md = Path(render_table(SPEC, runs, str(tmp_path / "tables"))["md"]).read_text()
    legend = next(line for line in md.splitlines() if line.startswith("- Paper:"))
    # FedBM Table II: FedAvg's evaluation, round and optimiser come from FedBM's code; Central Learning's
    # scoring and epochs are ours (its model is stated)
    assert "(Central: eval, round, hyperparameters; FedAvg: eval, round, hyperparameters; sources in results/paper)" in legend
    assert "docs/departures.md" not in legend  # the departures are listed by id, not linked at the bottom
    assert "- Departures from the papers or their public code that can move a row's numbers" in md
    assert "| FedAvg <sup>FBM-1, FBM-3, FBM-4, FBM-10, FBM-16</sup> | 58.00 ± 3.00 | (reference) | 60.10 ± 5.76 † |" in md


def test_every_departure_line_names_its_kind():
    lines = [line for line in Path("docs/departures.md").read_text().splitlines() if line.startswith("- ")]
    assert len(lines) >= 40
    for line in lines:
        assert any(f"**{kind}**" in line for kind in KINDS), line
    text = "\n".join(lines)
    # FedNPR's folds and its ICH stem (the two FedNPR departures issue 28 named) are listed
    assert "`data.fold`" in text and "Conv2d(1, 32)" in text
