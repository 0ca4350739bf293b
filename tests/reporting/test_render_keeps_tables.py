"""Issue 39.1: rendering never replaces a table with a less complete one unless told to (--replace-table),
and flags that contradict --render-only are one error. Every test works on a tmp tables folder (a copy of
the committed table where it needs one), never on results/tables itself."""
from __future__ import annotations

import json
import shutil

import pytest
from conftest import REPO
from test_table_checks import GOOD, table

from bench.cli import main

TABLE2 = "table2_fashion-mnist"


def snapshot(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def cells_with_values(json_path) -> int:
    return sum(1 for c in json.loads(json_path.read_text())["cells"] if c["values"])


def test_render_only_on_a_fresh_clone_leaves_the_committed_table_as_it_is(tmp_path, capsys):
    """The README's `fedbench table --config configs/tables/table2_fashion-mnist.yaml --render-only` with no
    records (results/runs is not committed), on a copy of the committed table."""
    tables = tmp_path / "tables"
    tables.mkdir()
    for path in (REPO / "results" / "tables").glob(f"{TABLE2}*"):
        shutil.copy(path, tables / path.name)
    before = snapshot(tables)
    had = cells_with_values(tables / f"{TABLE2}.json")
    argv = ["table", "--config", str(REPO / "configs" / "tables" / f"{TABLE2}.yaml"), "--render-only",
            "--output-dir", str(tmp_path / "no-records"), "--tables-dir", str(tables)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("fedbench: error") == 1 and "Traceback" not in err
    assert (f"Not written: {tables / TABLE2}.md (and its .csv, .json, figures) has {had} cells with values, and "
            f"{had} of them would have fewer values (or say 'missing') when rendered from the run records found now"
            in err), err
    assert "pass --replace-table to overwrite it with the less complete table" in err
    assert snapshot(tables) == before  # not one byte of the .md, .csv, .json or PNGs changed


def test_a_table_losing_some_cells_is_refused_until_replace_table(tmp_path, capsys):
    argv = table(tmp_path, GOOD)
    assert main(argv) == 0
    tables = tmp_path / "tables"
    before = snapshot(tables)
    assert cells_with_values(tables / "checks_digits.json") == 2
    assert main([*argv, "--render-only"]) == 0  # the same records: as complete as before, rendered again
    for path in (tmp_path / "runs").rglob("fedprox_*.json"):
        path.unlink()  # FedProx's record gone: its cell would say missing
    capsys.readouterr()
    assert main([*argv, "--render-only"]) == 2
    err = capsys.readouterr().err
    assert "has 2 cells with values, and 1 of them would have fewer values" in err
    assert snapshot(tables) == before
    assert main([*argv, "--render-only", "--replace-table"]) == 0
    assert cells_with_values(tables / "checks_digits.json") == 1  # told to: the less complete table is written
    assert "missing" in (tables / "checks_digits.md").read_text()


@pytest.mark.parametrize("extra, named", [
    (["--force"], "--force contradicts it"),
    (["--jobs", "2"], "--jobs contradicts it"),
    (["--job-memory", "2"], "--job-memory contradicts it"),
    (["--shard", "1/2"], "--shard contradicts it"),
    (["--devices", "2"], "--devices contradicts it"),
    (["--tensorboard"], "--tensorboard contradicts it"),
    (["--force", "--jobs", "2"], "--force and --jobs contradict it"),
])
def test_flags_that_contradict_render_only_are_one_error(tmp_path, capsys, extra, named):
    argv = table(tmp_path, GOOD[:1])
    assert main([*argv, "--render-only", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("fedbench: error") == 1 and "Traceback" not in err
    assert f"--render-only runs nothing, so {named}: render with --render-only alone" in err
    assert not (tmp_path / "tables").exists() and not (tmp_path / "runs").exists()
