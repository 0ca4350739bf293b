"""One CLI family (issue 39, item 3): every command follows jsonargparse's conventions, checked by its parser
(no run runs): --print_config, {true,false} booleans, one list syntax, one error prefix, a mistyped command
answered with the closest one, the registered names in --help, a config given to the wrong command named as
such, and `fedbench table --dry-run` / `--print_config` printing the table's plan without running or
writing anything."""
from __future__ import annotations

import dataclasses
import hashlib
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from bench.cli import COMMANDS, REGISTRY_OPTIONS, command_module, main, run_parser
from bench.core.atomic_io import write_json
from bench.core.code_version import code_version
from bench.scheduling.table_runner import check_plan, load_table_config, plan_runs
from bench.tables.catalog import load
from bench.tables.flags import hint_of
from bench.tables.table_overrides import TableOverrides
from bench.tables.table_row import TableRow
from bench.tables.table_spec import TableSpec
from datamodules.base import DATASETS
from datamodules.partitions import PARTITION_SCHEMES
from lightning_modules.base import METHODS

TABLE = str(REPO / "configs" / "tables" / "table2_fashion-mnist.yaml")
QUICK = str(REPO / "configs" / "experiments" / "quick.yaml")
# what each command needs to parse (its required flags)
REQUIRED = {"table": ["--config", TABLE], "dashboard": ["--config", TABLE], "data": ["get", "fashion-mnist"]}


def parser_of(command: str):
    return run_parser() if command == "run" else command_module(command).build_parser()


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "run"])
def test_every_command_prints_its_options_with_print_config(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # nothing the command would write lands in the repository
    rows = ["--rows", "[FedAvg]"] if command == "table" else []  # a table's plan: its checks of 6 runs, not 129
    assert exit_code([command, *REQUIRED.get(command, []), "--print_config", *rows]) == 0
    out = capsys.readouterr().out
    options = yaml.safe_load(out.split("\ntable2 fashion-mnist: ")[0])  # the table's plan follows its options
    flags = {a.dest for a in parser_of(command)._actions if a.option_strings and a.dest not in ("help", "print_config")}
    words = {a.dest for a in parser_of(command)._actions if not a.option_strings}  # `data get NAME`'s positionals
    assert set(options) - words == flags, command
    if command == "table":
        assert options["config"] == TABLE and options["rows"] == ["FedAvg"]
        assert "\ntable2 fashion-mnist: 6 runs, 0 up to date, 6 to run\n" in out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_is_an_attribute_of_the_parsed_options(command):
    """jsonargparse's Namespace has methods (update, items, ...): an option of that name would read as the
    method (`fedbench regression --update` was always true), so no option is named like one."""
    parser = parser_of(command)
    args = parser.parse_args(REQUIRED.get(command, []))
    own = {"help", "print_shtab"} | ({"print_config"} if command == "run" else set())  # jsonargparse's actions
    for action in (a for a in parser._actions if a.option_strings and a.dest not in own):
        assert all(p.isidentifier() for p in action.dest.split(".")) and not callable(getattr(args, action.dest.split(".")[0])), action.dest
    if command == "regression":
        assert parser.parse_args([]).update_references is False and parser.parse_args(["--update"]).update_references


@pytest.mark.parametrize("command", COMMANDS)
def test_every_boolean_flag_shows_true_false_and_may_be_bare(command):
    parser = parser_of(command)
    help_text = " ".join(parser.format_help().split())
    booleans = [f for f in parser.boolean_flags()  # bool or bool | None (not run's --resume: true, false or force)
                if set(typing.get_args(hint_of(parser._option_string_actions[f])) or [bool]) <= {bool, type(None)}]
    assert booleans, command  # every command has one (--print_config at least)
    for flag in booleans:
        assert f"{flag} {{true,false" in help_text, (command, flag)  # {true,false} or {true,false,null}
    flag = next(f for f in booleans if f != "--print_config") if len(booleans) > 1 else None
    if flag and command != "run":  # bare: true; before another flag too
        dest = parser._option_string_actions[flag].dest
        assert parser.parse_args([*REQUIRED.get(command, []), flag])[dest] is True
        assert parser.parse_args([*REQUIRED.get(command, []), flag, "false"])[dest] is False


# every list flag of every command: (command, flag, items as a user types them, the parsed list)
LISTS = [("table", "--seeds", ["0", "1"], [0, 1]), ("table", "--folds", ["0", "2"], [0, 2]),
         ("regression", "--only", ["fedavg", "fedcb"], ["fedavg", "fedcb"]),
         ("coverage", "--paper", ["fedbm", "fedcb"], ["fedbm", "fedcb"]),
         ("bench", "--cases", ["loops", "round"], ["loops", "round"]),
         ("bench", "--backbones", ["resnet18", "simple-cnn"], ["resnet18", "simple-cnn"]),
         ("run", "--fed.lr_milestones", ["3", "5"], [3, 5])]


def parsed_list(command: str, argv: list[str], flag: str):
    if command == "run":
        return run_parser().parse_args(argv).fed.lr_milestones
    return parser_of(command).parse_args([*REQUIRED.get(command, []), *argv])[flag[2:].replace("-", "_")]


@pytest.mark.parametrize(("command", "flag", "items", "expected"), LISTS, ids=[f"{c}{f}" for c, f, _, _ in LISTS])
def test_every_list_flag_takes_the_same_forms(command, flag, items, expected):
    a, b = items
    forms = [[flag, f"[{a},{b}]"], [f"{flag}=[{a}, {b}]"], [flag, f"{a},{b}"], [flag, a, b], [flag, a, flag, b],
             [flag, a, f"{flag}+", b], [f"{flag}+", a, f"{flag}+", b]]
    for argv in forms:
        assert parsed_list(command, argv, flag) == expected, argv


def test_table_rows_and_sets_take_the_same_forms_and_keep_labels_with_commas():
    spec = load_table_config(TABLE)
    parser = parser_of("table")
    for argv in (["--rows", "[FedAvg,FedBM]"], ["--rows", "FedAvg,FedBM"], ["--rows", "FedAvg", "FedBM"],
                 ["--rows", "FedAvg", "--rows", "FedBM"], ["--rows", "FedAvg", "--rows+", "FedBM"]):
        args = parser.parse_args(["--config", TABLE, *argv])
        assert TableOverrides.parse(spec, args.set, args.seeds, args.rows).rows == ["FedAvg", "FedBM"], argv
    labelled = dataclasses.replace(spec, rows=(*spec.rows, TableRow("FedCB, tau 10", {"method": {"name": "fedcb"}})))
    for argv in (["--rows", "FedCB, tau 10"], ["--rows", '["FedCB, tau 10", FedAvg]']):
        args = parser.parse_args(["--config", TABLE, *argv])
        assert TableOverrides.parse(labelled, [], None, args.rows).rows[0] == "FedCB, tau 10"
    for argv in (["--set", "fed.rounds=2", "--set", "partition.args.proportions=[0.5,0.5]"],
                 ["--set", "fed.rounds=2", "partition.args.proportions=[0.5,0.5]"]):
        assert parser.parse_args(["--config", TABLE, *argv]).set == ["fed.rounds=2",
                                                                     "partition.args.proportions=[0.5,0.5]"]


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "--fed.rounds", "abc"], "--fed.rounds: expected int, got 'abc'"),
    (["run", "--fed.rouns", "3"], "did you mean --fed.rounds?"),
    (["table", "--config", TABLE, "--seeds", "a"], "--seeds: expected int items, got 'a'"),
    (["table", "--config", TABLE, "--jobs", "many"], "--jobs takes a whole number >= 1 (runs at once) or auto, got 'many'"),
    (["regression", "--updte"], "did you mean --update?"),
    (["coverage", "--json", "maybe"], "--json"),
    (["dashboard", "--config", TABLE, "--entiti", "me"], "did you mean --entity?"),
    (["list", "--data-hom", "x"], "did you mean --data-home?"),
    (["bench", "--cases", "[nope]"], "--cases"),
    (["table", "--config", TABLE, "--seeds", "[7]"], "--seeds [7]: choose among the config's seeds [0, 1, 2]"),
], ids=["run-type", "run-typo", "table-list-item", "table-type", "regression", "coverage", "dashboard", "list",
        "bench", "table-own-check"])
def test_every_error_is_one_line_with_one_prefix(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("fedbench: error: ") and message in err, err


@pytest.mark.parametrize(("typed", "meant"), [("tabel", "table"), ("regresion", "regression"), ("rnu", "run"),
                                              ("dashbord", "dashboard"), ("coverag", "coverage")])
def test_a_mistyped_command_is_answered_with_the_closest(typed, meant, capsys):
    assert main([typed]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedbench: error: unknown command {typed!r}; did you mean {meant}? ") and len(err.splitlines()) == 1
    assert main(["zzzz"]) == 2 and "did you mean" not in capsys.readouterr().err


def test_help_lists_the_registered_methods_datasets_and_schemes():
    help_text = " ".join(run_parser().format_help().split())
    for flag, names in (("--method.name", METHODS.names()), ("--data.name", DATASETS.names()),
                        ("--partition.scheme", PARTITION_SCHEMES.names())):
        shown = f" one of: {', '.join(names)} (`fedbench list` says what each is)"
        assert re.search(rf"{re.escape(flag)} [A-Z]+{re.escape(shown)}", help_text), flag
        assert sorted(load()[REGISTRY_OPTIONS[flag]]) == names  # the catalog holds what the registry holds


def test_the_parsers_and_the_choices_need_no_torch():
    code = ("import sys; from bench.cli import run_parser; "
            "names = run_parser().format_help(); "
            "assert 'fedavg' in names and 'torch' not in sys.modules and 'lightning' not in sys.modules, sorted(sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={"PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("argv", "kind", "use"), [
    (["run", "--config", TABLE], "table config, not a run's", f"`fedbench table --config {TABLE}`"),
    (["run", f"--config={REPO / 'configs' / 'regression.yaml'}"], "regression config, not a run's",
     "`fedbench regression --config"),
    (["table", "--config", QUICK], "run config, not a table's", f"`fedbench run --config {QUICK}`"),
], ids=["run<-table", "run<-regression", "table<-run"])
def test_a_config_given_to_the_wrong_command_names_the_right_one(argv, kind, use, capsys):
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedbench: error: {argv[-1].removeprefix('--config=')} is a {kind}: use {use}")
    assert len(err.splitlines()) == 1


TINY = {"table": "tiny", "dataset": "digits", "betas": [0.5], "seeds": [0, 1], "metrics": ["accuracy"],
        "base": {"data": {"name": "digits"}, "partition": {"num_clients": 4}, "fed": {"rounds": 2},
                 "method": {"backbone": "simple-cnn"}},
        "rows": [{"label": "FedAvg", "method": {"name": "fedavg"}}, {"label": "FedProx", "method": {"name": "fedprox"}}]}


def tree(root: Path) -> dict[str, tuple[int, str]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, hashlib.sha1(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*")) if p.is_file()}


def tiny_table(tmp_path: Path) -> list[str]:
    """TINY's config under tmp_path and records of two of its four runs: FedAvg seed 0 up to date (60 s),
    FedProx seed 0 made by other code (200 s); the argv of its table command."""
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    argv = ["--config", str(config), "--output-dir", str(tmp_path / "runs"), "--tables-dir", str(tmp_path / "tables")]
    args = command_module("table").build_parser().parse_args(argv)
    runs = plan_runs(TableSpec.parse(TINY, "tiny.yaml"), args.output_dir)
    check_plan(runs, TableSpec.parse(TINY, "tiny.yaml"), args)  # the devices and threads a table run gives them (they are in a record's name)
    from bench.assembly.records import run_record_path

    for run, seconds, version in ((runs[0], 60.0, code_version(runs[0].cfg)), (runs[2], 200.0, "older-code")):
        assert (run.label, run.seed) in (("FedAvg", 0), ("FedProx", 0))
        write_json(run_record_path(run.cfg), {"run_name": run.cfg.run_name(), "config": run.cfg.to_dict(),
                                              "code_version": version, "wall_seconds": seconds})
    return ["table", *argv]


def fedprox_version(tmp_path: Path) -> str:
    """The code version of tiny_table's FedProx runs in this checkout (each method has its own)."""
    return code_version(next(r.cfg for r in plan_runs(TableSpec.parse(TINY, "tiny.yaml"), str(tmp_path / "runs")) if r.label == "FedProx"))


def refuse_to_run(monkeypatch) -> None:
    import bench.assembly.experiment
    import bench.assembly.run_data
    import bench.reporting.tables
    import bench.scheduling.table_runner

    def started(*_, **__):
        raise AssertionError("a dry run started something")

    for module, name in ((bench.assembly.experiment, "run_experiment"), (bench.assembly.experiment, "launch"),
                         (bench.assembly.run_data, "setup_datamodule"), (bench.scheduling.table_runner, "execute"),
                         (bench.reporting.tables, "render_table")):
        monkeypatch.setattr(module, name, started)


@pytest.mark.parametrize("flag", ["--dry-run", "--print_config"])
def test_table_dry_run_prints_the_plan_and_runs_and_writes_nothing(flag, tmp_path, monkeypatch, capsys):
    argv = tiny_table(tmp_path)
    before = tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    refuse_to_run(monkeypatch)
    assert main([*argv, flag]) == 0
    out = capsys.readouterr().out
    plan = out[out.index("tiny digits: "):].splitlines()
    assert [" ".join(line.split()) for line in plan] == [
        "tiny digits: 4 runs, 1 up to date, 3 to run",
        "FedAvg dirichlet-0.5 seed 0 up to date",
        "FedAvg dirichlet-0.5 seed 1 run: no record",
        f"FedProx dirichlet-0.5 seed 0 run: code changed (older-code -> {fedprox_version(tmp_path)})",
        "FedProx dirichlet-0.5 seed 1 run: no record",
        # FedAvg seed 1: its row's 60 s; FedProx seed 0: its own earlier 200 s; FedProx seed 1: its row's 200 s
        ("estimated time: 7 min 40 s for 3 of the 3 runs one after another (from the wall time of 2 records of "
         "this table here)"),
        "dry run: nothing was run or written (run the same command without --dry-run / --print_config)."]
    if flag == "--print_config":
        options = yaml.safe_load(out[:out.index("tiny digits: ")])
        assert options["config"] == argv[2] and options["output_dir"] == str(tmp_path / "runs") and options["jobs"] == 1
    assert tree(tmp_path) == before  # nothing written, nothing touched


def test_table_dry_run_with_jobs_and_seeds_plans_those_runs(tmp_path, monkeypatch, capsys):
    argv = tiny_table(tmp_path)
    refuse_to_run(monkeypatch)
    assert main([*argv, "--dry-run", "--seeds", "[1]", "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert "tiny digits: 2 runs, 0 up to date, 2 to run" in out
    # FedAvg's 60 s beside FedProx's 200 s: two jobs take FedProx's 200 s, not half of the 260 s
    assert ("estimated time: 4 min 20 s for 2 of the 2 runs one after another; with --jobs 2 at least 3 min 20 s "
            "(the longest runs first, each as fast as alone: more when the jobs share cores)") in " ".join(out.split())
    assert len(list((tmp_path / "runs").rglob("*.json"))) == 2 and not (tmp_path / "tables").exists()
