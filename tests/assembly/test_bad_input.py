"""Bad input gets one clear error (exit code 2, message saying what to fix) and writes no run files."""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import digits_run_argv

from bench.cli import main


def written_files(tmp_path: Path) -> list[str]:
    """Files a run left behind, outside the dataset cache."""
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
                  if p.is_file() and p.relative_to(tmp_path).parts[0] != "cache")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--method.name", "fedavgg"], "Unknown method 'fedavgg'. Did you mean 'fedavg'"),
        (["--data.name", "fashion-mnist", "--data.root", "/nonexistent/fmnist"],
         "Dataset 'fashion-mnist' not found at '/nonexistent/fmnist'. Install Debian's package"),
        (["--data.name", "kvasirr"], "Unknown dataset 'kvasirr'. Did you mean 'kvasir'"),
        (["--fed.sample_ratio", "1.5"], "fed.sample_ratio must be in (0, 1], got 1.5."),
        (["--partition.args.beta", "-1"], "partition.args.beta must be > 0, got -1."),
        (["--partition.args.bta", "0.1"], ("partition.args for the 'dirichlet' scheme has unknown option(s) ['bta']; "
                                          "'dirichlet' takes: beta (float or a list of float), min_size (int).")),
        (["--partition.scheme", "iid", "--partition.args", "{beta: 0.1}"],
         "partition.args for the 'iid' scheme has unknown option(s) ['beta']; 'iid' takes: no options."),
        (["--partition.args.min_size", "ten"], "partition.args.min_size of the 'dirichlet' scheme must be int, got 'ten'."),
        (["--fed.rounds", "0"], "fed.rounds must be >= 1, got 0."),
        (["--partition.num_clients", "60", "--partition.args", "{beta: 0.01, min_size: 0}"],
         "received no samples; use fewer clients or a larger partition.args.min_size."),
        (["--method.lr", "1e9"], "The loss became NaN/inf in round 0"),
        (["--method.name", "fedprox", "--method.args", '{"muu": 0.1}'],
         "has unknown option(s) ['muu']; 'fedprox' accepts: ['mu']"),
        (["--method.optimizer", "sgdd"], "--method.optimizer: expected one of 'sgd', 'adam', 'adamw', got 'sgdd'"),
        (["--precision", "bf16-true"], ("precision 'bf16-true' is not supported; choose one of ['32-true', "
                                        "'64-true', 'bf16-mixed', '16-mixed']")),
    ],
    ids=["unknown-method", "missing-data", "unknown-dataset", "sample-ratio", "beta", "partition-arg-typo",
         "partition-arg-of-another-scheme", "partition-arg-type", "rounds",
         "empty-client", "nan-loss", "method-arg-typo", "optimizer-typo", "precision"],
)
def test_bad_run_input_is_one_clear_error_and_writes_nothing(tmp_path, capsys, extra, message):
    try:
        code = main(digits_run_argv(tmp_path) + extra)
    except SystemExit as exc:  # jsonargparse rejects values of the wrong type/choice before running
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err
    assert "Traceback" not in err
    assert written_files(tmp_path) == []


def test_config_file_typo_names_the_key(tmp_path, capsys):
    cfg = tmp_path / "typo.yaml"
    cfg.write_text("fed:\n  roundz: 3\n")
    with pytest.raises(SystemExit) as exc:
        main(digits_run_argv(tmp_path) + ["--config", str(cfg)])
    assert exc.value.code == 2
    assert "roundz" in capsys.readouterr().err
    assert written_files(tmp_path) == ["typo.yaml"]


def test_table_config_typo_and_missing_file(tmp_path, capsys):
    bad = tmp_path / "t.yaml"
    bad.write_text("table: t\ndataset: digits\nbetas: [0.5]\nseeds: [0]\nrows: [{label: A, methd: {name: fedavg}}]\n")
    assert main(["table", "--config", str(bad), "--output-dir", str(tmp_path / "runs"),
                 "--tables-dir", str(tmp_path / "tables")]) == 2
    err = capsys.readouterr().err
    assert "row 'A' has unknown key(s) ['methd']" in err
    assert main(["table", "--config", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert "Table config" in err and "not found. Available:" in err
    assert written_files(tmp_path) == ["t.yaml"]
