"""channels_last, bf16-mixed and torch.compile (bench/assembly/speed_options.py, issue 19): off by default, in the
run's config, applied, and with the result independent of the number of ranks."""
from __future__ import annotations

import pytest
import torch
from conftest import max_state_diff, run_in_process

from bench.assembly.config import RunConfig
from bench.assembly.speed_options import with_channels_last
from bench.core.batches import DeviceData

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

OPTIONS = [("channels_last", True), ("precision", "bf16-mixed"), ("compile", True)]
SMALL = {"fed.rounds": 2, "partition.num_clients": 4}


def test_speed_options_default_off():
    cfg = RunConfig()
    assert (cfg.channels_last, cfg.compile, cfg.precision) == (False, False, "32-true")


def test_channels_last_batches_hold_the_same_values():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (8, 3, 6, 6), dtype=torch.uint8, generator=g)
    mean, std = torch.tensor([0.1, 0.2, 0.3]).view(1, 3, 1, 1), torch.tensor([0.4, 0.5, 0.6]).view(1, 3, 1, 1)
    plain = DeviceData(images, torch.arange(8), mean, std)
    nhwc = with_channels_last(plain, True)
    a, b = plain.to_float(torch.tensor([5, 1, 2])), nhwc.to_float(torch.tensor([5, 1, 2]))
    assert a[0].is_contiguous() and b[0].is_contiguous(memory_format=torch.channels_last) and not b[0].is_contiguous()
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    # the in-place normalisation gives exactly the out-of-place values
    assert torch.equal(a[0], (images[[5, 1, 2]].float() / 255.0 - mean) / std)
    assert with_channels_last(plain, False) is plain


@pytest.mark.ddp
@pytest.mark.parametrize("option,value", OPTIONS)
def test_speed_option_applied_and_rank_invariant(tiny_cfg, captured, two_rank_runs, tmp_path, option, value):
    """SMALL with the option (tests/rank_pairs.py; the 2-rank side from the shared launch)."""
    record, state1 = run_in_process(two_rank_runs.one_cfg(f"speed-{option}", tmp_path))
    assert record["config"][option] == value
    module = captured["fed"].module
    if option == "channels_last":  # (with one input channel NCHW and NHWC coincide: the second conv)
        conv = module.backbone.body[4].weight
        assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
        assert captured["fed"].data.channels_last
    if option == "compile":
        assert module.backbone._compiled_call_impl is not None
    if option == "precision":  # autocast really ran in bf16: the model differs from the fp32 one
        _, fp32 = run_in_process(tiny_cfg(**SMALL, experiment="fp32"))
        assert max_state_diff(state1, fp32) > 1e-4
    diff = max_state_diff(state1, two_rank_runs.two(f"speed-{option}")[1])
    assert diff <= 1e-6, f"{option}={value}: 1 vs 2 ranks differ by {diff}"
