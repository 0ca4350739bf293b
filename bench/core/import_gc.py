"""A process's import of the training stack without the cyclic garbage collector's passes over it.

Importing torch, Lightning and fedbench's training stack leaves about 560,000 objects that live as long as
the process (modules, classes, functions, their dicts). CPython's collector walks every long-lived object
whenever their number has grown by a quarter: during a `fedbench run`'s imports that is 6 full passes of
31-219 ms (0.69 s in all) and about 0.23 s of younger passes, on the 2-core EPYC of 2026-12-02, and they
find 9,467 objects of garbage between them.

``stack_import()`` wraps the first import of torch in each fedbench process: the run's (bench/cli.py
``run_one``, every rank's), a table's plan check (bench/scheduling/table_runner.py), the ``--jobs``
forkserver and a spawned job worker (bench/scheduling/job_preload.py, table_jobs.py), gpu-bench's runs and the
loop probe (bench/perf), and pytest's collection (tests/conftest.py). The collector is off while it imports. Afterwards everything then alive is frozen
(``gc.freeze``: left out of every later pass; an object of it still goes the moment its last reference does,
only a cycle among them is kept) and the collector is on again, for the run. The import's own garbage is frozen with
it (about 8 MiB of the process's 685 MiB) rather than collected: a collection over the 561,000 objects costs
0.28-0.32 s. Forked ``--jobs`` workers share the frozen objects' pages with the forkserver (no pass
writes to them). A process that has imported torch already (fedbench called from Python, a forked worker)
is left as it is.

Measured on that machine: the imports of a `fedbench run` (torch, Lightning, bench.assembly.experiment) took
3.4-4.7 s of CPU with the collector on and 2.5-3.7 s with it off (7 alternating pairs); a 1-round quick run
(configs/experiments/quick.yaml) 5.38 s wall before and 4.57 s after (medians of 8 alternating pairs; CPU
ratio 0.81), its peak memory 858 -> 866 MiB; `make test-fast` 0.91 of its CPU (4 pairs). Tested in
tests/core/test_import_gc.py, and on a real run in tests/commands/test_startup.py.
"""
from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def stack_import() -> Iterator[None]:
    """Around the imports that bring in torch: the collector off, then what is alive frozen and the collector
    on; nothing is changed when torch is imported already or the collector is off (the caller's choice)."""
    if "torch" in sys.modules or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
