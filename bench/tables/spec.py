"""One loader for the YAML specs that expand into runs: table configs (configs/tables/*.yaml) and the
regression set (configs/regression.yaml).

Both hold RunConfig overrides (``base``; a table's rows, the regression runs) merged onto the
defaults in order. Every key is checked before anything runs: a spec's own keys against the list
its runner gives, the overrides against the fields of the config dataclasses (bench/assembly/config.py), so
a typo is one error naming the key and what is allowed.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from bench.assembly.config import (  # noqa: F401 (re-exported)
    FLAT_PARTITION_DEFAULTS,
    OPTION_GROUPS,
    RunConfig,
    canonical,
    from_dict,
    result_config,
    with_defaults,
)
from bench.core.errors import FedbenchError
from bench.core.paths import shipped

RUN_KEYS = frozenset(f.name for f in dataclasses.fields(RunConfig))


def check_keys(given: dict, allowed: Iterable[str], where: str, within: str = "") -> None:
    """``where`` (e.g. "t.yaml: row 'A'") may hold only ``allowed`` keys (``within``: under which key)."""
    allowed = sorted(allowed)
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise FedbenchError(f"{where} has unknown key(s) {unknown}{f' in {within}' if within else ''}; "
                            f"allowed: {allowed}.")


def check_overrides(overrides: dict, where: str, allowed: Iterable[str] = RUN_KEYS) -> None:
    """RunConfig overrides: ``allowed`` top-level keys, and in each option group only its fields
    (``method.args`` is the method's own: build_module checks it; ``partition.args`` the scheme's: validation)."""
    check_keys(overrides, allowed, where)
    for group, cls in OPTION_GROUPS.items():
        if isinstance(overrides.get(group), dict):
            moved = sorted(set(overrides[group]) & set(FLAT_PARTITION_DEFAULTS)) if group == "partition" else []
            if moved:  # a config written before the scheme options moved under partition.args
                raise FedbenchError(f"{where}: partition option(s) {moved} are the scheme's own options now: write "
                                    f"them under partition.args (e.g. partition: {{scheme: dirichlet, args: "
                                    f"{{{moved[0]}: ...}}}}).")
            check_keys(overrides[group], [f.name for f in dataclasses.fields(cls)], where, within=group)


def read_yaml(path: Path) -> Any:
    """The YAML document at ``path``, read with ``yaml.safe_load`` (no tag can run code); a syntax error
    or a tag (``!!python/...``) is one FedbenchError naming the file, line and column."""
    text = path.read_text()
    try:  # libyaml's parser when PyYAML has it (the same values: Python's SafeConstructor and resolver)
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        pass
    try:  # an error: the pure-Python parser's message, with its line and column
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(path)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        if "constructor" in type(err).__name__.lower() or "tag" in str(problem):
            problem = f"{problem} (YAML tags such as !!python/... are not allowed in fedbench configs: plain values only)"
        raise FedbenchError(f"{where}: not valid YAML: {problem}.") from err


def load_spec(path: str, what: str, keys: Iterable[str], not_found_hint: str = "") -> dict[str, Any]:
    """The YAML mapping at ``path`` (a ``what``, e.g. "Table config"): its keys within ``keys``,
    its ``base`` valid RunConfig overrides."""
    p = shipped(path)  # a relative path not in the working directory: the checkout's or the installed one
    if not p.exists():
        raise FedbenchError(f"{what} {path!r} not found.{not_found_hint}")
    spec = read_yaml(p) or {}
    if not isinstance(spec, dict):
        raise FedbenchError(f"{path}: a {what.lower()} is a mapping of keys ({sorted(keys)}).")
    check_keys(spec, keys, path)
    check_overrides(spec.get("base") or {}, f"{path}: base")
    return spec


def plain_copy(value: Any) -> Any:
    """A deep copy of a config value: dicts, lists and tuples rebuilt, scalars (immutable) shared; anything
    else through ``copy.deepcopy`` (the same result as deepcopy for config data, a fraction of its time:
    `fedbench coverage` merges thousands of run configs)."""
    if isinstance(value, dict):
        return {k: plain_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_copy(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_copy(v) for v in value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return copy.deepcopy(value)


def deep_merge(a: dict, b: dict) -> dict:
    """``b`` merged into a copy of ``a``, dict by dict (``args`` is replaced whole: a method's options)."""
    out = plain_copy(a)
    merge_into(out, b)
    return out


def merge_into(out: dict, b: dict) -> None:
    """``deep_merge`` in place: ``out`` (a copy the caller owns) takes copies of ``b``'s values."""
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "args":
            merge_into(out[k], v)
        else:
            out[k] = plain_copy(v)


@functools.cache
def default_config() -> dict[str, Any]:
    """``RunConfig().to_dict()``, computed once (callers copy it)."""
    return RunConfig().to_dict()


def run_config(*overrides: dict, where: str) -> RunConfig:
    """The RunConfig of the defaults with ``overrides`` merged in order (``where`` names the run in
    the error when the result is not a valid config)."""
    d = plain_copy(default_config())
    for layer in overrides:
        merge_into(d, layer)
    try:
        return from_dict(d)
    except TypeError as err:
        raise FedbenchError(f"{where}: {err}") from err


