"""The cluster environment Fabric gets under the launchers' usual layouts (README, "GPUs": SLURM).

- **torchrun**, also torchrun started by srun with one task per node that sees all of its node's GPUs
  (``srun torchrun --nnodes $SLURM_NNODES --nproc-per-node 4 ...``): Lightning's own choice, its
  TorchElasticEnvironment (it prefers torchrun's variables over SLURM's; tests/assembly/test_cluster_layouts.py).
- **srun with one task per GPU, each task seeing only its own GPU** (``--gpus-per-task=1``, or a GPU
  binding): Lightning maps local rank i to ``cuda:i``, which such a task cannot see, and it requires
  ``devices`` = tasks per node while the task sees one device. Here every task is a "node" of one
  device (``OneDevicePerTask``): devices 1, nodes = all tasks, global rank = SLURM_PROCID, device cuda:0.
- otherwise Lightning's own choice (srun with every task seeing all of its node's GPUs, one machine,
  NODE_RANK/MASTER_ADDR set by hand).
The ranks are the same in every layout (global rank = SLURM_PROCID or torchrun's RANK), so a run's
result does not depend on which one is used.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from lightning.fabric.plugins.environments import SLURMEnvironment


class OneDevicePerTask(SLURMEnvironment):
    """SLURM tasks that each see only their own GPU: every task is a node of one device."""

    def __init__(self) -> None:
        super().__init__(auto_requeue=False)

    def local_rank(self) -> int:
        return 0

    def node_rank(self) -> int:
        return self.global_rank()

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        if num_devices != 1 or num_nodes != self.world_size():
            raise ValueError(f"one device per SLURM task needs devices=1 and num_nodes={self.world_size()} (all "
                             f"tasks), got devices={num_devices}, num_nodes={num_nodes}")


@dataclass
class FabricLayout:
    """What make_fabric passes to Fabric: devices per node, nodes, cluster-environment plugins, and why."""

    devices: int
    num_nodes: int
    plugins: list = field(default_factory=list)
    why: str = "as configured"


def torchrun_launched() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_torchelastic_launched()


def slurm_tasks_per_node() -> int | None:
    tasks = os.environ.get("SLURM_NTASKS_PER_NODE", "")
    return int(tasks) if SLURMEnvironment.detect() and tasks.isdigit() else None


def fabric_layout(devices: int, num_nodes: int, visible_gpus: int) -> FabricLayout:
    """The Fabric layout of a run on ``devices`` ranks per node x ``num_nodes`` nodes (validated against
    the launcher by bench/assembly/validation.py check_launcher) when this process sees ``visible_gpus`` GPUs."""
    if torchrun_launched():  # torchrun's ranks, whatever srun says
        return FabricLayout(devices, num_nodes, [], "torchrun's ranks")
    tasks = slurm_tasks_per_node()
    if tasks is not None and tasks > 1 and visible_gpus == 1 and devices == tasks:
        every = int(os.environ["SLURM_NTASKS"])
        return FabricLayout(1, every, [OneDevicePerTask()],
                            f"one GPU per SLURM task: {every} tasks as nodes of one device each")
    return FabricLayout(devices, num_nodes)
