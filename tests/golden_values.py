"""Reading tests/golden/<name>.json (numbers recorded from the papers' public code, issue 37) and comparing
our tensors with them: the helpers the golden tests share."""
from __future__ import annotations

import json
from pathlib import Path

import torch

GOLDEN_DIR = Path(__file__).parent / "golden"


def load_golden(name: str) -> dict:
    return json.loads((GOLDEN_DIR / f"{name}.json").read_text())


def tensor(values, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def assert_close(got: torch.Tensor, expected, rtol: float, atol: float) -> None:
    """``got`` (any float dtype) equals the recorded ``expected`` within rtol/atol, compared in float64."""
    torch.testing.assert_close(got.detach().double(), tensor(expected, torch.float64), rtol=rtol, atol=atol)
