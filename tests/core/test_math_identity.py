"""Issue 42, item 2: the math modes' flags (the CUDA branch checked through the settings each mode
applies, not by faking a GPU), and the result identity of gpu_math, channels_last and compile."""
from __future__ import annotations

import pytest
import torch

from bench.assembly.config import RunConfig, from_dict, result_config
from bench.core.numerics import apply_gpu_math, gpu_math_settings, math_settings

# identities the code before issue 42 gave these configs (bench/assembly/config.py at 3fda314): a record made
# without the new fields, or at their defaults, keeps its identity
OLD_IDENTITIES = {"default": "bf21a9e8", "fast": "9842c9e6", "fedprox-3-rounds": "12ebe45b"}


def configs() -> dict[str, RunConfig]:
    fedprox = RunConfig()
    fedprox.method.name, fedprox.fed.rounds = "fedprox", 3
    return {"default": RunConfig(), "fast": RunConfig(gpu_math="fast"), "fedprox-3-rounds": fedprox}


@pytest.mark.parametrize("mode,tf32,deterministic_cudnn,benchmark", [("strict", False, True, False),
                                                                      ("tf32", True, True, False),
                                                                      ("fast", True, False, True)])
def test_each_mode_sets_its_cuda_flags_and_deterministic_algorithms_only_on_cuda(mode, tf32, deterministic_cudnn,
                                                                                 benchmark):
    cuda, cpu = math_settings(mode, "cuda"), math_settings(mode, "cpu")
    expected = {"tf32_matmul": tf32, "tf32_cudnn": tf32, "cudnn_deterministic": deterministic_cudnn,
                "cudnn_benchmark": benchmark}
    assert {k: cuda[k] for k in expected} == expected == {k: cpu[k] for k in expected}
    assert cuda["deterministic_algorithms"] == (mode != "fast")  # strict and tf32 are deterministic on CUDA
    assert cuda["cublas_workspace_config"] == (":4096:8" if mode != "fast" else None)
    assert cpu["deterministic_algorithms"] is False and cpu["cublas_workspace_config"] is None


def test_tf32_mode_is_applied_and_recognised_on_this_process():
    saved = gpu_math_settings()
    try:
        apply_gpu_math("tf32", "cpu")
        assert gpu_math_settings() == {"gpu_math": "tf32", "tf32_matmul": True, "tf32_cudnn": True,
                                       "cudnn_deterministic": True, "cudnn_benchmark": False}
        assert not torch.are_deterministic_algorithms_enabled()  # CPU: left off
    finally:
        apply_gpu_math(saved["gpu_math"] if saved["gpu_math"] != "custom" else "strict", "cpu")


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="gpu_math must be one of"):
        math_settings("tf16", "cuda")


def test_records_without_the_new_fields_keep_their_identity():
    for name, cfg in configs().items():
        assert cfg.result_identity() == OLD_IDENTITIES[name]
        stored = cfg.to_dict()
        for key in ("channels_last", "compile"):  # a record written before these fields counted
            stored.pop(key)
        assert from_dict(stored).result_identity() == OLD_IDENTITIES[name]


def test_tf32_channels_last_and_compile_each_have_their_own_identity():
    variants = [RunConfig(), RunConfig(gpu_math="tf32"), RunConfig(gpu_math="fast"), RunConfig(channels_last=True),
                RunConfig(compile=True), RunConfig(channels_last=True, compile=True)]
    assert len({cfg.result_identity() for cfg in variants}) == len(variants)
    assert result_config(RunConfig(channels_last=True).to_dict())["channels_last"] is True


def test_channels_last_changes_the_last_bits_of_a_cpu_convolution():
    """Why channels_last counts on the CPU too: oneDNN's NHWC kernels sum in another order (measured here)."""
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 64, 16, 16, generator=gen), torch.randn(64, 64, 3, 3, generator=gen)
    nchw = torch.nn.functional.conv2d(x, w, padding=1)
    nhwc = torch.nn.functional.conv2d(x.contiguous(memory_format=torch.channels_last),
                                      w.contiguous(memory_format=torch.channels_last), padding=1)
    torch.testing.assert_close(nchw, nhwc, atol=1e-3, rtol=1e-4)  # the same convolution (24-ish values)
    assert not torch.equal(nchw, nhwc.contiguous())
