"""One convention for the flags of every fedbench command (``run``'s jsonargparse parser and the argparse
parsers of ``table``, ``list``, ``regression``, ``coverage`` and ``bench``):

* either spelling: ``--output-dir`` or ``--output_dir``, ``--data.max-train-samples`` or
  ``--data.max_train_samples`` (``respell``; the help shows the command's own spelling);
* a boolean flag bare (``--wandb``: true) or with a value (``--wandb true``, ``--wandb false``);
* a mistyped flag is one error line naming the closest flag ("did you mean --fed.rounds?"), exit status 2,
  no usage dump (``unrecognized_message``).
"""
from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable, Iterable
from typing import NoReturn

TRUE = ("true", "yes", "on", "1")
FALSE = ("false", "no", "off", "0")


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


def fail(prog: str, message: str) -> NoReturn:
    """One error line (and where the options are listed); exit status 2."""
    print(f"{prog}: error: {message} (`{prog} --help` lists the options)", file=sys.stderr, flush=True)
    raise SystemExit(2)


def to_bool(text: str) -> bool:
    if text.lower() in TRUE:
        return True
    if text.lower() in FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


class FlagParser(argparse.ArgumentParser):
    """argparse with fedbench's flag convention: both spellings, bare or valued booleans (``store_true``
    flags take an optional true/false), one-line errors with a suggestion, no abbreviations.
    ``hint(flag, value)`` may advise on a flag the parser does not know (table: a run option -> ``--set``)."""

    def __init__(self, *args, hint: Callable[[str, str | None], str | None] | None = None, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.hint = hint

    def add_argument(self, *args, **kwargs):
        if kwargs.get("action") == "store_true":
            kwargs.pop("action")
            kwargs.update(nargs="?", const=True, type=to_bool, metavar="true|false")
            kwargs.setdefault("default", False)
        return super().add_argument(*args, **kwargs)

    def known_flags(self) -> list[str]:
        return list(self._option_string_actions)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        args = respell(list(sys.argv[1:] if args is None else args), self.known_flags())
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            fail(self.prog, unrecognized_message(extra, self.known_flags(), self.hint))
        return ns

    def error(self, message: str) -> NoReturn:
        fail(self.prog, message)
