"""precision 64-true: float64 weights, batches and method state (the regression set runs in it so that
its numbers do not depend on the CPU's SIMD path); 1 vs 2 ranks still give the same model."""
from __future__ import annotations

import pytest
import torch
from conftest import kill_and_resume, max_state_diff, run_in_process

from bench.core.batches import DeviceData

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out


def test_batches_come_out_in_the_normalisation_dtype_from_the_same_draws():
    images = torch.randint(0, 256, (6, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    out = {}
    for dtype in (torch.float32, torch.float64):
        mean = torch.tensor([0.4, 0.5, 0.6], dtype=dtype).view(1, -1, 1, 1)
        data = DeviceData(images, torch.arange(6), mean, torch.full_like(mean, 0.25))
        x, _ = data.to_float(torch.arange(6), "npr", torch.Generator().manual_seed(3))
        assert x.dtype == dtype
        out[dtype] = x
    # the augmentation draws (flips, angles, blur) are the same; only the arithmetic is wider
    assert torch.allclose(out[torch.float32].double(), out[torch.float64], atol=1e-5)
    assert not torch.equal(out[torch.float32].double(), out[torch.float64])
    features = DeviceData(torch.randn(4, 5), torch.arange(4), torch.zeros(1, 1, 1, 1, dtype=torch.float64),
                          torch.ones(1, 1, 1, 1, dtype=torch.float64))
    assert features.to_float(torch.arange(4))[0].dtype == torch.float64  # cached features follow too


@pytest.mark.ddp
@pytest.mark.parametrize("method", ["fedbm", "fednpr"])
def test_float64_run_is_float64_and_rank_invariant(two_rank_runs, tmp_path, method):
    """FedBM (generator, concept distributions; cheap generator settings) and FedNPR (prototypes, Sinkhorn;
    2 subclusters) keep every floating tensor in float64, and 2 ranks match 1 rank (measured: 2.2e-16 for
    FedBM). 4 clients, 2 rounds, 64-true (tests/rank_pairs.py; the 2-rank side from the shared launch)."""
    record, state1 = run_in_process(two_rank_runs.one_cfg(f"float64-{method}", tmp_path))
    _, state2 = two_rank_runs.two(f"float64-{method}")
    assert {v.dtype for v in state1.values() if v.is_floating_point()} == {torch.float64}
    diff = max_state_diff(state1, state2)
    assert diff <= 1e-12, f"{method} 64-true: 1 vs 2 ranks differ by {diff}"
    assert record["config"]["precision"] == "64-true"
    assert record["versions"]["torch"] == torch.__version__.split("+")[0]


def test_float64_scaffold_resumes_exactly(tiny_cfg):
    """Scaffold's server control variate c, rebuilt from the checkpointed c_sum on resume, stays in the
    run's precision (it was cast to float32: the resumed 64-true run ended 3.9e-9 away)."""
    base = {"method.name": "scaffold", "partition.num_clients": 4, "fed.rounds": 3, "fed.sample_ratio": 0.5,
            "checkpoint_every": 1, "precision": "64-true"}
    kill_and_resume(tiny_cfg, base)
