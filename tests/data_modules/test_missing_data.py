"""A table whose data is missing fails at once, before any run, with the download instructions and the
exact path looked for under the data home, exit code 2, and no files written; an unknown table config
path is a clear error."""
from __future__ import annotations

import os
import sys
import time

import pytest
from conftest import REPO, run_with_cpu

from bench.cli import main
from datamodules.data_home import DATA_HOME_ENV

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

KVASIR = str(REPO / "configs" / "tables" / "table2_kvasir.yaml")  # no data.root: found under the data home
HOW_TO_SET = "set FEDBENCH_DATA=/path/to/folder or pass --data-home /path/to/folder (default ./data)"


def instructions(home) -> str:
    """The start of the message: the exact path looked for under the data home, then what to download."""
    return (f"Dataset 'kvasir' not found: looked for '{home.resolve()}/kvasir-dataset-v2' (under the data home "
            f"'{home.resolve()}'). Download the official Kvasir-v2 archive")


def files_under(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def test_missing_kvasir_fails_before_any_run(tmp_path, monkeypatch, capsys):
    """In-process (imports already paid): the failure takes well under a second and starts no run."""
    import bench.assembly.experiment

    def no_run(*args, **kwargs):
        raise AssertionError("a run started although the data is missing")

    monkeypatch.setattr(bench.assembly.experiment, "make_fabric", no_run)
    monkeypatch.setattr(bench.assembly.experiment, "run_experiment", no_run)
    monkeypatch.chdir(tmp_path)  # ./data, results/runs and results/tables resolve under tmp_path
    monkeypatch.delenv(DATA_HOME_ENV, raising=False)
    import bench.scheduling.table_runner  # imports paid before the clock

    started = time.process_time()  # CPU time: wall time grows with the other processes' load
    code = main(["table", "--config", KVASIR])
    cpu = time.process_time() - started
    err = capsys.readouterr().err
    assert code == 2, err
    assert instructions(tmp_path / "data") in err and "https://datasets.simula.no/kvasir/" in err
    assert HOW_TO_SET in err
    assert "Traceback" not in err
    assert cpu < 8.0, cpu  # measured 1.2-1.5 s CPU (10 s wall at a load average of 8); no data decoded, no run
    assert files_under(tmp_path) == []


@pytest.mark.parametrize("how", ["flag", "env"])
def test_missing_data_names_the_given_data_home(how, tmp_path, monkeypatch, capsys):
    """--data-home and FEDBENCH_DATA both move the data home; the message names the path under it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(DATA_HOME_ENV, raising=False)
    home = tmp_path / "elsewhere"
    argv = ["table", "--config", KVASIR, "--set", "fed.rounds=1"]
    if how == "flag":
        argv += ["--data-home", str(home)]
    else:
        monkeypatch.setenv(DATA_HOME_ENV, str(home))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert instructions(home) in err and HOW_TO_SET in err
    assert files_under(tmp_path) == []


def test_explicit_data_root_wins_over_the_data_home(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(DATA_HOME_ENV, str(tmp_path / "home"))
    assert main(["table", "--config", KVASIR, "--set", f"data.root={tmp_path / 'mine'}"]) == 2
    err = capsys.readouterr().err
    assert f"Dataset 'kvasir' not found at '{tmp_path / 'mine'}'. Download" in err
    assert "--data.root" in err and "home" not in err.split("Download")[0]
    assert files_under(tmp_path) == []


def test_missing_kvasir_cli_exit_code(tmp_path):
    """The real command: exit code 2, the instructions on stderr, nothing written."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}
    env.pop(DATA_HOME_ENV, None)
    proc, cpu = run_with_cpu([sys.executable, "-m", "bench.cli", "table", "--config", KVASIR], cwd=tmp_path,
                             env=env, timeout=1800)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert instructions(tmp_path / "data") in proc.stderr and "Traceback" not in proc.stderr
    assert files_under(tmp_path) == []
    # CPU, not wall time (110 s wall for 17 s CPU under a load average of 8): measured 15.9-17.4 s, mostly
    # importing torch/lightning; the check itself is instant (test above), a run would take minutes
    assert cpu < 60.0, cpu


def test_unknown_table_config_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert main(["table", "--config", "configs/tables/table2_kvasirr.yaml"]) == 2
    err = capsys.readouterr().err
    assert "Table config 'configs/tables/table2_kvasirr.yaml' not found. Available:" in err
    assert "table2_kvasir.yaml" in err
