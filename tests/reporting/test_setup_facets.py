"""The whole setup is compared (issue 28, item 3): a published cell is set beside ours, with Δ and p, only
when our row trained in the paper's setup (clients, rounds, local epochs, client sampling, partition) and
was measured as the paper measured it. Rows run with --set overrides or standing in for the paper's data
are never comparable; `fedbench coverage` counts the cells that differ, per facet."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_tables import SPEC_YAML, fake_record

from bench.assembly.records import run_record_path
from bench.commands.coverage import coverage, format_report
from bench.core.atomic_io import write_json
from bench.reporting.paper_numbers import load_paper_numbers
from bench.reporting.tables import render_table
from bench.scheduling.table_runner import plan_runs
from bench.tables.protocols import RowProtocol, protocol_difference, protocol_facets
from bench.tables.table_overrides import TableOverrides
from bench.tables.table_spec import TableSpec

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

# FedBM Table II (Kvasir-v2): 10 clients, 200 rounds x 2 local epochs, half of the clients per round
KVASIR = {"clients": 10, "rounds": 200, "local_epochs": 2, "sample_ratio": 0.5, "partition": "dirichlet-0.1"}
ROWS = [
    {"label": "FedAvg", "method": {"name": "fedavg"}},
    {"label": "FedAvg, 20 rounds", "method": {"name": "fedavg"}, "fed": {"rounds": 20}, "paper_method": "FedAvg"},
    {"label": "FedAvg, 5 clients x 20 rounds", "method": {"name": "fedavg"}, "partition": {"num_clients": 5},
     "fed": {"rounds": 20}, "paper_method": "FedAvg"},
    {"label": "FedAvg, beta 0.5", "method": {"name": "fedavg"}, "partition": {"args": {"beta": 0.5}}, "paper_method": "FedAvg"},
    {"label": "FedAvg on Fashion-MNIST", "method": {"name": "fedavg"}, "data": {"name": "fashion-mnist"},
     "paper_dataset": "kvasir", "paper_method": "FedAvg"},
]
ACC = {0: 55.0, 1: 58.0, 2: 61.0}


def render(tmp_path, spec, sets=()):
    ov = TableOverrides.parse(spec, list(sets), None, None)
    runs = plan_runs(ov.select(spec), str(tmp_path / "runs"))
    ov.apply(runs)
    for run in runs:
        write_json(run_record_path(run.cfg), fake_record(run, ACC[run.seed] + (run.beta or 0)))
    paths = render_table(ov.select(spec), runs, str(tmp_path / "tables"), name=ov.table_name("t"),
                         changes=ov.describe(spec), reduced=not ov.full_budget)
    cells = {(c["method"], c["column"], c["metric"]): c for c in json.loads(Path(paths["json"]).read_text())["cells"]}
    md: dict[str, str] = {}  # row label -> its lines (a wide table prints one block per column)
    for line in Path(paths["md"]).read_text().splitlines():
        if line.startswith("| ") and not line.startswith("| Method"):
            label = line.split(" | ")[0].lstrip("| ").split(" <sup>")[0]  # without its departure ids
            md[label] = f"{md[label]}\n{line}" if label in md else line
    return cells, md


@pytest.fixture
def table(tmp_path):
    return render(tmp_path, TableSpec.parse({**SPEC_YAML, "rows": ROWS}, "t.yaml"))


def test_a_row_with_other_rounds_says_setup_differs_and_gives_no_delta(table):
    cells, md = table
    c = cells[("FedAvg, 20 rounds", "dirichlet-0.1", "accuracy")]
    assert c["paper_source"] == "fedbm Table II"
    assert (c["paper_mean"], c["delta"], c["p_value"]) == (None, None, None)
    assert c["protocol_differs"] == "setup differs: rounds 20 vs 200"
    assert c["protocol_differs_in"] == "setup differs: rounds 20 vs 200"
    assert "| setup differs: rounds 20 vs 200 [" in md["FedAvg, 20 rounds"]
    assert "60.10" not in md["FedAvg, 20 rounds"]  # the paper's number is not printed beside it
    several = cells[("FedAvg, 5 clients x 20 rounds", "dirichlet-0.05", "f1")]
    assert several["protocol_differs"] == "setup differs: clients 5 vs 10, rounds 20 vs 200"
    assert several["delta"] is None and several["p_value"] is None


def test_the_partition_parameter_is_compared(table):
    cells, md = table
    c = cells[("FedAvg, beta 0.5", "dirichlet-0.1", "accuracy")]  # the row's own beta beats the column's
    assert c["protocol_differs"] == "setup differs: partition dirichlet-0.5 vs dirichlet-0.1"
    assert c["paper_mean"] is None and c["delta"] is None
    assert "setup differs: partition dirichlet-0.5 vs dirichlet-0.1" in md["FedAvg, beta 0.5"]


def test_a_row_matching_every_facet_keeps_delta_and_p(table):
    cells, md = table
    c = cells[("FedAvg", "dirichlet-0.05", "accuracy")]  # FedBM Table II, beta 0.05: 60.10 ± 5.76
    assert c["protocol_differs"] is None
    assert (c["paper_mean"], c["paper_std"]) == (60.1, 5.76)
    assert c["delta"] == pytest.approx(58.05 - 60.1) and c["p_value"] is not None
    assert f"| 60.10 ± 5.76 † | -2.05 | {c['p_value']:.3f} |" in md["FedAvg"]  # †: FedBM's round is from its code


def test_a_stand_in_is_never_comparable(table, tmp_path):
    cells, md = table
    c = cells[("FedAvg on Fashion-MNIST", "dirichlet-0.1", "accuracy")]
    assert c["protocol_differs"] == "not comparable: a stand-in (it runs fashion-mnist, not the paper's kvasir)"
    assert c["paper_mean"] is None and c["delta"] is None
    assert "not comparable: a stand-in (it runs fashion-mnist, not the paper's kvasir)" in md["FedAvg on Fashion-MNIST"]
    # a table config marked as a stand-in: no row of it is compared, although every facet matches
    cells, _ = render(tmp_path / "marked", TableSpec.parse(
        {**SPEC_YAML, "rows": ROWS[:1], "stand_in": "offline budget, tiny CNN"}, "t.yaml"))
    c = cells[("FedAvg", "dirichlet-0.05", "accuracy")]
    assert c["protocol_differs"] == "not comparable: a stand-in (offline budget, tiny CNN)" and c["delta"] is None


def test_an_overridden_row_is_never_comparable(tmp_path):
    spec = TableSpec.parse({**SPEC_YAML, "rows": ROWS[:1]}, "t.yaml")
    cells, md = render(tmp_path / "rounds", spec, ["fed.rounds=20"])
    c = cells[("FedAvg", "dirichlet-0.05", "accuracy")]
    assert c["protocol_differs"] == ("setup differs: rounds 20 vs 200; not comparable: its runs were changed on "
                                     "the command line (--set fed.rounds=20)")
    assert c["paper_mean"] is None and c["delta"] is None and c["p_value"] is None
    assert "setup differs: rounds 20 vs 200; not comparable:" in md["FedAvg"]
    # an override that changes no setup facet still makes the row incomparable
    cells, _ = render(tmp_path / "size", spec, ["data.image_size=64"])
    c = cells[("FedAvg", "dirichlet-0.05", "accuracy")]
    assert c["protocol_differs"] == ("not comparable: its runs were changed on the command line "
                                     "(--set data.image_size=64)") and c["delta"] is None
    # where the data is read from changes nothing: still comparable
    cells, _ = render(tmp_path / "root", spec, ["data.root=/elsewhere"])
    assert cells[("FedAvg", "dirichlet-0.05", "accuracy")]["delta"] is not None


def test_protocol_facets_name_each_setup_difference():
    ours = RowProtocol("global", "best-val-sum5", "fedavg",
                       {"clients": 5, "rounds": 20, "local_epochs": 2, "sample_ratio": 0.5}, "dirichlet-0.1")
    paper = {"eval": "global", "round": "best-val-sum5", "setup": KVASIR}
    assert protocol_facets(ours, paper) == [("setup", "clients 5 vs 10"), ("setup", "rounds 20 vs 200")]
    assert [f.kind for f in protocol_facets(ours, paper)] == ["setup: clients", "setup: rounds"]
    assert protocol_difference(ours, paper) == "setup differs: clients 5 vs 10, rounds 20 vs 200"
    same = RowProtocol("global", "best-val-sum5", "fedavg",
                       {"clients": 10, "rounds": 200, "local_epochs": 2, "sample_ratio": 0.5}, "dirichlet-0.1")
    assert protocol_facets(same, paper) == []
    # a centralised row: one client, rounds x local epochs epochs; a paper that records no setup for it
    central = RowProtocol("global", "max-test-acc", "clip-ft-central", {"clients": 1, "epochs": 100})
    assert protocol_difference(central, {"eval": "global", "round": "max-test-acc",
                                         "setup": {"clients": 1, "epochs": 50}}) == "setup differs: epochs 100 vs 50"
    assert protocol_difference(central, {"eval": "global", "round": "max-test-acc", "setup": {}}) is None


# ---- every paper table records its setup ---------------------------------------------------------
NOT_FEDERATED = {"Central Learning", "Centralized", "CLIP-ZS", "CLIP-FC-Centralized", "L_tSamp (Centralized)"}


def test_every_published_cell_has_its_setup_and_its_source():
    cells = load_paper_numbers()
    assert len(cells) == 734
    for c in cells:
        proto = c["protocol"]
        setup = proto["setup"]
        assert proto.get("setup_source"), (c["paper"], c["table"], c["method"])
        assert setup["partition"] == c["partition"]
        if c["method"] in NOT_FEDERATED:
            continue
        assert {"clients", "rounds", "local_epochs", "sample_ratio"} <= set(setup), (c["paper"], c["table"], c["dataset"])
    by = {(c["paper"], c["table"], c["dataset"], c["method"], c["partition"]): c["protocol"]["setup"] for c in cells}
    assert by[("fedbm", "II", "kvasir", "FedAvg", "dirichlet-0.1")] == KVASIR
    by = {k[:4]: v for k, v in by.items()}
    pbc = by[("fedbm", "IV", "pbc", "FedAvg")]
    assert (pbc["clients"], pbc["rounds"], pbc["local_epochs"], pbc["sample_ratio"]) == (12, 50, 10, 0.5)
    assert by[("fedbm", "V", "femnist", "FedAvg")]["clients"] == 35
    assert by[("facmic", "2", "sc", "FedAVG")]["rounds"] == 50 and by[("facmic", "2", "bt", "FedAVG")]["rounds"] == 100
    assert by[("facmic", "2", "bt", "Centralized")] == {"clients": 1, "epochs": 100, "partition": "none"}
    assert by[("fednpr", "3", "fed-isic2019", "FedAvg")]["clients"] == 6
    assert by[("fednpr", "3", "rsna-ich", "FedAvg")]["clients"] == 10
    assert by[("fstcbdg", "2", "cifar10", "FedNTD")]["sample_ratio"] == 0.1
    assert by[("fstcbdg", "1", "cifar10", "CLIP-ZS")] == {"partition": "iid"}  # nothing trains


# ---- coverage counts per facet -------------------------------------------------------------------
DEMO = {
    "paper": "demo", "title": "A fixture paper", "source": "nowhere.txt",
    "tables": [{"id": "T1", "kind": "comparison", "caption": "comparison",
                "protocol": {"eval": "global", "round": "best-val-acc",
                             "setup": {"clients": 10, "rounds": {"digits": 200}, "local_epochs": 1, "sample_ratio": 1.0},
                             "setup_source": "Sec. 4"},
                "cells": [{"dataset": "digits", "partition": p, "method": m, "metric": "accuracy", "mean": 50.0,
                           "std": 1.0, "setting": None}
                          for p in ("dirichlet-0.1", "iid") for m in ("FedAvg", "FedProx", "Scaffold", "MOON")]}],
}
CONFIG = {
    "table": "demo", "dataset": "digits", "paper": "demo", "columns": ["dirichlet-0.1", "iid"], "seeds": [0],
    "metrics": ["accuracy"],
    "base": {"data": {"name": "digits"}, "partition": {"num_clients": 10}, "fed": {"rounds": 200}},
    "rows": [
        {"label": "FedAvg", "method": {"name": "fedavg"}},  # the paper's setup: covered
        {"label": "FedProx", "method": {"name": "fedprox"}, "fed": {"rounds": 20}},  # rounds
        {"label": "Scaffold", "method": {"name": "scaffold"}, "partition": {"num_clients": 5},
         "fed": {"rounds": 20, "local_epochs": 2}},  # clients, rounds, local epochs
        {"label": "MOON", "method": {"name": "moon"}, "partition": {"args": {"beta": 0.3}}},  # partition (dirichlet column)
    ],
}


def test_coverage_counts_setup_differences_per_facet(tmp_path):
    (tmp_path / "paper").mkdir()
    (tmp_path / "configs").mkdir()
    (tmp_path / "paper" / "demo.json").write_text(json.dumps(DEMO))
    (tmp_path / "configs" / "demo_digits.yaml").write_text(yaml.safe_dump(CONFIG))
    result = coverage(str(tmp_path / "configs"), str(tmp_path / "paper"))
    assert result["errors"] == []
    assert (result["summary"]["demo"]["covered"], result["summary"]["demo"]["total"]) == (3, 8)  # FedAvg x2, MOON iid
    assert result["differs_by"] == {"setup: rounds": 4, "setup: clients": 2, "setup: local_epochs": 2,
                                    "setup: partition": 1}
    got = {(e["method"], e["partition"]): e for e in result["cells"]}
    assert got[("FedProx", "iid")]["reason"] == "setup differs: rounds 20 vs 200 (demo_digits.yaml, row 'FedProx')"
    assert got[("Scaffold", "dirichlet-0.1")]["reason"].startswith(
        "setup differs: clients 5 vs 10, rounds 20 vs 200, local epochs 2 vs 1")
    assert got[("MOON", "dirichlet-0.1")]["reason"].startswith("setup differs: partition dirichlet-0.3 vs dirichlet-0.1")
    assert got[("MOON", "iid")]["covered"]  # an iid column has no beta to differ in
    text = format_report(result)
    assert "Not comparable although a row finds the cell: 5 cells; by facet" in text
    assert "  setup: rounds: 4" in text and "  setup: partition: 1" in text


def test_shipped_configs_counts_per_facet():
    """The shipped configs against the papers: the only cells a row finds but cannot compare are FedBM's
    FedProto (the paper does not state what it evaluates); every other found cell runs the paper's setup."""
    result = coverage()
    assert result["errors"] == []
    covered = sum(s["covered"] for s in result["summary"].values())
    total = sum(s["total"] for s in result["summary"].values())
    assert (covered, total) == (716, 734)
    assert result["differs_by"] == {"evaluation not stated": 18}
    assert not any(k.startswith("setup") for k in result["differs_by"])
