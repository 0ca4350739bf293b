"""A table whose data is missing fails at once, before any run, with the download instructions,
exit code 2, and no files written; an unknown table config path is a clear error."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from conftest import REPO

from bench.cli import main

KVASIR = str(REPO / "configs" / "tables" / "table2_kvasir.yaml")  # data.root: data/kvasir (relative)
INSTRUCTIONS = "Dataset 'kvasir' not found at 'data/kvasir'. Download the official Kvasir-v2 archive"


def files_under(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def test_missing_kvasir_fails_before_any_run(tmp_path, monkeypatch, capsys):
    """In-process (imports already paid): the failure takes well under a second and starts no run."""
    import bench.experiment

    def no_run(*args, **kwargs):
        raise AssertionError("a run started although the data is missing")

    monkeypatch.setattr(bench.experiment, "make_fabric", no_run)
    monkeypatch.setattr(bench.experiment, "run_experiment", no_run)
    monkeypatch.chdir(tmp_path)  # data/kvasir, results/runs and results/tables resolve under tmp_path
    started = time.perf_counter()
    code = main(["table", "--config", KVASIR])
    elapsed = time.perf_counter() - started
    err = capsys.readouterr().err
    assert code == 2, err
    assert INSTRUCTIONS in err and "https://datasets.simula.no/kvasir/" in err
    assert "Traceback" not in err
    assert elapsed < 5.0
    assert files_under(tmp_path) == []


def test_missing_kvasir_cli_exit_code(tmp_path):
    """The real command: exit code 2, the instructions on stderr, nothing written."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "bench.cli", "table", "--config", KVASIR], check=False,
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - started
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert INSTRUCTIONS in proc.stderr and "Traceback" not in proc.stderr
    assert files_under(tmp_path) == []
    assert elapsed < 30.0  # mostly importing torch/lightning; the check itself is instant (test above)


def test_unknown_table_config_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert main(["table", "--config", "configs/tables/table2_kvasirr.yaml"]) == 2
    err = capsys.readouterr().err
    assert "Table config 'configs/tables/table2_kvasirr.yaml' not found. Available:" in err
    assert "table2_kvasir.yaml" in err
