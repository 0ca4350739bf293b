"""`make bench` measures what a user gets (issue 19): every loop in its own process, the bare reference
without fedbench's allocator policy, once with glibc's churn and once with glibc's own equivalent
settings; the ratio is fedbench over the churn-free reference."""
from __future__ import annotations

import json
import statistics

import pytest

from bench.core.allocator import glibc
from bench.perf.perf import main

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out


def test_loops_case_runs_each_variant_under_its_own_allocator(tmp_path, capsys):
    out = tmp_path / "perf.json"
    args = ["--cases", "loops", "--backbones", "simple-cnn", "--samples", "96", "--repeats", "1", "--threads", "1",
            "--data", "synthetic", "--out", str(out)]
    assert main(args) == 0
    (r,) = json.loads(out.read_text())["throughput"]
    policies = {name: v["allocator"] for name, v in r["variants"].items()}
    if glibc() is not None:
        assert policies == {"fedbench": "mallopt", "fedbench_churn": "system", "bare_churn": "system",
                            "bare": "environment"}
    bare = r["runs"]["bare"][0]
    assert bare["allocator"]["environment"] == {"MALLOC_MMAP_THRESHOLD_": "33554432",
                                                "MALLOC_TRIM_THRESHOLD_": "4294967296"}
    assert r["median_ratio"] == r["variants"]["fedbench"]["samples_per_s"] / r["variants"]["bare"]["samples_per_s"]
    for v in r["runs"].values():
        assert v[0]["steps"] == 3 and v[0]["threads"] == 1 and v[0]["user_s"] > 0 and v[0]["minor_faults"] >= 0
    paired = r["in_process"]  # both loops in one process, epochs about: one ratio per pair of epochs
    assert len(paired["ratios"]) == len(paired["samples_per_s"]) == len(paired["bare_samples_per_s"]) == 8
    assert paired["ratios"] == [f / b for f, b in zip(paired["samples_per_s"], paired["bare_samples_per_s"])]
    assert paired["median_ratio"] == statistics.median(paired["ratios"])
    printed = capsys.readouterr().out
    assert "fedbench / churn-free bare" in printed and "faults/step" in printed
    assert f"in one process, epochs about: fedbench / bare = {paired['median_ratio']:.3f}" in printed


def test_the_paired_probe_alternates_which_loop_goes_first():
    """Both loops warm up, then repeat r runs fedbench first when r is even, bare first when odd."""
    import argparse

    from bench.perf.loop_probe import paired

    order = []
    epochs = {loop: (lambda seed, loop=loop: order.append((loop, seed)) or 8) for loop in ("bare", "fedbench")}
    args = argparse.Namespace(repeats=3, backbone="simple-cnn", data="synthetic", threads=1, batch_size=4)
    out = paired(args, "cpu", epochs)
    assert order == [("bare", 99), ("fedbench", 99), ("fedbench", 0), ("bare", 0), ("bare", 1), ("fedbench", 1),
                     ("fedbench", 2), ("bare", 2)]
    assert len(out["ratios"]) == 3 and out["loop"] == "paired"
