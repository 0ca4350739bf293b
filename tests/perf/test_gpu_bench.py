"""`make gpu-bench`'s arithmetic (issue 42, item 6): a row's projected cost from its record's rounds, and the
table's projected time from the rows' costs and the speedup of K runs at once. Its CPU run is in
tests/perf/test_gpu_paths.py."""
from __future__ import annotations

from collections import Counter

import pytest

from bench.perf.gpu_bench import project, run_cost


def test_a_rows_cost_comes_from_the_rounds_after_the_first_scaled_to_the_full_data():
    record = {"config": {"fed": {"batch_size": 8}}, "splits": {"train": 2800},
              "history": [{"train_seconds": 9.0, "eval_seconds": 1.0, "samples_trained": 3100},
                          {"train_seconds": 2.8, "eval_seconds": 0.1, "samples_trained": 2240},
                          {"train_seconds": 2.6, "eval_seconds": 0.1, "samples_trained": 1960}]}
    cost = run_cost(record, rounds=200, full_train=5600)
    assert cost["ms_per_step"] == pytest.approx(1e3 * 5.4 / 525)  # (2.8 + 2.6) s over (2240 + 1960) / 8 steps
    assert cost["run_seconds"] == pytest.approx(200 * (2.8 * 2 + 0.1 + 2.6 * 2 + 0.1) / 2)  # 1,100 s


def test_the_table_projects_every_run_at_its_rows_cost_or_the_first_rows_and_divides_by_the_speedup():
    counts = Counter({"FedAvg": 6, "FedBM": 6, "MOON": 6, "Central": 3})
    seconds, inferred = project(counts, {"FedAvg": 1100.0, "FedBM": 1800.0}, "FedAvg", speedup=4.0)
    assert seconds == pytest.approx((6 * 1100 + 6 * 1800 + 6 * 1100 + 3 * 1100) / 4.0)
    assert inferred == ["Central", "MOON"]


def test_a_failed_mode_is_reported_and_the_others_still_measure_and_land_in_the_json(tmp_path, monkeypatch, capsys):
    """gpu-bench on a GPU machine runs for minutes under a device budget: each measured setting is appended to
    --json as it comes (a killed bench keeps what it measured), and a mode whose runs fail is reported in the
    table (exit 1) without losing the other modes'."""
    import json

    from bench.perf import gpu_bench

    def measure(args, row, mode, k):
        if mode == "fast":
            raise SystemExit(f"gpu-bench: {row} under {mode} failed:\nCUDA error")
        return [{"row": row, "mode": mode, "ms_per_step": 10.0 * (1 + 0.25 * (k > 1)), "run_seconds": 1000.0}] * k

    monkeypatch.setattr(gpu_bench, "measure", measure)
    monkeypatch.setattr(gpu_bench, "write_kvasir", lambda root, per_class: root)
    out = tmp_path / "bench.jsonl"
    assert gpu_bench.main(["--device", "cpu", "--modes", "fast,tf32", "--jobs", "1,4", "--json", str(out)]) == 1
    printed = capsys.readouterr()
    settings = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(s["mode"], s["jobs"]) for s in settings] == [("tf32", 1), ("tf32", 4)]
    assert settings[1]["aggregate_steps_per_s"] == pytest.approx(4 * 80.0) and settings[1]["speedup"] == pytest.approx(3.2)
    assert settings[1]["table_hours"] == pytest.approx(111 * 1000.0 / 3.2 / 3600)
    assert "fast     FAILED: gpu-bench: FedAvg under fast failed:" in printed.out
    assert "FedAvg under tf32, 4 at once: 320.0 steps/s" in printed.err
