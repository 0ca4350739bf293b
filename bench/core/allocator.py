"""The C allocator's policy of a training process: keep freed buffers instead of handing them back to
the OS at every step.

A training step allocates and frees activations and gradients of a few MiB each (ResNet-18 at 28 px,
batch 32: 6.4 MiB per early feature map). With glibc's defaults, freed memory at the top of the heap
beyond the trim threshold is returned to the OS and the next step faults it in again page by page,
and buffers above the (adaptive) mmap threshold are mapped and unmapped per allocation: thousands of
page faults per step, paid in kernel time. Setting both thresholds once at start-up ends that:

- ``M_MMAP_THRESHOLD`` = 32 MiB (glibc's maximum on 64-bit): buffers up to 32 MiB come from the heap;
- ``M_TRIM_THRESHOLD`` = 2 GiB - 1 (the largest value ``mallopt`` takes): a freed top of heap is kept.

How the thresholds were chosen (fedbench's local loop, ResNet-18, 28 px, batch 32, one thread, minor
page faults per step after a warm-up epoch; bench/perf/loop_probe.py; glibc 2.36):

    mmap / trim threshold         faults per step   system / user time
    glibc's defaults (adaptive)   3,127-5,790       4.6-7.6%
    32 MiB / default              5,035             9.4%
    default / 2 GiB               61,690            86%   (fixing one threshold stops the adaptation:
                                                            every buffer over 128 KiB is mapped per use)
    4 MiB / 2 GiB                 16,079            26%
    32 MiB / 64 MiB               2,071             1.9%
    32 MiB / 256 MiB              0-221             0.2%
    32 MiB / 2 GiB (this policy)  0-219             0.1-0.7%  (residues: one-off heap growth in short runs)

32 MiB is the largest mmap threshold glibc accepts; 2 GiB - 1 the largest trim threshold ``mallopt``
takes (an int). The cost: a process keeps its peak heap (what the next step needs anyway). Buffers
over 32 MiB (large images or batches) are still mapped per use.

``apply_allocator_policy`` is called by every process fedbench starts (the CLI, which is also what
Fabric relaunches as DDP ranks; ``run_experiment``; the table's job workers). It does nothing off
glibc (macOS, musl: their allocators differ and have no such knobs), when the environment sets
glibc's own ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` (the user's choice wins), or when
``FEDBENCH_ALLOCATOR=system`` (the allocator as the platform ships it: ``make bench``'s reference loop
with churn). ``allocator_status`` is what a run record stores.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20
TRIM_THRESHOLD = 2**31 - 1
OPT_OUT_ENV = "FEDBENCH_ALLOCATOR"  # "system": leave the allocator as the platform ships it
GLIBC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")

_status: dict[str, Any] | None = None


def glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc (it has ``mallopt`` and ``gnu_get_libc_version``)."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        return libc
    except (OSError, AttributeError):
        return None


def apply_allocator_policy() -> dict[str, Any]:
    """Set the policy once per process (idempotent); returns what was done (``allocator_status``)."""
    global _status
    if _status is not None:
        return _status
    env = {k: os.environ[k] for k in GLIBC_ENV if k in os.environ}
    libc = glibc()
    if libc is None:
        _status = {"policy": "system", "reason": "not glibc: no mallopt"}
    elif env:
        _status = {"policy": "environment", "environment": env}
    elif os.environ.get(OPT_OUT_ENV, "").lower() == "system":
        _status = {"policy": "system", "reason": f"{OPT_OUT_ENV}=system"}
    else:
        ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        _status = {"policy": "mallopt" if ok else "system", "mmap_threshold": MMAP_THRESHOLD,
                   "trim_threshold": TRIM_THRESHOLD}
        if not ok:
            _status["reason"] = "mallopt refused the thresholds"
    if libc is not None:
        _status["glibc"] = libc.gnu_get_libc_version().decode()
    return _status


def allocator_status() -> dict[str, Any]:
    """What the policy did in this process ({"policy": "not applied"} before ``apply_allocator_policy``)."""
    return dict(_status) if _status is not None else {"policy": "not applied"}
