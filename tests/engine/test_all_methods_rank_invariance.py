"""Every registered method gives the same global model with 1 and 2 ranks (issue 6, done-when 2).

On digits with the small CNN at 16 px, capped at a class-stratified 400 of its 1,437 training images
(tests/rank_pairs.py ALL_METHODS_BASE), 4 clients, half of them sampled per round, 2 rounds. The 2-rank
runs share the suite's one 2-rank launch (every method run in it one after the other, as `fedbench table`
runs its rows); each test runs its method's 1-rank side in process.
"""
from __future__ import annotations

import pytest
from conftest import max_state_diff, run_in_process
from rank_pairs import PROTOCOL_ROWS, all_methods_names

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out


@pytest.mark.ddp
@pytest.mark.parametrize("method", all_methods_names())
def test_method_same_with_one_and_two_ranks(two_rank_runs, tmp_path, method):
    _, one = run_in_process(two_rank_runs.one_cfg(f"all-{method}", tmp_path))
    _, two = two_rank_runs.two(f"all-{method}")
    diff = max_state_diff(one, two)
    assert diff <= 1e-6, f"{method}: 1 vs 2 ranks differ by {diff}"


@pytest.mark.ddp
@pytest.mark.parametrize("method, protocol", PROTOCOL_ROWS)
def test_protocol_override_same_metrics_with_one_and_two_ranks(two_rank_runs, tmp_path, method, protocol):
    one, _ = run_in_process(two_rank_runs.one_cfg(f"all-{method}@{protocol}", tmp_path))
    two, _ = two_rank_runs.two(f"all-{method}@{protocol}")
    assert one["protocol"] == two["protocol"] == protocol
    for a, b in zip(one["history"], two["history"], strict=True):
        assert a["metrics"].keys() == b["metrics"].keys()
        for k, v in a["metrics"].items():
            assert abs(v - b["metrics"][k]) <= 1e-6, (method, protocol, a["round"], k, v, b["metrics"][k])
