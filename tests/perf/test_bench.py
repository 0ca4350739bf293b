"""`make bench` measures what a user gets (issue 19): every loop in its own process, the bare reference
without fedbench's allocator policy, once with glibc's churn and once with glibc's own equivalent
settings; the ratio is fedbench over the churn-free reference."""
from __future__ import annotations

import json

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
    printed = capsys.readouterr().out
    assert "fedbench / churn-free bare" in printed and "faults/step" in printed
