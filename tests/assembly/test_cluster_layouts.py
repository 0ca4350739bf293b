"""The usual SLURM layouts (issue 31, item 4), with SLURM's and torchrun's variables faked on a CPU.

- one task per GPU where each task sees only its own GPU (``--gpus-per-task=1``): Lightning wanted
  devices = tasks per node but could see one device; every task now is a node of one device, with the
  global rank SLURM gave it;
- one task per node running torchrun over the node's GPUs: torchrun's ranks, not srun's one task.
A task gets the same global rank, hence the same clients, in every layout.
"""
from __future__ import annotations

import pytest
from lightning.fabric import Fabric
from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from lightning.fabric.strategies import DDPStrategy

import bench.assembly.experiment as E
from bench.assembly.cluster import OneDevicePerTask, fabric_layout
from bench.assembly.config import RunConfig

# task 3 of 4: 2 nodes x 2 tasks, this one is the 2nd task (local id 1) of node 1
SLURM = {"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "2", "SLURM_PROCID": "3",
         "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_JOB_NAME": "fedbench", "SLURM_JOB_ID": "4242",
         "SLURM_NODELIST": "node[0-1]"}
TORCHRUN = {"TORCHELASTIC_RUN_ID": "r1", "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
            "GROUP_RANK": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}


@pytest.fixture(autouse=True)
def rank_zero_restored():
    """Building a DDP Fabric as rank 3 or 5 sets Lightning's process-wide rank_zero_only.rank; restore it,
    or later tests in this worker process log as a non-zero rank (their loggers then write nothing)."""
    from lightning.fabric.utilities import rank_zero as fabric_rz
    from lightning_utilities.core import rank_zero as utils_rz

    saved = fabric_rz.rank_zero_only.rank, utils_rz.rank_zero_only.rank
    yield
    fabric_rz.rank_zero_only.rank, utils_rz.rank_zero_only.rank = saved


@pytest.fixture
def slurm(monkeypatch):
    for key in (*TORCHRUN, "SLURM_GPUS_PER_TASK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in SLURM.items():
        monkeypatch.setenv(key, value)
    return monkeypatch


def cfg(devices: int, num_nodes: int) -> RunConfig:
    c = RunConfig()
    c.accelerator, c.devices, c.num_nodes = "cpu", devices, num_nodes
    return c


def test_a_task_that_sees_one_gpu_is_a_node_of_one_device(slurm):
    layout = fabric_layout(2, 2, visible_gpus=1)
    assert (layout.devices, layout.num_nodes) == (1, 4) and isinstance(layout.plugins[0], OneDevicePerTask)
    # a task that sees all of its node's GPUs keeps Lightning's mapping (local rank i -> cuda:i)
    assert (fabric_layout(2, 2, visible_gpus=2).devices, fabric_layout(2, 2, visible_gpus=2).plugins) == (2, [])
    assert fabric_layout(2, 2, visible_gpus=0).plugins == []  # a CPU run


def test_one_gpu_per_task_gives_each_task_its_slurm_rank_on_its_only_device(slurm):
    slurm.setattr(E, "visible_gpus", lambda accelerator: ["0"])  # what a --gpus-per-task=1 task sees
    fabric = E.make_fabric(cfg(devices=2, num_nodes=2))
    env = fabric.strategy.cluster_environment
    assert isinstance(env, OneDevicePerTask)
    assert (fabric.world_size, fabric.global_rank, fabric.local_rank, fabric.node_rank) == (4, 3, 0, 3)
    assert fabric.strategy.root_device.index in (None, 0)  # its first (only) device
    # Lightning's own layout (each task sees all GPUs) gives this task the same global rank: same clients
    usual = Fabric(accelerator="cpu", devices=2, num_nodes=2, strategy=DDPStrategy())
    assert isinstance(usual.strategy.cluster_environment, SLURMEnvironment)
    assert (usual.world_size, usual.global_rank) == (4, 3)


def test_torchrun_under_srun_takes_torchruns_ranks(slurm):
    for key, value in TORCHRUN.items():
        slurm.setenv(key, value)
    slurm.setenv("SLURM_NTASKS", "2")
    slurm.setenv("SLURM_NTASKS_PER_NODE", "1")  # one task per node, torchrun starts 4 ranks in each
    fabric = E.make_fabric(cfg(devices=4, num_nodes=2))
    assert isinstance(fabric.strategy.cluster_environment, TorchElasticEnvironment)
    assert (fabric.world_size, fabric.global_rank, fabric.local_rank) == (8, 5, 1)
    # a task that sees one GPU under torchrun is torchrun's rank, never a SLURM "node of one device"
    slurm.setenv("SLURM_NTASKS_PER_NODE", "2")
    assert fabric_layout(2, 2, visible_gpus=1).plugins == []  # (without torchrun: OneDevicePerTask, above)


def test_a_wrong_layout_is_refused_by_the_environment(slurm):
    with pytest.raises(ValueError, match="devices=1 and num_nodes=4"):
        OneDevicePerTask().validate_settings(num_devices=2, num_nodes=2)
