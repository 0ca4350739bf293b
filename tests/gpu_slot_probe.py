"""The target of tests/perf/test_gpu_paths.py's spawned --jobs workers, in a module of its own: a spawned child
imports its target's module, and this one imports only what a --jobs worker's setup does
(bench/scheduling/table_jobs.py), not the test module's pytest, Lightning and test helpers. The three children
took 7.0-7.5 s of CPU together, against 15.9-16.7 s when they imported the test module (two runs each,
getrusage of the children)."""
from __future__ import annotations

import os

from bench.scheduling.table_jobs import _start_worker


def report_gpu(threads, gpus, slot, parent, queue) -> None:
    """Set up as a --jobs worker (``_start_worker``), then report the CUDA devices it sees."""
    _start_worker(threads, gpus, slot, parent)
    queue.put(os.environ.get("CUDA_VISIBLE_DEVICES"))
