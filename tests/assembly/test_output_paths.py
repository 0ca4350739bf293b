"""Issue 38.3: every file or folder name built from a config value (table, dataset, experiment, run names,
regression entry names, dashboard files) is checked in one place (bench/core/paths.py plain_name), in every
mode: `run`, `table`, `table --render-only`, `dashboard`, `regression`. A name that would leave its folder
is one error before anything is written, the same in every mode."""
from __future__ import annotations

import pytest
import yaml
from test_table_checks import GOOD, table

from bench.cli import main
from bench.core.errors import FedbenchError


def every_file(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def table_named(tmp_path, key: str, value: str) -> list[str]:
    """A tiny table config (tests/tables/test_table_checks.py) whose ``key`` (table or dataset) is ``value``; the
    config lives three folders down so that '../../../x' stays inside tmp_path."""
    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    argv = table(work, GOOD[:1])
    config = work / "t.yaml"
    spec = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**spec, key: value}))
    return argv


@pytest.mark.parametrize("key, value", [("table", "../../../x"), ("dataset", "../../../x"), ("table", "/tmp/x"),
                                        ("table", "..")])
@pytest.mark.parametrize("mode", [[], ["--render-only"]], ids=["run", "render-only"])
def test_a_table_or_dataset_name_leaving_its_folder_is_refused_in_every_table_mode(tmp_path, capsys, key, value,
                                                                                 mode):
    argv = table_named(tmp_path, key, value)
    before = every_file(tmp_path)
    assert main([*argv, *mode]) == 2
    err = capsys.readouterr().err
    assert err.count("fedbench: error") == 1 and "Traceback" not in err
    assert f"t.yaml: {key} must be a plain name: not empty, no '/' or '\\', not '.' or '..' (it names a file or " \
           f"folder in the tables and records folders); got {value!r}." in err
    assert every_file(tmp_path) == before  # nothing written, inside or outside the tables folder


def test_the_dashboard_refuses_the_same_name_and_writes_nothing(tmp_path, capsys):
    argv = table_named(tmp_path, "table", "../../../x")
    before = every_file(tmp_path)
    out = tmp_path / "a" / "b" / "c" / "dash"
    assert main(["dashboard", "--config", argv[2], "--out", str(out), "--entity", "me"]) == 2
    err = capsys.readouterr().err
    assert "t.yaml: table must be a plain name" in err and "got '../../../x'" in err
    assert every_file(tmp_path) == before


def test_a_regression_entry_name_leaving_the_references_folder_is_refused_before_running(tmp_path, capsys):
    refs = tmp_path / "a" / "b" / "refs"
    refs.mkdir(parents=True)
    config = tmp_path / "regression.yaml"
    config.write_text(yaml.safe_dump({
        "tolerance": {"test/accuracy": 1.0},
        "base": {"data": {"name": "digits", "cache_dir": str(tmp_path / "cache")}, "fed": {"rounds": 1},
                 "partition": {"num_clients": 2, "args": {"min_size": 5}}, "method": {"backbone": "simple-cnn"}, "threads": 1},
        "runs": [{"name": "../../evil", "method": {"name": "fedavg"}}]}))
    assert main(["regression", "--config", str(config), "--reference-dir", str(refs), "--update",
                 "--reason", "probe"]) == 2
    err = capsys.readouterr().err
    assert f"{config}: a run's name must be a plain name" in err and "got '../../evil'" in err
    assert every_file(tmp_path) == {"regression.yaml"}  # nothing ran, no reference written anywhere


@pytest.mark.parametrize("experiment", ["../x", "a/b", "..", "x\\..\\y", " x"])
def test_a_run_refuses_a_path_like_experiment_with_the_same_message(experiment, capsys, tmp_path):
    assert main(["run", "--data.name", "digits", "--experiment", experiment, "--output_dir",
                 str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert f"experiment must be a plain name: not empty, no '/' or '\\', not '.' or '..' (it names a file or " \
           f"folder in the output folder); got {experiment!r}." in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", ["table2_fashion-mnist", "t2__reduced-1a2b3c4d", "fedavg_digits_dir0.5_c4_s0_ab12cd34",
                                  "x..y", ".hidden"])
def test_plain_names_pass(name):
    from bench.core.paths import plain_name

    assert plain_name(name, "x") == name


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a\\b", "/abs", "a\nb", "a\0b", " a", None, 3])
def test_anything_else_is_refused(name):
    from bench.core.paths import plain_name

    with pytest.raises(FedbenchError, match=r"x must be a plain name"):
        plain_name(name, "x")
