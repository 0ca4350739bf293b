"""The C allocator's policy (bench/core/allocator.py, issue 19): what each process applies, that run
records carry it, and that it ends the page-fault churn of a training loop."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, run_in_process

from bench.core.allocator import GLIBC_ENV, MMAP_THRESHOLD, OPT_OUT_ENV, TRIM_THRESHOLD, glibc

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

STATUS = "import json; from bench.core.allocator import apply_allocator_policy as a; print(json.dumps(a()))"


def python(code_or_args: list[str], **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in GLIBC_ENV and k != OPT_OUT_ENV}
    proc = subprocess.run([sys.executable, *code_or_args], env={**clean, "PYTHONPATH": str(REPO), **env}, cwd=REPO,
                          capture_output=True, text=True, check=True, timeout=1800)
    return proc.stdout.strip().splitlines()[-1]


def test_policy_per_process_environment():
    default = json.loads(python(["-c", STATUS]))
    opted_out = json.loads(python(["-c", STATUS], **{OPT_OUT_ENV: "system"}))
    users = json.loads(python(["-c", STATUS], MALLOC_TRIM_THRESHOLD_="1000000", **{OPT_OUT_ENV: "system"}))
    if glibc() is None:  # macOS, musl: nothing to set
        assert default == opted_out == {"policy": "system", "reason": "not glibc: no mallopt"}
        return
    assert default["policy"] == "mallopt"
    assert (default["mmap_threshold"], default["trim_threshold"]) == (MMAP_THRESHOLD, TRIM_THRESHOLD) == (2**25, 2**31 - 1)
    assert opted_out["policy"] == "system" and opted_out["reason"] == f"{OPT_OUT_ENV}=system"
    # glibc's own variables are the user's choice: left alone, and named in the status
    assert users["policy"] == "environment" and users["environment"] == {"MALLOC_TRIM_THRESHOLD_": "1000000"}


def test_run_record_says_how_it_executed(tiny_cfg):
    record, _ = run_in_process(tiny_cfg())
    ex = record["execution"]
    assert ex["allocator"]["policy"] == ("mallopt" if glibc() is not None else "system")
    assert (ex["ranks"], ex["threads_per_rank"], ex["layout"]) == (1, 1, "the caller's Fabric")
    idle = ex["rank_idle"]  # one rank never waits for another
    assert idle["idle_seconds"] == [0.0] and idle["idle_share"] == 0.0 and idle["busy_seconds"][0] > 0
    cpu = ex["cpu"]  # the run's own CPU time and page faults (this process ran other tests before)
    assert cpu["user_seconds"][0] > 0 and cpu["minor_faults"][0] >= 0 and len(cpu["system_seconds"]) == 1


def probe(**env: str) -> dict:
    """fedbench's local loop, 60 steps of a width-64 CNN at 28 px, batch 32, 1 thread, synthetic data."""
    args = ["-m", "bench.perf.loop_probe", "--loop", "fedbench", "--data", "synthetic", "--backbone",
            "simple-cnn-w64", "--samples", "640", "--repeats", "3", "--threads", "1"]
    return json.loads(python(args, OMP_NUM_THREADS="1", **env))


def test_policy_ends_page_fault_churn_of_a_training_loop():
    """Minor page faults per step in each of 3 epochs after a warm-up epoch, measured with this probe (1 thread).
    Another process's burst lands in one epoch.
    Means over the 3 epochs, glibc's defaults: 7,986 / 7,692 / 623 / 1,288 under ATEN_CPU_CAPABILITY
    native/default/avx2 and oneDNN off (AMD EPYC); on the Xeon 1,164-8,249 quiet, 779-11,894 beside a busy core,
    and 291.9 once with two full suites beside it (where the pages land, and whether the kernel backs them with
    huge pages, moves the count by 10x or more). fedbench's policy: 0 / 33 / 0 / 0, 0-26.1 beside a busy core;
    beside one or two full suites 0-55.5 in 12 runs and 78.4 once, which failed the old bound on the mean (<= 66).
    Best epochs beside one or two full suites (6 pairs, this probe): defaults 233.6-8,382.9 faults
    per step, the policy 0.0 in all 6 (its other epochs up to 137.2). Then, beside a full suite (2026-11-28,
    Xeon), the defaults' epochs were 78.4 / 312.0 / 3,083.3: their best epoch is no floor either (how much of
    the freed memory glibc's own adaptive threshold keeps varies from epoch to epoch), but their mean (1,157.9)
    stayed above the lowest mean ever seen (291.9). So each side is judged by the statistic noise cannot push
    past its bound: the defaults by their mean over the epochs (a burst only adds faults) >= 145 (half the lowest
    mean), the policy by its best epoch <= 66 (twice the highest quiet mean, 33)."""
    churn, calm = probe(**{OPT_OUT_ENV: "system"}), probe()
    assert churn["allocator"]["policy"] == "system" and churn["steps"] == calm["steps"] == 60
    if glibc() is None:
        assert calm["allocator"]["policy"] == "system"
        return
    assert calm["allocator"]["policy"] == "mallopt"
    assert len(churn["minor_faults_per_step_by_epoch"]) == len(calm["minor_faults_per_step_by_epoch"]) == 3
    assert sum(churn["minor_faults_per_step_by_epoch"]) / 3 >= 145, churn
    assert min(calm["minor_faults_per_step_by_epoch"]) <= 66, (calm, churn)
