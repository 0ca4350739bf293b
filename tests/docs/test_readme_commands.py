"""Every command in the code blocks of the README and of the docs/ pages it links (issue 30; the reference moved
to docs/ in issue 39) is one fedbench accepts: each `make` target exists and
passes its ARGS to a parser that takes them, each `fedbench` / `python -m bench.cli` command line parses
with its command's own parser (nothing runs: the runs themselves are make table2 / make test / CI's).
A renamed flag or target that the README still shows fails here."""
from __future__ import annotations

import re
import shlex

import pytest
from conftest import DOC_PAGES, REPO

from bench.cli import command_module, parse_run

SHELL = {"$((SLURM_ARRAY_TASK_ID + 1))": "1", "$NODE_RANK": "0"}  # what the shell would put there
COMMAND = re.compile(r"^(?:(?:srun |torchrun .*?-m bench\.cli )?(?:\.venv/bin/)?fedbench |torchrun .*?-m bench\.cli |make )")


def readme_commands(pages: tuple[str, ...] = DOC_PAGES) -> list[str]:
    """The commands of ``pages`` in order (the README first)."""
    out, fenced, lang, pending = [], False, "", ""
    for line in (line for page in pages for line in (REPO / page).read_text().splitlines()):
        if line.startswith("```"):
            fenced, lang = not fenced, line[3:].strip()
            continue
        if not fenced or lang not in ("bash", "sh", ""):
            continue
        text = (pending + " " + line.strip()).strip()
        if text.endswith("\\"):
            pending = text[:-1]
            continue
        pending = ""
        if COMMAND.match(text):
            out.append(text)
    return out


def words(command: str) -> list[str]:
    for placeholder, value in SHELL.items():
        command = command.replace(placeholder, value)
    return shlex.split(command, comments=True)


def fedbench_argv(argv: list[str]) -> list[str]:
    """The fedbench arguments of a command line (after `fedbench` or `-m bench.cli`)."""
    for i, word in enumerate(argv):
        if word.endswith("fedbench"):
            return argv[i + 1:]
        if word == "bench.cli" and argv[i - 1] == "-m":
            return argv[i + 1:]
    raise AssertionError(f"no fedbench command in {argv}")


def make_rule(target: str) -> str:
    makefile = (REPO / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert match, f"the README runs `make {target}`, which the Makefile does not have"
    return match.group(1)


def parse(argv: list[str], tmp_path) -> None:
    command, rest = argv[0], argv[1:]
    if command == "run":
        quick = (REPO / "configs/experiments/quick.yaml").read_text()
        own = tmp_path / "my_experiment.yaml"  # the README's own experiment file: any valid one
        own.write_text(quick)
        rest = [str(own) if a == "my_experiment.yaml" else a for a in rest]
        try:
            parse_run(rest)
        except SystemExit as done:  # --print_config prints and exits 0; a parse error exits 2
            if done.code != 0:
                raise
        return
    module = command_module(command)
    assert module is not None, f"README: unknown command {command!r}"
    module.build_parser().parse_args(rest)


def test_the_readme_shows_commands():
    """The README starts with the 1-minute run (tests/docs/test_readme_quickstart.py runs it), then the two commands."""
    commands = readme_commands(("README.md",))
    assert [words(c)[:2] for c in commands[:3]] == [["make", "quick"], ["make", "table2"], ["make", "test"]]
    assert len(readme_commands()) >= 12


def test_a_stale_flag_is_caught(tmp_path):
    with pytest.raises(SystemExit):
        parse(["table", "--config", "x.yaml", "--output_dirr", "y"], tmp_path)
    with pytest.raises(SystemExit):
        parse(["run", "--fed.rouns", "3"], tmp_path)


@pytest.mark.parametrize("command", readme_commands())
def test_every_readme_command_is_accepted(command, tmp_path, capsys):
    argv = words(command)
    if argv[0] == "make":
        target = argv[1]
        rule = make_rule(target)
        given = dict(a.split("=", 1) for a in argv[2:] if "=" in a)
        extra = shlex.split(given.get("ARGS", ""))
        if "$(BIN)/fedbench" in rule:  # the target runs fedbench: its ARGS must parse there
            call = next(line for line in rule.splitlines() if "$(BIN)/fedbench" in line).split("$(BIN)/fedbench", 1)[1]
            call = call.replace("$(DATASET)", given.get("DATASET", "fashion-mnist")).replace("$(ARGS)", "")
            parse([*shlex.split(call), *extra], tmp_path)
        else:
            assert not extra, f"make {target} takes no ARGS"
        return
    parse(fedbench_argv(argv), tmp_path)
