"""Every registered method gives the same global model with 1 and 2 ranks (issue 6, done-when 2).

Both runs go through `fedbench table` in a fresh process (one Fabric launch for all methods),
on digits with the small CNN, 4 clients, half of them sampled per round, 2 rounds.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import REPO, max_state_diff

from bench.config import RunConfig
from lightning_modules.base import METHODS

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

METHOD_NAMES = METHODS.names()  # central rows: a federation of one client, which lives on rank 0
# methods whose distinctive step would not happen in 2 rounds with their defaults
METHOD_ARGS = {
    "fedbm": {"gen_start": 1, "gen_every": 1, "gen_steps": 2, "gen_batch": 8, "gen_base_channels": 8, "g_batch": 4},
}
# methods scored another way (fed.protocol): the global model with per-client parts, client models
PROTOCOL_ROWS = [("fedrep", "global"), ("fedrod", "global"), ("fedproto", "local_mean")]


def run_name(method: str, protocol: str | None = None) -> str:
    """The record name of a row (rows with method.args carry a hash of them, fed.protocol its name)."""
    cfg = RunConfig()
    cfg.data.name, cfg.partition.num_clients, cfg.partition.beta = "digits", 4, 0.5
    cfg.method.name, cfg.method.args = method, METHOD_ARGS.get(method, {})
    cfg.fed.protocol = protocol
    return cfg.run_name()


def table_spec() -> dict:
    return {
        "table": "rankcheck", "dataset": "digits",
        "base": {
            "data": {"name": "digits", "image_size": 16},
            "partition": {"scheme": "dirichlet", "num_clients": 4, "min_size": 20},
            "fed": {"rounds": 2, "sample_ratio": 0.5, "batch_size": 32},
            "method": {"backbone": "simple-cnn", "lr": 0.05},
            "save_final_state": True, "threads": 1,
        },
        "betas": [0.5], "seeds": [0],
        "rows": [{"label": m, "method": {"name": m, "args": METHOD_ARGS.get(m, {})}} for m in METHOD_NAMES]
        + [{"label": f"{m}@{p}", "method": {"name": m}, "fed": {"protocol": p}} for m, p in PROTOCOL_ROWS],
    }


@pytest.fixture(scope="module")
def one_and_two_rank_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("rankcheck")
    spec = table_spec()
    spec["base"]["data"]["cache_dir"] = str(root / "cache")
    config = root / "table.yaml"
    config.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    outs = {}
    for devices in (1, 2):
        out = root / f"ranks{devices}"
        proc = subprocess.run(
            [sys.executable, "-m", "bench.cli", "table", "--config", str(config), "--devices", str(devices),
             "--output-dir", str(out), "--tables-dir", str(root / f"tables{devices}")],
            check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-6000:]
        outs[devices] = out / "rankcheck_digits"
    return outs


@pytest.mark.ddp
@pytest.mark.parametrize("method", METHOD_NAMES)
def test_method_same_with_one_and_two_ranks(one_and_two_rank_runs, method):
    name = f"{run_name(method)}.pt"
    one = torch.load(one_and_two_rank_runs[1] / name)
    two = torch.load(one_and_two_rank_runs[2] / name)
    diff = max_state_diff(one, two)
    assert diff <= 1e-6, f"{method}: 1 vs 2 ranks differ by {diff}"


@pytest.mark.ddp
@pytest.mark.parametrize("method, protocol", PROTOCOL_ROWS)
def test_protocol_override_same_metrics_with_one_and_two_ranks(one_and_two_rank_runs, method, protocol):
    import json

    name = f"{run_name(method, protocol)}.json"
    one, two = (json.loads((one_and_two_rank_runs[d] / name).read_text()) for d in (1, 2))
    assert one["protocol"] == two["protocol"] == protocol
    for a, b in zip(one["history"], two["history"], strict=True):
        assert a["metrics"].keys() == b["metrics"].keys()
        for k, v in a["metrics"].items():
            assert abs(v - b["metrics"][k]) <= 1e-6, (method, protocol, a["round"], k, v, b["metrics"][k])
