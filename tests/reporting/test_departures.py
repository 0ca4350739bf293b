"""Every departure of docs/departures.md has an id and a rule in docs/departures.yaml, and the rendered tables
print beside each row the ids of the departures that can move it (Markdown label, CSV and JSON ``departures``,
the W&B table), with each id's text in the legend (issue 37.3)."""
from __future__ import annotations

import csv
import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from test_tables import fake_record

from bench.assembly.records import record_path
from bench.core.atomic_io import write_json
from bench.core.errors import FedbenchError
from bench.reporting.departures import DOC_FILE, doc_ids, load_departures
from bench.reporting.tables import render_table
from bench.scheduling.table_runner import plan_runs
from bench.tables.table_spec import TableSpec
from lightning_modules.base import METHODS

FEDBM_OWN = "FBM-26 FBM-27 FBM-28 FBM-29 FBM-30 FBM-31 FBM-32 FBM-33"  # its logits, generator and AUC

def test_the_doc_and_the_rules_list_the_same_ids_once_each():
    ids, bare = doc_ids(DOC_FILE.read_text(encoding="utf-8"))
    assert bare == [], "departure lines without an id"
    assert [i for i, n in Counter(ids).items() if n > 1] == []
    rules = load_departures()
    assert sorted(ids) == sorted(rules) and len(ids) >= 45


def test_a_line_without_an_id_is_found():
    text = "# T\n\nintro\n- not a departure (no section yet)\n\n## S\n\n- **FBM-1** one\n- two, no id\n"
    assert doc_ids(text) == (["FBM-1"], ["- two, no id"])


def test_the_rules_name_registered_methods_and_existing_tables():
    tables = {yaml.safe_load(p.read_text())["table"] for p in (REPO / "configs" / "tables").glob("*.yaml")}
    for dep in load_departures().values():
        assert set(dep.methods or ()) | set(dep.not_methods) <= set(METHODS.names()), dep.id
        assert set(dep.tables) <= tables, dep.id
        assert len(dep.text) <= 160, dep.id


def write_rules(tmp_path: Path, entry: str) -> Path:
    path = tmp_path / "departures.yaml"
    path.write_text(f"sections:\n  FBM: [table2]\ndepartures:\n  {entry}\n")
    return path


@pytest.mark.parametrize("entry, says", [
    ("FBM-1: {methodz: [fedbm], text: x}", "unknown keys ['methodz']"),
    ("XYZ-1: {text: x}", "an id is <section>-<number>"),
    ("FBM-01: {text: x}", "an id is <section>-<number>"),
    ("FBM-1: {methods: [fedbm]}", "'text' must be one non-empty line"),
    ("FBM-1: {methods: fedbm, text: x}", "'methods' must be a non-empty list"),
    ("FBM-1: {when: {method.optimiser: sgd}, text: x}", "not a run config field"),
    ("FBM-1: {when: {method.args: sgd}, text: x}", "name one method argument"),
])
def test_a_bad_rule_is_one_clear_error_naming_the_file(tmp_path, entry, says):
    with pytest.raises(FedbenchError, match="departures.yaml") as err:
        load_departures(write_rules(tmp_path, entry))
    assert says in str(err.value)


SPEC = TableSpec.parse({
    "table": "table2", "dataset": "oct-c8", "paper": "fedbm", "betas": [0.05, 0.1], "seeds": [0, 1],
    "metrics": ["accuracy"], "round_rule": "best-val-sum5",
    "base": {"data": {"name": "oct-c8"}, "partition": {"num_clients": 12},
             "fed": {"rounds": 200, "local_epochs": 2, "sample_ratio": 0.5, "lr_decay": 0.99},
             "method": {"optimizer": "sgd"}},
    "rows": [
        {"label": "FedAvg", "method": {"name": "fedavg"}, "paper_method": "FedAvg"},
        {"label": "FedBM", "method": {"name": "fedbm", "args": {"text_encoder": "minilm"}}, "paper_method": "FedBM"},
        {"label": "FedProto (client models)", "method": {"name": "fedproto"}, "fed": {"protocol": "local_mean"}},
        {"label": "Adam FedAvg", "method": {"name": "fedavg", "optimizer": "adam"}},
    ],
}, "t.yaml")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("departures")
    runs = plan_runs(SPEC, str(tmp / "runs"))
    for i, run in enumerate(runs):
        write_json(record_path(run.cfg.output_dir, run.cfg.experiment, run.cfg.run_name()),
                   fake_record(run, 50.0 + i, "local_mean" if "client models" in run.label else "global"))
    return runs, render_table(SPEC, runs, str(tmp / "tables"))


def md_rows(md: str) -> dict[str, str]:
    """row label (without its mark) -> its departure mark, from the first Markdown block."""
    out = {}
    for line in md.split("| Method |")[1].split("\n\n")[0].splitlines()[2:]:
        label = line.split(" | ")[0][2:]
        name, _, mark = label.partition(" <sup>")
        out[name] = mark.removesuffix("</sup>")
    return out


def test_each_row_carries_the_ids_of_the_departures_that_can_move_it(rendered):
    _, paths = rendered
    md = Path(paths["md"]).read_text()
    rows = md_rows(md)
    # FedBM on OCT-C8: its concept names (FBM-11, fedbm/fedcb on oct-c8 only); every SGD row of FedBM's tables:
    # optimiser (FBM-1), lr decay (FBM-2), round rule (FBM-3), seeds (FBM-10) and spread (FBM-16)
    assert rows["FedBM"] == ("FBM-1, FBM-2, FBM-3, FBM-4, FBM-10, FBM-11, FBM-16, FBM-26, FBM-27, FBM-28, FBM-29, "
                             "FBM-30, FBM-31, FBM-32, FBM-33")  # and its generator's (FBM-27..32), logits (26), AUC (33)
    assert rows["FedAvg"] == "FBM-1, FBM-2, FBM-3, FBM-4, FBM-10, FBM-16"  # not FedBM's concept names
    # scored on the clients' models: not the aggregated model's evaluation (FBM-4); FedProto's own two
    assert rows["FedProto (client models)"] == "FBM-1, FBM-2, FBM-3, FBM-6, FBM-7, FBM-10, FBM-16, FBM-22"
    assert rows["Adam FedAvg"] == "FBM-2, FBM-3, FBM-4, FBM-10, FBM-16"  # the text's Adam: FBM-1 does not move it
    rules = load_departures()
    legend = md.split("| Method |")[0]
    used = ["FBM-1", "FBM-2", "FBM-3", "FBM-4", "FBM-6", "FBM-7", "FBM-10", "FBM-11", "FBM-16", "FBM-22", "FBM-26",
            "FBM-27", "FBM-28", "FBM-29", "FBM-30", "FBM-31", "FBM-32", "FBM-33"]
    assert [line[4:].split(":")[0] for line in legend.splitlines() if line.startswith("  - ")] == used
    for i in used:
        assert f"  - {i}: {rules[i].text}" in legend
    assert "FBM-9" not in md  # Central Learning's departure: no Central row here


def test_the_csv_and_json_hold_each_cells_ids(rendered):
    _, paths = rendered
    with open(paths["csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    by = {(r["method"], r["beta"]): r["departures"] for r in rows}
    assert by[("FedBM", "0.05")] == by[("FedBM", "0.1")] == "FBM-1 FBM-2 FBM-3 FBM-4 FBM-10 FBM-11 FBM-16 " + FEDBM_OWN
    assert "FBM-11" not in by[("FedAvg", "0.05")] and by[("FedAvg", "0.05")].split()[0] == "FBM-1"
    doc = json.loads(Path(paths["json"]).read_text())
    cells = {(c["method"], c["beta"]): c["departures"] for c in doc["cells"]}
    assert cells[("FedBM", 0.1)] == by[("FedBM", "0.1")].split()
    assert doc["departures"]["FBM-11"] == load_departures()["FBM-11"].text
    assert "FBM-9" not in doc["departures"]


def test_the_wandb_table_has_the_departures_column(rendered, tmp_path, monkeypatch):
    from bench.tracking.wandb_logger import log_table

    _, paths = rendered
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    table = json.loads(Path(paths["json"]).read_text())
    log_table(table, paths["csv"], {}, "fedbench-test", str(tmp_path / "wandb"))
    (logged,) = (tmp_path / "wandb").rglob("*.table.json")
    logged = json.loads(logged.read_text())
    rows = [dict(zip(logged["columns"], row)) for row in logged["data"]]
    marks = {(r["method"], r["beta"]): r["departures"] for r in rows}
    assert marks[("FedBM", 0.05)] == "FBM-1 FBM-2 FBM-3 FBM-4 FBM-10 FBM-11 FBM-16 " + FEDBM_OWN
    assert "FBM-11" not in marks[("FedAvg", 0.05)]


def test_a_table_no_departure_covers_prints_no_mark(tmp_path):
    spec = dataclasses.replace(SPEC, table="mine", papers=(), rows=SPEC.rows[:1])
    runs = plan_runs(spec, str(tmp_path / "runs"))
    for run in runs:
        write_json(record_path(run.cfg.output_dir, run.cfg.experiment, run.cfg.run_name()), fake_record(run, 50.0))
    md = Path(render_table(spec, runs, str(tmp_path / "tables"))["md"]).read_text()
    assert "<sup>" not in md and "Departures from" not in md and "| FedAvg | 50.00 ± 0.00 (at chance) |" in md


def test_the_committed_tables_of_a_departure_section_are_those_the_rules_cover():
    """Every committed table config's `table:` is covered by some section (so its rows can carry marks)."""
    text = yaml.safe_load((REPO / "docs" / "departures.yaml").read_text())
    covered = {t for tables in text["sections"].values() for t in tables}
    names = {yaml.safe_load(p.read_text())["table"] for p in (REPO / "configs" / "tables").glob("*.yaml")}
    assert names <= covered, sorted(names - covered)


def committed_marks(config: str) -> dict[str, set[str]]:
    """row label -> the ids its rows carry, for a committed table config (no records needed)."""
    from bench.reporting.departures import table_departures
    from bench.reporting.paper_compare import row_protocols
    from bench.scheduling.table_runner import load_table_config

    spec = load_table_config(str(REPO / "configs" / "tables" / config))
    runs = plan_runs(spec, "/nonexistent/runs", check_records=False)
    out: dict[str, set[str]] = {}
    for (label, _), ids in table_departures(spec.table, runs, row_protocols(spec, runs)).items():
        out.setdefault(label, set()).update(ids)
    return out


def test_the_committed_tables_rows_carry_their_methods_departures():
    fac = committed_marks("facmic_table2.yaml")
    assert "FAC-9" in fac["FedProx (BT)"] and "FAC-9" not in fac["FedAVG (BT)"]  # FedProx's squared term
    assert {"FAC-7", "FAC-8"} <= fac["FACMIC (BT)"] and not {"FAC-7", "FAC-8"} & fac["FedCLIP (BT)"]
    assert "FAC-6" in fac["FedAVG (BT)"] and "FAC-6" not in fac["CLIP-ZS (BT)"]  # zero-shot: no partition
    assert "FAC-2" in fac["FedAVG (Real)"] and "FAC-1" not in fac["FedAVG (Real)"]  # Real: its own
    fst = committed_marks("fstcbdg_cifar10.yaml")
    assert "FST-3" in fst["FST-CBDG (C10)"] and "FST-3" not in fst["L_iST only (C10)"]  # no text sampling: no sigma
    assert "FST-6" in fst["Equal sampling (C10)"] and "FST-6" not in fst["Balanced sampling (C10)"]
    assert fst["CLIP-ZS (C10)"] == set()
    npr = committed_marks("fednpr_ich.yaml")
    assert {"NPR-2", "NPR-10"} <= npr["FedAvg"] and "NPR-6" in npr["FedNPR"]
    assert "NPR-6" not in npr["FedNPR (public code)"]  # the code assigns sub-clusters at random: no Sinkhorn
    assert "NPR-2" not in committed_marks("fednpr_isic.yaml")["FedAvg"]  # the ICH stem: not on Fed-ISIC2019
