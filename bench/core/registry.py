"""Name -> class registries filled by decorators, with auto-import of a package's modules."""
from __future__ import annotations

import difflib
import importlib
import pkgutil
from collections.abc import Callable
from typing import Generic, TypeVar

from bench.core.errors import FedbenchError

T = TypeVar("T")


class UnknownNameError(FedbenchError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Registry(Generic[T]):
    """Maps a user-facing name (``fedavg``, ``fashion-mnist``) to the class implementing it.

    Every module of ``package`` is imported on first lookup, so a new method or dataset
    only needs its own file with ``@REGISTRY.register("name")``.
    """

    def __init__(self, kind: str, package: str) -> None:
        self.kind, self.package = kind, package
        self._items: dict[str, T] = {}
        self._loaded = False

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = obj
            obj.registry_name = name  # type: ignore[attr-defined]
            return obj

        return deco

    def _load(self) -> None:
        if self._loaded:
            return
        pkg = importlib.import_module(self.package)
        for info in pkgutil.iter_modules(pkg.__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{self.package}.{info.name}")
        self._loaded = True

    def registered_names(self) -> list[str]:
        """The names registered so far, without importing the package's modules."""
        return sorted(self._items)

    def names(self) -> list[str]:
        self._load()
        return sorted(self._items)

    def get(self, name: str) -> T:
        self._load()
        if name not in self._items:
            raise unknown_name(self.kind, name, self.names())
        return self._items[name]


def unknown_name(kind: str, name: str, names: list[str]) -> UnknownNameError:
    """The error for a name that is not among ``names`` (sorted), with the closest ones: a registry's, or the
    catalog's (bench/tables/catalog.py: the same names, checked before the modules are imported)."""
    close = difflib.get_close_matches(name, names, n=3)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return UnknownNameError(f"Unknown {kind} {name!r}.{hint} Available: {', '.join(names)}.")
