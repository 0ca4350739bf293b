"""One convention for the flags of every fedbench command, jsonargparse's (as LightningCLI users know them):
every command's parser is a ``CommandParser`` (jsonargparse's ``ArgumentParser``), so

* ``--print_config`` prints the command's options as YAML and exits (``fedbench table``: with the table's
  plan; ``fedbench run``: the run's whole config, which ``--config`` reads back);
* a boolean flag shows ``{true,false}``; it may also be given bare (``--wandb``: true);
* a list flag takes jsonargparse's list (``--seeds [0,1]``, ``--seeds+ 2`` appends), and, the same for every
  list flag, the forms fedbench always took: ``--seeds 0,1``, ``--seeds 0 1`` and a repeated flag
  (``--rows FedAvg --rows FedBM``) (``gather_lists``);
* either spelling: ``--output-dir`` or ``--output_dir``, ``--data.max-train-samples`` or
  ``--data.max_train_samples`` (``respell``; the help shows the command's own spelling);
* every error is one line with one prefix, ``fedbench: error: ...`` (a FedbenchError raised by a command
  too), exit status 2, no usage dump; a mistyped flag names the closest one ("did you mean --fed.rounds?").
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

import yaml
from jsonargparse import ArgumentParser, DefaultHelpFormatter

ERROR_PREFIX = "fedbench: error: "


def spellings(flag: str) -> tuple[str, str]:
    """A long flag with underscores and with dashes after its leading ``--``."""
    body = flag[2:]
    return "--" + body.replace("-", "_"), "--" + body.replace("_", "-")


def respell(argv: list[str], known: Iterable[str]) -> list[str]:
    """``argv`` with every long flag the parser knows only in the other spelling written its way
    (``--output_dir`` -> ``--output-dir`` for a parser of ``--output-dir``; ``--flag=value`` too)."""
    known = set(known)
    out = []
    for i, token in enumerate(argv):
        if token == "--":  # the rest are values
            return out + argv[i:]
        name, eq, value = token.partition("=")
        if token.startswith("--") and name not in known:
            name = next((s for s in spellings(name) if s in known), name)
        out.append(name + eq + value if token.startswith("--") else token)
    return out


def bare_booleans(argv: list[str], flags: Iterable[str]) -> list[str]:
    """``argv`` with ``true`` after every boolean flag given bare (last, or followed by another flag)."""
    flags = set(flags)
    out = []
    for i, token in enumerate(argv):
        if token == "--":
            return out + argv[i:]
        out.append(token)
        if token in flags and (i + 1 == len(argv) or argv[i + 1].startswith("--")):
            out.append("true")
    return out


def is_flag(token: str) -> bool:
    """A flag, not a value (``-1`` or ``-0.5`` are values)."""
    return re.match(r"-[-a-zA-Z]", token) is not None


def list_items(flag: str, values: list[str], item: type, split: bool) -> list[Any]:
    """The items of a list flag's values: a jsonargparse list (``[0,1]``) as it says, each other value one
    item, or with ``split`` its comma-separated parts (``0,1``); as ``item`` (int, float or str)."""
    out: list[Any] = []
    for value in values:
        if value.strip().startswith("["):
            try:
                given = yaml.safe_load(value)
            except yaml.YAMLError:
                given = None
            if not isinstance(given, list):
                raise_flag_error(f"{flag}: {value!r} is not a list (write it as {flag} [a,b])")
            out += [v if item is not str else str(v) for v in given]
            continue
        for part in [p.strip() for p in value.split(",") if p.strip()] if split else [value]:
            try:
                out.append(item(part))
            except ValueError:
                raise_flag_error(f"{flag}: expected {item.__name__} items, got {part!r} (e.g. {flag} [0,1])")
    return out


def gather_lists(argv: list[str], lists: dict[str, tuple[type, bool]]) -> list[str]:
    """``argv`` with each list flag of ``lists`` (flag -> (item type, split on commas)) once, at its first
    place, holding every item given to it as one JSON list: ``--seeds [0,1]``, ``--seeds 0,1``,
    ``--seeds 0 1``, ``--seeds 0 --seeds 1`` and ``--seeds 0 --seeds+ 1`` all become ``--seeds [0, 1]``."""
    items: dict[str, list] = {}
    out: list[str | tuple] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            out += argv[i:]
            break
        name, eq, value = token.partition("=")
        flag = name.removesuffix("+")
        if not token.startswith("--") or flag not in lists:
            out.append(token)
            i += 1
            continue
        j = i + 1
        while not eq and j < len(argv) and not is_flag(argv[j]) and argv[j] != "--":
            j += 1
        values = [value] if eq else argv[i + 1:j]
        if not values:
            raise_flag_error(f"{flag} expects a list, e.g. {flag} [a,b] (or {flag} a,b)")
        if flag not in items:
            out.append((flag,))
        items.setdefault(flag, []).extend(list_items(flag, values, *lists[flag]))
        i = j
    return [x for t in out for x in ([t[0], json.dumps(items[t[0]])] if isinstance(t, tuple) else [t])]


def closest_flag(flag: str, known: Iterable[str]) -> str | None:
    """The known flag nearest to ``flag`` (compared in one spelling), or None when none is close."""
    by_key = {spellings(k)[0]: k for k in known if k.startswith("--") and not k.endswith("+")}
    close = difflib.get_close_matches(spellings(flag.partition("=")[0])[0], list(by_key), n=1, cutoff=0.6)
    return by_key[close[0]] if close else None


def unrecognized_message(tokens: list[str], known: Iterable[str],
                         hint: Callable[[str, str | None], str | None] | None = None) -> str:
    """"unrecognized arguments: ...", then for each unknown flag the closest known one (or ``hint``'s
    advice for it: ``hint(flag, its value)``)."""
    known = list(known)
    advice = []
    for i, token in enumerate(tokens):
        if not token.startswith("--"):
            continue
        flag, eq, value = token.partition("=")
        if not eq and i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            value = tokens[i + 1]
        own = hint(flag, value or None) if hint else None
        close = closest_flag(flag, known)
        if own:
            advice.append(own)
        elif close:
            advice.append(f"did you mean {close}?")
    return f"unrecognized arguments: {' '.join(tokens)}" + (f"; {' '.join(advice)}" if advice else "")


def plain_message(message: str) -> str:
    """A jsonargparse error on one line in fedbench's words: 'Parser key "fed.rounds":\\n  Expected a
    <class 'int'>. Got value: abc' -> "--fed.rounds: expected int, got 'abc'"."""
    text = re.sub(r"<class '([\w.]+)'>", r"\1", message)
    text = re.sub(r"(?:typing\.)?Literal\[(.*?)\]\. Got value", r"one of \1. Got value", text)
    text = re.sub(r'^Parser key "([^"]+)":', r"--\1:", text.strip())
    text = re.sub(r"Expected a (.*?)\. Got value: (.*)$", lambda m: f"expected {m[1]}, got {m[2]!r}", text, flags=re.MULTILINE)
    return " ".join(text.split())


class FlagError(Exception):
    """A command-line value the parser cannot read (raised while argv is prepared, reported by ``error``)."""


def raise_flag_error(message: str) -> NoReturn:
    raise FlagError(message)


def fail(prog: str, message: str) -> NoReturn:
    """One error line, with the prefix of every fedbench error (and where the options are listed); exit 2."""
    print(f"{ERROR_PREFIX}{message} (`{prog} --help` lists the options)", file=sys.stderr, flush=True)
    raise SystemExit(2)


def options_yaml(ns) -> str:
    """A command's parsed options as YAML, as ``--print_config`` prints them (without ``print_config``)."""
    options = {k: v for k, v in ns.as_dict().items() if k not in ("print_config", "__path__")}
    return yaml.safe_dump(options, sort_keys=False, allow_unicode=True).rstrip()


def hint_of(action) -> Any:
    """The type hint of a jsonargparse option (None for a plain argparse one)."""
    return getattr(action, "_typehint", None)


def union_args(hint: Any) -> tuple:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def list_item(hint: Any) -> type | None:
    """int, float or str for a ``list[...]`` (or ``list[...] | None``) of them or of a Literal of strings."""
    for arg in union_args(hint):
        if typing.get_origin(arg) is list and typing.get_args(arg):
            (item,) = typing.get_args(arg)
            if typing.get_origin(item) is typing.Literal:
                return str
            return item if item in (int, float, str) else None
    return None


class HelpFormatter(DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """jsonargparse's help (types, defaults, ``{true,false}``) under a description kept as written; an option's
    help is wrapped at spaces only (a name such as clip-ft-fedavg stays whole)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class CommandParser(ArgumentParser):
    """jsonargparse with fedbench's conventions (module docstring). ``hint(flag, value)`` may advise on a flag
    the parser does not know (table: a run option -> ``--set``). ``print_options``: add a ``--print_config``
    that prints the parsed options (``fedbench run`` keeps jsonargparse's, which comes with its config file).
    ``own_print_config``: the command prints them itself (``fedbench table``: with its plan)."""

    def __init__(self, *args, hint: Callable[[str, str | None], str | None] | None = None,
                 print_options: bool = True, own_print_config: bool = False, **kwargs) -> None:
        if print_options:
            kwargs["print_config"] = None  # jsonargparse's own would read the next word as its format
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("exit_on_error", True)
        kwargs.setdefault("default_env", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.hint, self.own_print_config = hint, own_print_config
        self.keep_commas: set[str] = set()  # list flags whose items may hold commas (labels, KEY=VALUE)
        if print_options:
            self.add_argument("--print_config", type=bool, default=False,
                              help="print the options as YAML and exit")

    def add_argument(self, *args, **kwargs):
        """argparse's boolean and list forms (``action="store_true"``, ``nargs="+"``, ``action="append"``)
        become jsonargparse's typed options; ``keep_commas=True``: a list whose items are not split at commas."""
        if kwargs.get("action") == "store_true":
            kwargs.pop("action")
            kwargs.update(type=bool, default=kwargs.get("default", False))
        if kwargs.get("nargs") in ("+", "*") or kwargs.get("action") == "append":
            item = kwargs.pop("type", str)
            choices = kwargs.pop("choices", None)
            kwargs.pop("nargs", None), kwargs.pop("action", None), kwargs.pop("metavar", None)
            kwargs["type"] = list[typing.Literal[tuple(choices)]] if choices else list[item]  # type: ignore[misc]
            if kwargs.get("default") is None:
                kwargs["type"] = kwargs["type"] | None
        if kwargs.pop("keep_commas", False):
            self.keep_commas |= {a for a in args if a.startswith("--")}
        return super().add_argument(*args, **kwargs)

    def known_flags(self) -> list[str]:
        return list(self._option_string_actions)

    def boolean_flags(self) -> list[str]:
        return [f for f, a in self._option_string_actions.items() if bool in union_args(hint_of(a))]

    def list_flags(self) -> dict[str, tuple[type, bool]]:
        out = {}
        for flag, action in self._option_string_actions.items():
            item = list_item(hint_of(action))
            if item is not None and not flag.endswith("+"):
                out[flag] = (item, flag not in self.keep_commas)
        return out

    def prepare(self, argv: list[str]) -> list[str]:
        """``argv`` in the parser's own forms: its spelling, ``true`` after a bare boolean, lists gathered."""
        argv = bare_booleans(respell(argv, self.known_flags()), self.boolean_flags())
        try:
            return gather_lists(argv, self.list_flags())
        except FlagError as err:
            self.error(str(err))

    def parse_args(self, args=None, namespace=None, **kwargs):  # type: ignore[override]
        ns = super().parse_args(self.prepare(list(sys.argv[1:] if args is None else args)), namespace, **kwargs)
        if ns.get("print_config") and not self.own_print_config and self._print_config is None:
            print(options_yaml(ns))
            raise SystemExit(0)
        return ns

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # it raises (jsonargparse's internal parses)
            super().error(message, ex)
        if message.lower().startswith("unrecognized arguments: "):
            message = unrecognized_message(message.split(": ", 1)[1].split(" "), self.known_flags(), self.hint)
        fail(self.prog, plain_message(message))


TABLE_MARKERS = frozenset({"rows", "table", "seeds", "betas", "columns"})  # keys only a table config has


def config_kind(path: str) -> tuple[str | None, set[str]]:
    """Which command a YAML config is for, by its top-level keys, and the keys: "table" (``rows``, ``seeds``,
    ...), "regression" (``runs``), "run" (any other mapping); None when it cannot be read (the command
    reading it says why)."""
    try:
        with open(path, encoding="utf-8") as f:  # libyaml's loader where present (coverage reads 24 configs)
            spec = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None, set()
    if not isinstance(spec, dict):
        return None, set()
    keys = set(map(str, spec))
    if keys & TABLE_MARKERS:
        return "table", keys
    return ("regression" if "runs" in keys else "run"), keys
