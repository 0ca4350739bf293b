"""Round checkpoints: global state (rank 0) plus each rank's client states, published atomically.

Layout: <checkpoint_dir>/<experiment>/<run_name>/round_00003/{global.pt, clients_rank0.pt, ...}.
A round directory is written as round_00003.tmp and renamed only after every rank wrote its
part, so a killed run never leaves a checkpoint that looks complete but is not. Client states
are keyed by client id, so a run can resume on a different number of ranks.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from bench.core.atomic_io import atomic_torch_save


class Checkpointer:
    def __init__(self, cfg, fabric) -> None:
        self.cfg, self.fabric = cfg, fabric
        self.dir = Path(cfg.checkpoint_dir) / cfg.experiment / cfg.run_name()

    def due(self, r: int) -> bool:
        every = self.cfg.checkpoint_every
        return every > 0 and ((r + 1) % every == 0 or r + 1 == self.cfg.fed.rounds)

    def save(self, r: int, snapshot: dict, clients: dict[int, dict]) -> None:
        final = self.dir / f"round_{r:05d}"
        tmp = self.dir / f"round_{r:05d}.tmp"
        rank = self.fabric.global_rank
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.fabric.barrier()
        atomic_torch_save(clients, tmp / f"clients_rank{rank}.pt")
        if rank == 0:
            atomic_torch_save({"round": r, **snapshot}, tmp / "global.pt")
        self.fabric.barrier()
        if rank == 0:
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            for old in self.dir.glob("round_*"):
                if old != final:
                    shutil.rmtree(old, ignore_errors=True)
        self.fabric.barrier()

    def latest(self) -> Path | None:
        done = sorted(p for p in self.dir.glob("round_*") if not p.name.endswith(".tmp") and (p / "global.pt").exists())
        return done[-1] if done else None

    def load_latest(self) -> tuple[int, dict, dict[int, dict]] | None:
        path = self.latest()
        if path is None:
            return None
        snap = torch.load(path / "global.pt", map_location=self.fabric.device, weights_only=False)
        clients: dict[int, dict] = {}
        for part in sorted(path.glob("clients_rank*.pt")):
            clients.update(torch.load(part, map_location=self.fabric.device, weights_only=False))
        return snap.pop("round"), snap, clients

    def clear(self) -> None:
        if self.fabric.global_rank == 0:
            shutil.rmtree(self.dir, ignore_errors=True)
