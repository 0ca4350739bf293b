"""The README's worked example ("Adding a method") runs as written on the per-client contract."""
from __future__ import annotations

import importlib.util
import re

import torch
from conftest import REPO, run_in_process

from lightning_modules.base import METHODS


def readme_example() -> str:
    section = (REPO / "README.md").read_text().split("## Adding a method", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_readme_method_trains_uploads_and_keeps_server_state(tiny_cfg, captured, monkeypatch, tmp_path):
    METHODS.names()  # load the registry, then register the example in a copy of it
    monkeypatch.setattr(METHODS, "_items", dict(METHODS._items))
    path = tmp_path / "readme_fedprior.py"
    path.write_text(readme_example())
    spec = importlib.util.spec_from_file_location("readme_fedprior", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert METHODS.get("fedprior") is example.FedPrior
    record, _ = run_in_process(tiny_cfg(**{"method.name": "fedprior", "method.args": {"tau": 0.5}}))
    fed = captured["fed"]
    expected = torch.ones(10, dtype=torch.float64)  # the prior: 1 + every sampled client's class counts
    for h in record["history"]:
        for c in h["clients"]:
            expected += torch.bincount(fed.data.labels[fed.clients[c].train], minlength=10).double()
    assert torch.equal(fed.module.counts.double(), expected)
    assert record["bytes_per_client_round"]["up"] == record["bytes_per_client_round"]["down"] + 4 * 10
    assert record["final"]["test/accuracy"] > 20.0  # it trains (10 classes)
