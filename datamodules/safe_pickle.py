"""The one way fedbench reads a pickled data file: an unpickler that resolves only the globals the file's
format needs, so a crafted file (a ``__reduce__`` calling ``os.system``, ``builtins.eval``, ...) is
refused before anything it names is called, with one error naming the file and the global.

Plain containers (dict, list, tuple, str, bytes, int, float, bool, None) need no global at all; what a
format may reference beyond them is listed here:

  NUMPY_ARRAY   a NumPy array (numeric or object): ``_reconstruct``/``ndarray``/``dtype``/``scalar`` and,
                from pickle protocol 5, ``_frombuffer`` (numpy 1.x spells ``numpy._core`` as ``numpy.core``)
  PY3_BYTES     ``bytes`` pickled by Python 3 with protocol 2 (``_codecs.encode(text, "latin1")``)

Used by CIFAR-10/100 (datamodules/cifar.py) and FedNPR's client split file (datamodules/client_split_file.py).
"""
from __future__ import annotations

import pickle
from typing import IO

from bench.core.errors import CorruptDataError

NUMPY_ARRAY = frozenset({(f"numpy.{core}.{module}", name) for core in ("core", "_core")
                         for module, name in (("multiarray", "_reconstruct"), ("multiarray", "scalar"),
                                              ("numeric", "_frombuffer"))}
                        | {("numpy", "ndarray"), ("numpy", "dtype")})
PY3_BYTES = frozenset({("_codecs", "encode")})
HINT = "Replace it with the file as published."


class RestrictedUnpickler(pickle.Unpickler):
    """Resolves the globals in ``allowed`` and nothing else: any other is ``error(message)`` naming
    ``where``, the global and what the file should be (``what``, ``hint``), raised before it is called."""

    def __init__(self, fh: IO[bytes], where: str, allowed: frozenset, what: str,
                 error: type[Exception] = CorruptDataError, hint: str = HINT, **kwargs) -> None:
        super().__init__(fh, **kwargs)
        self.where, self.allowed, self.what, self.error, self.hint = where, allowed, what, error, hint

    def find_class(self, module: str, name: str):
        if (module, name) in self.allowed:
            try:  # numpy >= 2 moved numpy.core to numpy._core (the old name warns)
                return super().find_class(module.replace("numpy.core.", "numpy._core."), name)
            except (ImportError, AttributeError):
                return super().find_class(module, name)
        raise self.error(
            f"'{self.where}' references {module}.{name}, which {self.what} has no use for; it is not loaded "
            f"(unpickling it could run code). {self.hint}")


def restricted_load(fh: IO[bytes], where: str, allowed: frozenset, what: str,
                    error: type[Exception] = CorruptDataError, hint: str = HINT, **kwargs) -> object:
    """The object pickled in ``fh`` through RestrictedUnpickler; a refused global raises ``error``, a
    truncated or corrupt pickle (whatever the exception) raises ``error`` naming ``where``."""
    try:
        return RestrictedUnpickler(fh, where, allowed, what, error, hint, **kwargs).load()
    except error:
        raise
    except Exception as err:  # a truncated or corrupt pickle, whatever the exception
        raise error(f"'{where}' is corrupt: its pickled contents do not load ({err}).") from err
