"""The command line follows one convention (issue 30): `fedbench list` names everything registered, a typo
gets the closest flag, `run` and `table` accept the same spellings, and every example of `fedbench --help` runs."""
from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest
from conftest import REPO

from bench.cli import COMMANDS, command_module, main, parse_run, run_parser
from bench.scheduling.table_runner import load_table_config
from bench.tables.flags import respell, spellings
from datamodules.base import DATASETS
from datamodules.data_home import DATA_HOME_ENV
from datamodules.partition import SCHEMES
from lightning_modules.base import METHODS

TABLE = str(REPO / "configs" / "tables" / "table2_fashion-mnist.yaml")


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argument errors exit from the parser, as argparse's do
        return exc.code


def test_list_names_every_registered_method_dataset_and_scheme(tmp_path, capsys):
    (tmp_path / "kvasir-dataset-v2").mkdir()
    assert main(["list", "--data_home", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    sections = dict(zip(("methods", "datasets", "schemes"), out.split("\n\n"), strict=True))
    for section, names in (("methods", METHODS.names()), ("datasets", DATASETS.names()), ("schemes", SCHEMES)):
        listed = [line.split()[0] for line in sections[section].splitlines()[1:]]
        assert listed == sorted(names) if section != "schemes" else listed == list(names), section
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "McMahan" in lines["fedavg"] and "FedProx (Li et al., 2020)" in lines["fedprox"]  # the paper, one line
    assert "kvasir-dataset-v2/" in lines["kvasir"] and f"found at {tmp_path.resolve()}/kvasir-dataset-v2" in lines["kvasir"]
    assert "manual" in lines["oct-c8"] and "OCT-C8/" in lines["oct-c8"]  # present / fetchable / manual
    assert "fetchable" in lines["cifar10"] and "present" in lines["kvasir"]
    assert "near-equal parts" in lines["iid"]
    assert str(tmp_path.resolve()) in out.splitlines()[len(METHODS.names()) + 2]  # the data home the paths are under


def test_help_names_list():
    assert re.search(r"^\s+fedbench list\b", main.__globals__["__doc__"], re.MULTILINE)


@pytest.mark.parametrize(("argv", "suggestion"), [
    (["run", "--fed.rouns", "3"], "unrecognized arguments: --fed.rouns 3; did you mean --fed.rounds?"),
    (["run", "--output-dirr", "x"], "did you mean --output_dir?"),
    (["table", "--config", TABLE, "--output_dirr", "x"], "did you mean --output-dir?"),
    (["table", "--config", TABLE, "--fed.rounds", "3"], "a run option goes through --set: --set fed.rounds=3"),
], ids=["run", "run-other-spelling", "table", "table-run-option"])
def test_a_typo_is_one_error_line_with_the_closest_flag(tmp_path, capsys, argv, suggestion):
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert suggestion in err
    assert len(err.strip().splitlines()) == 1, err  # no usage dump, no traceback
    assert not (tmp_path / "x").exists()


# flags both commands have, in both spellings: (flag, value, what run's config / table's args hold then)
SHARED = [("--output-dir", "out", "out"), ("--output_dir", "out", "out"),
          ("--data-home", "home", "home"), ("--data_home", "home", "home"),
          ("--devices", "1", 1), ("--wandb", None, True), ("--wandb", "true", True), ("--wandb", "false", False)]


@pytest.mark.parametrize(("flag", "value", "expected"), SHARED,
                         ids=[f"{f}={v}" for f, v, _ in SHARED])
def test_run_and_table_accept_the_same_spellings(tmp_path, monkeypatch, flag, value, expected):
    monkeypatch.setenv(DATA_HOME_ENV, "unset")
    given = [flag] + ([value] if value is not None else [])
    cfg = parse_run(given)
    args = command_module("table").build_parser().parse_args(["--config", TABLE, *given])
    key = spellings(flag)[0][2:]
    if key == "data_home":  # run sets the data home for itself and its ranks
        assert args.data_home == "home" and os.environ[DATA_HOME_ENV] == str(Path("home").resolve())
    else:
        assert getattr(cfg, key) == getattr(args, key) == expected
    # a bare boolean before another flag: still true, and the next flag still read
    if value is None:
        assert parse_run([flag, "--seed", "3"]).seed == 3


def test_every_run_flag_takes_either_spelling(capsys):
    known = run_parser()._option_string_actions
    for flag in (f for f in known if f.startswith("--") and not f.endswith("+")):
        for other in spellings(flag):
            assert respell([other, "x"], known) == [flag, "x"]
    for flag in ("--print-config", "--print_config"):
        assert exit_code(["run", flag]) == 0
        assert "fed:\n  rounds: 10" in capsys.readouterr().out
    assert parse_run(["--data.max-train-samples", "7", "--fed.local-epochs=2"]).data.max_train_samples == 7


def help_examples() -> list[list[str]]:
    """Each `fedbench ...` line of `fedbench --help` as argv, once without its [optional] parts and once with
    all of them."""
    out = []
    for line in main.__globals__["__doc__"].splitlines():
        line = line.split("  #")[0].strip()
        if not line.startswith("fedbench "):
            continue
        for variant in (re.sub(r"\s*\[[^\]]*\]", "", line), re.sub(r"[\[\]]", "", line)):
            argv = shlex.split(variant)[1:]
            if argv not in out:
                out.append(argv)
    return out


def test_every_help_example_runs(tmp_path, monkeypatch, capsys):
    """Every example's config files exist and its command parses; the quick run and `list` run for real."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv(DATA_HOME_ENV, str(tmp_path / "home"))
    examples = help_examples()
    assert {argv[0] for argv in examples} == set(COMMANDS)  # every command has an example
    ran = 0
    for argv in examples:
        command, rest = argv[0], argv[1:]
        for path in (t for t in rest if t.endswith((".yaml", ".yml"))):
            assert (REPO / path).is_file(), f"`fedbench {shlex.join(argv)}` names a missing file {path}"
        if command == "run" and "--config" in rest:  # the quick experiment: run it, tiny and under tmp_path
            extra = ["--output-dir", str(tmp_path / "runs"), "--checkpoint-dir", str(tmp_path / "ckpt"),
                     "--data.cache-dir", str(tmp_path / "cache"), "--devices", "1", "--progress", "false",
                     "--fed.rounds", "1"]
            assert main(argv + extra) == 0, shlex.join(argv)
            record = json.loads(next((tmp_path / "runs").rglob("*.json")).read_text())
            assert record["config"]["method"]["name"] == rest[rest.index("--method.name") + 1]
            ran += 1
        elif command == "run":
            try:
                parse_run(rest)
            except SystemExit as exc:  # --print-config prints and exits 0
                assert exc.code == 0, shlex.join(argv)
        elif command == "list":
            assert main(argv) == 0
            ran += 1
        else:
            args = command_module(command).build_parser().parse_args(rest)
            if command == "table":
                assert load_table_config(args.config).rows
    assert ran == 2
    capsys.readouterr()
