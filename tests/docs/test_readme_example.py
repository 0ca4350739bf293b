"""The README's worked example ("Adding a method") runs as written on the per-client contract."""
from __future__ import annotations

import importlib.util
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import doc_section, run_in_process

from lightning_modules.base import METHODS


def readme_examples() -> list[str]:
    section = doc_section("Adding a method (contributing)")
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


def readme_example() -> str:
    return readme_examples()[0]


def load_example(code: str, name: str, tmp_path):
    path = tmp_path / f"{name}.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(name, path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def test_readme_method_trains_uploads_and_keeps_server_state(tiny_cfg, captured, monkeypatch, tmp_path):
    METHODS.names()  # load the registry, then register the example in a copy of it
    monkeypatch.setattr(METHODS, "_items", dict(METHODS._items))
    example = load_example(readme_example(), "readme_fedprior", tmp_path)
    assert METHODS.get("fedprior") is example.FedPrior
    record, _ = run_in_process(tiny_cfg(**{"method.name": "fedprior", "method.args": {"tau": 0.5}}))
    fed = captured["fed"]
    expected = torch.ones(10, dtype=torch.float64)  # the prior: 1 + every sampled client's class counts
    for h in record["history"]:
        for c in h["clients"]:
            expected += torch.bincount(fed.data.labels[fed.clients[c].train], minlength=10).double()
    assert torch.equal(fed.module.server_side.counts.double(), expected)
    assert record["bytes_per_client_round"]["up"] == record["bytes_per_client_round"]["down"] + 4 * 10
    assert record["final"]["test/accuracy"] > 20.0  # it trains (10 classes)


def test_readme_composed_method_is_an_entry_with_the_terms_loss_and_default(tiny_cfg, monkeypatch, tmp_path):
    """The second example: FedProx's term on the CLIP linear probe, registered without a class body;
    its objective is the probe's CE plus (mu / 2) ||w - w_global||^2 with the entry's default mu 0.1."""
    from test_clip_methods import prepared

    from bench.assembly.validation import method_signature
    from bench.core.seeding import torch_generator
    from lightning_modules.base import ClientContext
    from lightning_modules.clip_fc import ClipLinearProbe

    assert len(readme_examples()) == 2
    METHODS.names()
    monkeypatch.setattr(METHODS, "_items", dict(METHODS._items))
    example = load_example(readme_examples()[1], "readme_clip_fc_fedprox", tmp_path)
    cls = METHODS.get("clip-fc-fedprox")
    assert cls is example.ClipFcFedProx and cls.__bases__ == (ClipLinearProbe,)
    assert method_signature(cls)["mu"].default == 0.1 and "init" in method_signature(cls)
    cfg = tiny_cfg(**{"method.name": "clip-fc-fedprox", "method.args": {"feature_cache_dir": str(tmp_path / "f")}})
    _, module, (train, _, _) = prepared(cfg)
    assert module.terms["prox"].mu == 0.1
    global_state = {k: v.clone() for k, v in module.state_dict().items()}
    with torch.no_grad():
        module.head.weight.add_(0.01)
    ctx = ClientContext(0, 0, 0, train, torch.arange(20), 10, global_state, torch_generator(1))
    x, y = train.to_float(torch.arange(8))
    proximal = 0.5 * 0.1 * float((module.head.weight - global_state["head.weight"]).pow(2).sum())
    expected = float(F.cross_entropy(module(x), y)) + proximal
    assert abs(proximal - 0.05 * module.head.weight.numel() * 1e-4) < 1e-9
    assert float(module.client_objective(ctx)((x, y))) == pytest.approx(expected, rel=1e-6)
