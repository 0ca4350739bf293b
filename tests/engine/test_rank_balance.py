"""Sampled clients spread over ranks by their sizes when no client state persists, with each rank's
idle time at the all-reduce recorded; the result stays that of one rank (issue 19)."""
from __future__ import annotations

import pytest
from conftest import max_state_diff, run_in_process

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out


@pytest.mark.ddp
def test_spread_clients_two_ranks_equal_one_rank(two_rank_runs, tmp_path):
    # 6 clients of very different sizes (beta 0.1), 3 sampled per round, 3 rounds (tests/rank_pairs.py)
    rec1, state1 = run_in_process(two_rank_runs.one_cfg("rank_balance", tmp_path))
    rec2, state2 = two_rank_runs.two("rank_balance")
    assert max_state_diff(state1, state2) <= 1e-6
    sizes = [sum(row) for row in rec2["partition"]["counts"]]
    moved = 0
    for h1, h2 in zip(rec1["history"], rec2["history"], strict=True):
        assert sorted(c for r in h2["rank_clients"] for c in r) == h2["clients"] == h1["clients"]
        by_owner = [[c for c in h2["clients"] if c % 2 == r] for r in range(2)]
        moved += h2["rank_clients"] != by_owner
        # the busiest rank trains no more samples than under c % N
        assert max(sum(sizes[c] for c in r) for r in h2["rank_clients"]) <= max(sum(sizes[c] for c in r) for r in by_owner)
        assert h2["samples_trained"] == h1["samples_trained"]  # counted over both ranks
        idle = h2["rank_idle_seconds"]
        assert len(idle) == len(h2["rank_busy_seconds"]) == 2 and min(idle) == 0.0 and max(idle) >= 0.0
    assert moved >= 1  # the spread differs from c % N in at least one round of this partition
    summary = rec2["execution"]["rank_idle"]
    assert len(summary["idle_seconds"]) == 2 and 0.0 <= summary["idle_share"] < 1.0
    assert rec2["execution"]["ranks"] == 2 and rec2["execution"]["threads_per_rank"] == 1
    cpu = rec2["execution"]["cpu"]  # both ranks' own CPU time, gathered by rank 0
    assert len(cpu["user_seconds"]) == 2 and min(cpu["user_seconds"]) > 0
