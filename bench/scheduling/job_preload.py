"""What the `fedbench table --jobs` forkserver imports once, so that each worker it forks starts with the
training stack already imported (bench/scheduling/table_jobs.py ``job_context``).

Imported by the forkserver process only (``multiprocessing``'s ``set_forkserver_preload``): torchmetrics'
unused extras skipped first (as in every fedbench process, bench/core/compat.py), then the modules a
worker's run needs (``_run_one``: bench.assembly.experiment and the W&B observer). Importing them runs no torch
operation, so no OpenMP thread pool exists to be lost in the fork (a pool started before a fork can hang
the child); each worker sets its own threads, allocator and GPU after the fork (``_start_worker``).

The forkserver dies with the table (``die_with_parent``), and each worker with the forkserver
(table_jobs._start_worker): multiprocessing ends a forkserver only once every process it forked has
exited, so a table killed with SIGKILL would otherwise leave its workers training.

A worker forked while its table is ending (Ctrl-C, SIGTERM) finds the table's shared locks already removed
and fails before fedbench code runs; multiprocessing would print that failure's traceback under the table's
one "interrupted" line. ``quiet_when_table_gone`` prints it only when the table is still running.
"""
from __future__ import annotations

import os
import sys
import time

from bench.core.compat import skip_unused_imports
from bench.core.import_gc import stack_import
from bench.core.lifetime import die_with_parent, parent_of

TABLE = os.getppid()  # the forkserver's parent: the table's process
# The forkserver ends with the table, whatever ends it (even SIGKILL), and its workers with it (each asks for
# SIGTERM when the forkserver goes: table_jobs._start_worker). multiprocessing's own rule ends a forkserver
# only once every process it forked has closed its end of a pipe, and a worker busy in a run never does.
die_with_parent(parent=TABLE)
skip_unused_imports()

with stack_import():  # then frozen: the forked workers' collections never walk (and copy) these pages
    import bench.assembly.experiment
    import bench.tracking.wandb_logger  # noqa: F401

TABLE_EXIT_WAIT_S = 5.0  # how long a failed worker's start waits to see whether the table is ending


def table_running() -> bool:
    """Whether the table is still running ``TABLE_EXIT_WAIT_S`` from now (the worker's parent, the forkserver,
    exits with the table; a table that is ending is gone within that time)."""
    end = time.monotonic() + TABLE_EXIT_WAIT_S
    while time.monotonic() < end:
        if parent_of(os.getppid()) != TABLE:
            return False
        time.sleep(0.1)
    return True


def quiet_when_table_gone(kind, value, traceback) -> None:
    if table_running():
        sys.__excepthook__(kind, value, traceback)


sys.excepthook = quiet_when_table_gone  # the forked workers' hook until their own code runs
