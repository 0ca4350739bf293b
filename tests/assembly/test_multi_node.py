"""Several machines (issue 20): `--num_nodes` reaches Fabric, whose TorchElasticEnvironment takes the ranks
from torchrun. Two "nodes" on this machine (two torchrun agents, node ranks 0 and 1, 1 process each, static
rendezvous on localhost) give the result of one process; a multi-node run without a launcher, or whose
launcher started another number of processes, is one clear error before any work."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from conftest import REPO, cli_args, load_final_state, max_state_diff, run_in_process

from bench.assembly.records import record_path
from bench.assembly.validation import check_launcher
from bench.core.errors import FedbenchError

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_node(node_rank: int, port: int, argv: list[str]) -> subprocess.Popen:
    """One "node": a torchrun agent starting one worker that runs `fedbench run`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "NODE_RANK", "MASTER_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--node-rank", str(node_rank), "--rdzv-backend", "static", "--master-addr", "127.0.0.1",
           "--master-port", str(port), "-m", "bench.cli", "run", *argv]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.ddp
def test_two_torchrun_nodes_equal_one_process(tiny_cfg):
    """Scaffold: per-client control variates stay on their rank (clients 1, 3, 5 on node 1) and travel in the
    round's all-reduce, so both the client shard and the collectives cross the "nodes"."""
    common = {"method.name": "scaffold"}
    one = tiny_cfg(**common, experiment="one")
    record1, state1 = run_in_process(one)
    two = tiny_cfg(**common, experiment="two", num_nodes=2)
    port = free_port()
    nodes = [torchrun_node(k, port, cli_args(two)) for k in (0, 1)]
    try:
        outputs = [n.communicate(timeout=1800)[0] for n in nodes]
    finally:
        for n in nodes:
            n.kill() if n.poll() is None else None
    for k, (n, out) in enumerate(zip(nodes, outputs, strict=True)):
        assert n.returncode == 0, f"node {k} failed ({n.returncode}):\n{out[-4000:]}"
    record2 = json.loads(record_path(two.output_dir, two.experiment, two.run_name()).read_text())
    assert record2["world_size"] == 2 and record2["config"]["num_nodes"] == 2
    assert max_state_diff(state1, load_final_state(two)) == 0.0
    assert [h["metrics"] for h in record2["history"]] == [h["metrics"] for h in record1["history"]]
    assert [h["clients"] for h in record2["history"]] == [h["clients"] for h in record1["history"]]


def test_several_nodes_need_a_launcher(tiny_cfg, monkeypatch):
    for var in ("TORCHELASTIC_RUN_ID", "NODE_RANK", "MASTER_ADDR", "SLURM_NTASKS", "SLURM_JOB_NAME"):
        monkeypatch.delenv(var, raising=False)
    check_launcher(tiny_cfg())  # one node: nothing to launch
    with pytest.raises(FedbenchError, match=r"--num_nodes 2 needs a multi-node launch: torchrun --nnodes"):
        check_launcher(tiny_cfg(num_nodes=2))
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "node0")
    check_launcher(tiny_cfg(num_nodes=2))  # launched by hand


def test_torchrun_world_size_must_be_devices_times_nodes(tiny_cfg, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("WORLD_SIZE", "4")
    check_launcher(tiny_cfg(devices=2, num_nodes=2))
    with pytest.raises(FedbenchError, match=r"torchrun started 4 process\(es\) in all, but --devices 1 x "
                                            r"--num_nodes 2 = 2: pass --devices"):
        check_launcher(tiny_cfg(num_nodes=2))
    with pytest.raises(FedbenchError, match="num_nodes must be >= 1, got 0"):
        from bench.assembly.validation import check_ranges

        check_ranges(tiny_cfg(num_nodes=0))
