"""`make gpu-bench`'s arithmetic (issue 42, item 6): a row's projected cost from its record's rounds, and the
table's projected time from the rows' costs and the speedup of K runs at once. Its CPU run is in
tests/test_gpu_paths.py."""
from __future__ import annotations

from collections import Counter

import pytest

from bench.reporting.gpu_bench import project, run_cost


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
