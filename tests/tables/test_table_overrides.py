"""`fedbench table --set/--seeds/--rows`: typed overrides on every run, clear errors with close-match hints,
overridden runs in their own experiment with their overrides, and a reduced table labelled and filed apart."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO
from test_tables import SPEC, SPEC_YAML, fake_record

from bench.assembly.records import record_path
from bench.cli import main
from bench.core.atomic_io import write_json
from bench.core.errors import FedbenchError
from bench.reporting.tables import render_table
from bench.scheduling.table_runner import plan_runs
from bench.tables.table_overrides import TableOverrides
from bench.tables.table_spec import TableSpec

CB_SPEC = TableSpec.parse({**SPEC_YAML, "rows": [*SPEC_YAML["rows"], {"label": "FedCB, tau 10",
                                                                     "method": {"name": "fedcb", "args": {"tau": 10}}}]},
                          "t.yaml")


def planned(spec: TableSpec, *sets: str, seeds: str | None = None, rows: list[str] | None = None, out: str = "runs"):
    ov = TableOverrides.parse(spec, list(sets), seeds, rows)
    runs = plan_runs(ov.select(spec), out)
    ov.apply(runs)
    return ov, runs


def test_values_are_typed_by_the_option():
    ov, runs = planned(SPEC, "fed.rounds=2", "fed.sample_ratio=1", "data.root=2024", "data.image_size=null",
                       "fed.weighting=uniform", "fed.lr_milestones=[3, 5]", "threads=1")
    assert ov.sets == {"fed.rounds": 2, "fed.sample_ratio": 1.0, "data.root": "2024", "data.image_size": None,
                       "fed.weighting": "uniform", "fed.lr_milestones": [3, 5], "threads": 1}
    for run in runs:
        c = run.cfg
        assert (c.fed.rounds, c.fed.sample_ratio, c.data.root, c.data.image_size, c.fed.weighting) == (
            2, 1.0, "2024", None, "uniform")
        assert isinstance(c.fed.sample_ratio, float) and c.fed.lr_milestones == [3, 5] and c.threads == 1
        assert c.partition.num_clients == SPEC.base["partition"]["num_clients"] == 10  # untouched: the config's


def test_overrides_beat_row_options_and_method_args_go_where_accepted():
    ov, runs = planned(CB_SPEC, "fed.rounds=1", "method.args.tau=25")
    assert {r.cfg.fed.rounds for r in runs} == {1}
    cb = [r for r in runs if r.cfg.method.name == "fedcb"]
    assert cb and all(r.cfg.method.args == {"tau": 25} for r in cb)
    assert all(r.cfg.method.args == {} for r in runs if r.cfg.method.name != "fedcb")  # fedavg has no tau
    assert ov.applied_to["method.args.tau"] == ["FedCB, tau 10"]


def test_a_partition_option_goes_to_the_runs_whose_scheme_takes_it():
    spec = TableSpec.parse({**SPEC_YAML, "betas": None, "columns": ["dirichlet-0.1", "iid"]}, "t.yaml")
    ov, runs = planned(spec, "partition.args.min_size=2")
    dirichlet = [r for r in runs if r.cfg.partition.scheme == "dirichlet"]
    assert dirichlet and all(r.cfg.partition.args == {"beta": 0.1, "min_size": 2} for r in dirichlet)
    assert all(r.cfg.partition.args == {} for r in runs if r.cfg.partition.scheme == "iid")  # iid takes no min_size
    assert ov.applied_to["partition.args.min_size"] == spec.labels and not ov.full_budget


@pytest.mark.parametrize(("item", "message"), [
    ("fed.round=2", "--set fed.round: unknown option. Did you mean fed.rounds, fed.test_rounds?"),
    ("data.image_sise=16", "Did you mean data.image_size, "),
    ("fed.rounds=two", "--set fed.rounds: expected int, got 'two'."),
    ("fed.rounds=2.5", "expected int"),
    ("fed.sample_ratio=yes", "expected float"),
    ("fed.weighting=equal", "--set fed.weighting: 'equal' is not one of 'samples', 'uniform'."),
    ("fed.lr_milestones=[a]", "expected int"),
    ("seed=1", "--set seed: not a run option of a table (use --seeds)."),
    ("partition.args.beta=0.3", "beta is the table's column"),
    ("partition.args={min_size: 2}", ("--set partition.args: not a run option of a table (set one option: "
                                     "partition.args.<option>=VALUE).")),
    ("partition.args.shards_per_client=3", ("--set partition.args.shards_per_client: no row's partition scheme "
                                            "accepts 'shards_per_client' (partition schemes in this table: ")),
    ("devices=2", "use --devices"),
    ("fed.rounds", "--set expects KEY=VALUE (e.g. --set fed.rounds=2), got 'fed.rounds'."),
    ("method.args.tua=5", ("--set method.args.tua: no row's method accepts 'tua' (methods in this table: "
                           "central, fedavg, fedprox, fedrep).")),
    ("fed.rounds=[1", "cannot read '[1' as a value"),
])
def test_bad_overrides_are_one_clear_error(item, message):
    with pytest.raises(FedbenchError) as err:
        planned(SPEC, item)
    assert message in str(err.value)


def test_seed_and_row_subsets():
    ov, runs = planned(CB_SPEC, seeds="0", rows=["FedAvg,Central", "FedCB, tau 10"])
    assert {(r.label, r.seed) for r in runs} == {("FedAvg", 0), ("Central", 0), ("FedCB, tau 10", 0)}
    assert ov.rows == ["FedAvg", "Central", "FedCB, tau 10"] and ov.seeds == [0]
    with pytest.raises(FedbenchError, match=r"--rows: no row 'FedAv' in this table. Did you mean 'FedAvg'\?"):
        planned(SPEC, rows=["FedAv"])
    with pytest.raises(FedbenchError, match=r"--seeds 0,7: choose among the config's seeds \[0, 1, 2\]"):
        planned(SPEC, seeds="0,7")
    with pytest.raises(FedbenchError, match="--seeds expects seeds separated by commas"):
        planned(SPEC, seeds="zero")
    full, _ = planned(SPEC, seeds="2,1,0", rows=["Central,FedAvg,FedRep (per-client),Ours only"])
    assert full.seeds == [2, 1, 0] and full.full_budget is False  # another order is still a selection...
    same, _ = planned(SPEC, seeds="0,1,2", rows=["Central,FedAvg,FedRep (per-client),Ours only"])
    assert same.full_budget  # ...the config's own seeds and rows are the full table


def test_where_records_and_tables_go():
    full, full_runs = planned(SPEC)
    budget, budget_runs = planned(SPEC, "fed.rounds=1")
    location, location_runs = planned(SPEC, "data.root=/data/kvasir", "threads=1")
    subset, subset_runs = planned(SPEC, seeds="0")
    name = "table2_kvasir"
    assert {r.cfg.experiment for r in full_runs} == {name} and full.table_name(name) == name
    # budget changes: own experiment (never the full records), own table file
    assert {r.cfg.experiment for r in budget_runs} == {budget.experiment(name)} != {name}
    assert budget.experiment(name).startswith(f"{name}__set-") and budget.table_name(name) == f"{name}__set-fed.rounds=1"
    assert planned(SPEC, "fed.rounds=2")[0].experiment(name) != budget.experiment(name)
    # where the data is / how runs execute: the config's budget, same records and table
    assert location.full_budget and {r.cfg.experiment for r in location_runs} == {name}
    assert location.table_name(name) == name and location.record() == {"overrides": location.sets}
    # a seed subset reuses the full records (same runs) but is filed as a reduced table
    assert {r.cfg.experiment for r in subset_runs} == {name} and subset.table_name(name) != name
    assert subset.table_name(name) == f"{name}__seeds-0" != budget.table_name(name)
    assert full.tables_dir("results/tables") == location.tables_dir("results/tables") == "results/tables"
    assert subset.tables_dir("results/tables") == budget.tables_dir("results/tables") == "results/tables/reduced"


def render(tmp_path, ov, runs):
    """Fake records of ``runs``, then their table rendered as `fedbench table` does under the overrides ``ov``."""
    for run in runs:
        write_json(record_path(run.cfg.output_dir, run.cfg.experiment, run.cfg.run_name()), fake_record(run, 50.0))
    return render_table(ov.select(SPEC), runs, ov.tables_dir(str(tmp_path / "tables")), name=ov.table_name("table2_kvasir"),
                        changes=ov.describe(SPEC), reduced=ov.reduced, title_note=ov.title_note())


def test_reduced_table_is_labelled_and_never_overwrites_the_full_one(tmp_path):
    """Full table rendered first; a reduced rerun renders beside it, labelled, without touching it."""
    full_paths = render(tmp_path, *planned(SPEC, out=str(tmp_path / "runs")))
    full_md = Path(full_paths["md"]).read_text()
    ov, runs = planned(SPEC, "fed.rounds=1", "method.backbone=simple-cnn", seeds="0", rows=["FedAvg"],
                       out=str(tmp_path / "runs"))
    paths = render(tmp_path, ov, runs)
    assert Path(full_paths["md"]).read_text() == full_md  # the full table is untouched
    assert Path(paths["md"]) == (tmp_path / "tables" / "reduced" /
                                 'table2_kvasir__set-fed.rounds=1_set-method.backbone=simple-cnn_seeds-0_rows-FedAvg.md')
    assert full_md.splitlines()[0] == "# table2_kvasir" and "budget" not in full_md
    md = Path(paths["md"]).read_text().splitlines()
    assert md[0] == "# table2_kvasir — REDUCED RUN, not the config's budget"
    assert md[2:7] == ["**Not run at the config's budget** (a reduced run: not comparable with the full table).",
                       "- --set fed.rounds=1", '- --set method.backbone="simple-cnn"',
                       "- seeds [0] of the config's [0, 1, 2]", "- 1 of the config's 4 rows: FedAvg"]
    table = json.loads(Path(paths["json"]).read_text())
    assert table["reduced"] is True and table["name"] == Path(paths["md"]).stem
    assert table["experiment"] == ov.experiment("table2_kvasir") != "table2_kvasir"
    assert json.loads(Path(full_paths["json"]).read_text())["reduced"] is False


def test_a_tf32_table_is_labelled_by_its_math_not_as_reduced_and_never_overwrites_the_full_one(tmp_path):
    """--set gpu_math=tf32 runs the whole budget under another numeric setting (docs/gpu.md's fastest GPU
    setting): its own records and table file beside the full one, titled by the setting, not 'REDUCED RUN';
    adding a budget cut makes it a reduced run again."""
    full_paths = render(tmp_path, *planned(SPEC, out=str(tmp_path / "runs")))
    full_md = Path(full_paths["md"]).read_text()
    ov, runs = planned(SPEC, "gpu_math=tf32", out=str(tmp_path / "runs"))
    assert not ov.reduced and not ov.full_budget and {r.cfg.gpu_math for r in runs} == {"tf32"}
    assert {r.cfg.experiment for r in runs} == {ov.experiment("table2_kvasir")} != {"table2_kvasir"}
    paths = render(tmp_path, ov, runs)
    assert Path(full_paths["md"]).read_text() == full_md
    assert Path(paths["md"]) == tmp_path / "tables" / "reduced" / "table2_kvasir__set-gpu_math=tf32.md"
    md = Path(paths["md"]).read_text().splitlines()
    assert md[0] == "# table2_kvasir — gpu_math=tf32, not the config's numeric settings"
    assert md[2].startswith("**The config's budget under other numeric settings**") and md[3] == '- --set gpu_math="tf32"'
    assert json.loads(Path(paths["json"]).read_text())["reduced"] is False
    cut, _ = planned(SPEC, "gpu_math=tf32", "fed.rounds=1")
    assert cut.reduced and cut.title_note() == " — REDUCED RUN, not the config's budget"


def test_cli_records_carry_the_overrides_and_the_subset_reuses_nothing_it_should_not(tmp_path, monkeypatch, capsys):
    """--render-only through the real CLI: the reduced table is written under its own name; the
    records of an overridden table would live in their own experiment folder (none exist yet)."""
    config = tmp_path / "t.yaml"
    config.write_text(json.dumps(SPEC_YAML))
    monkeypatch.chdir(tmp_path)
    assert main(["table", "--config", str(config), "--render-only", "--set", "fed.rounds=1", "--seeds", "0",
                 "--tables-dir", "tables", "--output-dir", "runs"]) == 0
    out = capsys.readouterr().out
    assert "REDUCED RUN" in out and "missing (0/1 seeds)" in out
    assert [p.name for p in (tmp_path / "tables").rglob("*.md")] == ["table2_kvasir__set-fed.rounds=1_seeds-0.md"]
    assert (tmp_path / "tables" / "reduced" / "table2_kvasir__set-fed.rounds=1_seeds-0.md").is_file()
    assert not (tmp_path / "runs").exists()
    assert main(["table", "--config", str(config), "--set", "fed.roundz=1"]) == 2
    assert "Did you mean fed.rounds, fed.test_rounds?" in capsys.readouterr().err


@pytest.mark.parametrize(("sets", "seeds", "rows", "name"), [
    (["fed.rounds=2", "data.image_size=64"], "0", ["FedAvg,Ours only"],
     "t__set-fed.rounds=2_set-data.image_size=64_seeds-0_rows-FedAvg,Ours-only_"),
    (["method.args.mu=0.5"], "0,1", None, "t__set-method.args.mu=0.5_seeds-0,1"),
    ([], None, ["FedRep (per-client)"], "t__rows-FedRep-per-client-_"),
])
def test_a_reduced_table_is_named_by_what_was_reduced(sets, seeds, rows, name):
    """Readable names; where a character had to be replaced, an 8-hex digest keeps distinct reductions apart."""
    ov, _ = planned(SPEC, *sets, seeds=seeds, rows=rows)
    got = ov.table_name("t")
    assert got.startswith(name) and len(got) == len(name) + (8 if name.endswith("_") else 0)
    assert ov.tables_dir("x") == str(Path("x") / "reduced")


def test_reduced_tables_are_gitignored_and_removed_by_clean_results(tmp_path):
    """results/tables/reduced/ (and the __reduced-<hash> files older versions wrote beside the tables) are
    neither tracked nor left behind by `make clean-results`; the committed tables stay."""
    ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", "results/tables/reduced/t2__seeds-0.md"],
                             cwd=REPO, check=False)
    assert ignored.returncode == 0
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    tables = tmp_path / "results" / "tables"
    (tables / "reduced").mkdir(parents=True)
    for name in ("reduced/t2__seeds-0.md", "reduced/t2__seeds-0_curves.png", "t2__reduced-1a2b3c4d.md", "t2.md", "t2.csv"):
        (tables / name).write_text("x")
    subprocess.run(["make", "-s", "clean-results"], cwd=tmp_path, check=True, capture_output=True)
    assert sorted(p.name for p in tables.rglob("*")) == ["t2.csv", "t2.md"]
