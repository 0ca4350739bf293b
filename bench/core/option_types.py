"""Whether a value parsed from YAML/JSON fits an option's annotation, and the annotation in words: the type
rules of bench/assembly/validation.py (method.args) and of the partition schemes' options (datamodules/partition.py),
without their imports (torch, Lightning), so that `fedbench table --set` checks a value before the training stack is
imported."""
from __future__ import annotations

import collections.abc
import types
from typing import Any, Literal, Union, get_args, get_origin


def matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` (parsed from YAML/JSON) fits the annotation ``hint``; unknown hints pass."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return True
    if hint is type(None) or hint is None:
        return value is None
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin in (Union, types.UnionType):
        return any(matches(value, a) for a in args)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(matches(v, args[0]) for v in value)
        return not args or (len(value) == len(args) and all(matches(v, a) for v, a in zip(value, args)))
    if origin in (list, collections.abc.Sequence) or hint in (list, tuple):
        return isinstance(value, (list, tuple)) and (not args or all(matches(v, args[0]) for v in value))
    if origin in (dict, collections.abc.Mapping) or hint is dict:
        return isinstance(value, dict) and (len(args) < 2 or all(matches(v, args[1]) for v in value.values()))
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def describe(hint: Any) -> str:
    """A readable name of an annotation: 'float', 'int or None', "one of ['text', 'random']"."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is type(None):
        return "None"
    if origin is Literal:
        return f"one of {list(args)}"
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is tuple:
        return f"a list of {describe(args[0])}" if len(args) == 2 and args[1] is Ellipsis else \
            f"a list of {len(args)} ({', '.join(describe(a) for a in args)})"
    if origin in (list, collections.abc.Sequence):
        return f"a list of {describe(args[0])}" if args else "a list"
    if origin in (dict, collections.abc.Mapping):
        return "a mapping"
    return getattr(hint, "__name__", str(hint))
