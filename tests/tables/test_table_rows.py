"""Ablation rows of a table config: record_tag keeps runs apart, average_of derives a row (FACMIC Table 4)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_tables import fake_record

from bench.assembly.records import record_path, run_record_path
from bench.commands.coverage import coverage
from bench.core.atomic_io import write_json
from bench.core.errors import FedbenchError
from bench.reporting.tables import render_table
from bench.scheduling.table_runner import distinct_runs, plan_runs
from bench.tables.table_spec import TableSpec

RAW = {  # the table config as its YAML file holds it
    "table": "facmic_t4", "dataset": "bt", "paper": "facmic", "columns": ["iid"], "seeds": [0, 1],
    "metrics": ["accuracy"], "round_rule": "max-test-acc",
    # FACMIC's BT setup (Sec. 3.2: 3 clients, 100 rounds x 1 local epoch, every client every round), so that its
    # Table 4 cells are comparable; the records below are fakes of three evaluated rounds
    "base": {"data": {"name": "brain-tumor"}, "partition": {"num_clients": 3}, "fed": {"rounds": 100}},
    "rows": [
        {"label": "bs 4", "method": {"name": "facmic", "args": {"lmmd_weight": 0.1}}, "fed": {"batch_size": 4},
         "record_tag": "bs4", "paper_method": "FACMIC", "paper_table": 4, "paper_setting": "batch_size=4"},
        {"label": "bs 8", "method": {"name": "facmic", "args": {"lmmd_weight": 0.1}}, "fed": {"batch_size": 8},
         "record_tag": "bs8", "paper_method": "FACMIC", "paper_table": 4, "paper_setting": "batch_size=8"},
        {"label": "Avg", "average_of": ["bs 4", "bs 8"], "paper_method": "FACMIC", "paper_table": 4,
         "paper_setting": "batch_size=avg"},
    ],
}
SPEC = TableSpec.parse(RAW, "t4.yaml")
ACC = {("bs 4", 0): 60.0, ("bs 4", 1): 62.0, ("bs 8", 0): 70.0, ("bs 8", 1): 76.0}


def test_record_tag_separates_runs_that_differ_only_in_unnamed_options(tmp_path):
    runs = plan_runs(SPEC, str(tmp_path))
    paths = {record_path(r.cfg.output_dir, r.cfg.experiment, r.cfg.run_name()) for r in distinct_runs(runs)}
    assert len(paths) == 4  # 2 batch sizes x 2 seeds; the Avg row runs nothing of its own
    assert {p.parent.name for p in paths} == {"facmic_t4_bt-bs4", "facmic_t4_bt-bs8"}
    untagged = TableSpec.parse({**RAW, "rows": [{k: v for k, v in r.items() if k != "record_tag"} for r in RAW["rows"]]},
                               "t4.yaml")
    # without tags the batch sizes still write their own records: a record's name holds its whole result
    # config (issue 27); the tag only makes the directory readable
    assert len({run_record_path(r.cfg) for r in distinct_runs(plan_runs(untagged, str(tmp_path)))}) == 4
    with pytest.raises(FedbenchError, match="t4.yaml: row 'bs 4': record_tag must be"):  # when the config is read
        TableSpec.parse({**RAW, "rows": [{**RAW["rows"][0], "record_tag": "a/b"}]}, "t4.yaml")


def test_average_row_is_the_per_seed_mean_of_its_rows(tmp_path):
    runs = plan_runs(SPEC, str(tmp_path / "runs"))
    for run in runs:
        if run.label in ("bs 4", "bs 8"):
            rec = fake_record(run, ACC[(run.label, run.seed)])
            rec["backbone"] = f"frozen CLIP 'tiny-random' (fixed-seed RANDOM weights) bs{run.cfg.fed.batch_size}"
            write_json(record_path(run.cfg.output_dir, run.cfg.experiment, run.cfg.run_name()), rec)
    paths = render_table(SPEC, runs, str(tmp_path / "tables"))
    cells = {(c["method"], c["metric"]): c for c in json.loads(Path(paths["json"]).read_text())["cells"]}
    avg = cells[("Avg", "accuracy")]
    assert avg["values"] == [65.0, 69.0] and avg["mean"] == pytest.approx(67.0)
    assert avg["paper_source"] == "facmic Table 4"
    md = Path(paths["md"]).read_text()
    assert "Avg: per seed, the mean of rows bs 4, bs 8." in md
    assert "Weights: frozen CLIP 'tiny-random' (fixed-seed RANDOM weights) bs4 (bs 4)" in md


def test_coverage_counts_the_derived_row(tmp_path):
    import yaml

    (tmp_path / "t4.yaml").write_text(yaml.safe_dump(RAW))
    cells = {(c["table"], c["dataset"], c["setting"]): c for c in coverage(str(tmp_path), papers=["facmic"])["cells"]}
    for setting in ("batch_size=4", "batch_size=8", "batch_size=avg"):
        assert cells[("4", "bt", setting)]["covered"], setting
    assert not cells[("4", "bt", "batch_size=16")]["covered"]
    with pytest.raises(FedbenchError, match="row 'Avg': average_of must list at least two distinct labels"):
        TableSpec.parse({**RAW, "rows": [*RAW["rows"][:2], {"label": "Avg", "average_of": ["bs 4"]}]}, "t4.yaml")
    unknown = TableSpec.parse({**RAW, "rows": [*RAW["rows"][:2], {"label": "Avg", "average_of": ["bs 4", "bs 9"]}]},
                              "t4.yaml")  # labels of rows that run: known once the rows are planned
    with pytest.raises(FedbenchError, match=r"average_of must list .* rows that run \(got \['bs 4', 'bs 9'\]"):
        plan_runs(unknown)
