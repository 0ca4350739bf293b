"""Round checkpoints: global state (rank 0) plus each rank's client states, published atomically,
bound to the config that wrote them and loaded tensors-only.

Layout: <checkpoint_dir>/<experiment>/<run_name>/round_00003/{global.pt, clients_rank0.pt, ...}.
A round directory is written as round_00003.tmp and renamed only after every rank wrote its
part, so a killed run never leaves a checkpoint that looks complete but is not. The last two
complete rounds are kept: when the newest cannot be used (unreadable, a rank's file missing),
``load_latest`` falls back to the older one and says so.

``global.pt`` holds the binding (the result-determining config, its hash, the code version and
the data files' fingerprint), the manifest (world size: one ``clients_rank<k>.pt`` per rank, each
holding exactly the clients c with c % world_size == k) and the run's wall time so far. Client
states are keyed by client id, so a run can resume on a different number of ranks. Everything is
tensors and plain containers, loaded with ``torch.load(weights_only=True)``: a file that needs
anything else (a crafted pickle) is refused without running it.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.code_version import code_version
from bench.config import RunConfig, config_differences, result_config
from bench.core.atomic_io import atomic_torch_save
from bench.core.errors import FedbenchError, first_line
from bench.liveness import waiting_on

FORMAT = 2
KEEP = 2  # complete checkpoints kept: the newest and one to fall back to


class CheckpointError(FedbenchError):
    pass


class Unusable(Exception):
    """A checkpoint folder that cannot be resumed from (the reason is the message)."""


def bound_config(cfg: RunConfig) -> dict[str, Any]:
    """The config a checkpoint is bound to: what determines the numbers (result_config leaves out the
    EXECUTION options: devices, folders, data.cache_dir, timeout, ...)."""
    return json.loads(json.dumps(result_config(cfg.to_dict()), default=str))


def binding(cfg: RunConfig, data_fingerprint: str) -> dict[str, Any]:
    config = bound_config(cfg)
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    return {"config": config, "config_hash": digest, "code_version": code_version(), "data": data_fingerprint}


def binding_differences(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    if not old:
        return ["(checkpoint written by a fedbench without a config binding)"]
    diffs = [] if old.get("config_hash") == new["config_hash"] else config_differences(old["config"], new["config"])
    if old.get("code_version") != new["code_version"]:
        diffs.append(f"code version: {old.get('code_version')!r} -> {new['code_version']!r}")
    if old.get("data") != new["data"]:
        diffs.append("data files: changed since the checkpoint (files added, removed or modified)")
    return diffs


def safe_load(path: Path, device) -> Any:
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise Unusable(f"{path.name} is missing") from None
    except Exception as err:  # noqa: BLE001 - truncated, foreign or crafted file: never executed, reported
        first = first_line(err, 160)
        kind = "holds objects other than tensors and plain data (refused)" if "weights_only" in str(err).lower() \
            or "unpickl" in type(err).__name__.lower() else "is unreadable"
        raise Unusable(f"{path.name} {kind}: {first}") from None


class Checkpointer:
    def __init__(self, cfg, fabric) -> None:
        self.cfg, self.fabric = cfg, fabric
        self.dir = Path(cfg.checkpoint_dir) / cfg.experiment / cfg.run_name()
        self.data_fingerprint = ""  # set by run_experiment once the data is loaded
        self.session_start = time.time()
        self.prior_seconds = 0.0  # wall time of the sessions before a resume
        self.previous: Path | None = None  # the last checkpoint this run wrote or resumed from
        self.resumed: dict[str, Any] | None = None  # what load_latest restored, for the record

    def elapsed(self) -> float:
        """Wall seconds of the whole run so far, across resumes."""
        return self.prior_seconds + time.time() - self.session_start

    def due(self, r: int) -> bool:
        every = self.cfg.checkpoint_every
        return every > 0 and ((r + 1) % every == 0 or r + 1 == self.cfg.fed.rounds)

    def barrier(self) -> None:
        with waiting_on(self.fabric, "the checkpoint barrier"):
            self.fabric.barrier()

    def save(self, r: int, snapshot: dict, clients: dict[int, dict]) -> None:
        final = self.dir / f"round_{r:05d}"
        tmp = self.dir / f"round_{r:05d}.tmp"
        rank, world = self.fabric.global_rank, self.fabric.world_size
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.barrier()
        atomic_torch_save({"rank": rank, "world_size": world, "clients": clients}, tmp / f"clients_rank{rank}.pt")
        if rank == 0:
            header = {"format": FORMAT, "round": r, "binding": binding(self.cfg, self.data_fingerprint),
                      "manifest": {"world_size": world}, "wall_seconds": self.elapsed()}
            atomic_torch_save({**header, **snapshot}, tmp / "global.pt")
        self.barrier()
        if rank == 0:
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            keep = {final, self.previous}
            for old in self.dir.glob("round_*"):
                if old not in keep:
                    shutil.rmtree(old, ignore_errors=True)
        self.previous = final
        self.barrier()

    def complete(self) -> list[Path]:
        """Published round folders, newest first."""
        return sorted((p for p in self.dir.glob("round_*") if not p.name.endswith(".tmp")
                       and (p / "global.pt").exists()), reverse=True)

    def latest(self) -> Path | None:
        done = self.complete()
        return done[0] if done else None

    def read(self, path: Path) -> tuple[dict, dict[int, dict]]:
        """(global snapshot with its header, every client's state) of one round folder, or Unusable."""
        device = None if self.fabric is None else self.fabric.device
        snap = safe_load(path / "global.pt", device)
        if not isinstance(snap, dict) or "round" not in snap:
            raise Unusable("global.pt is not a fedbench checkpoint")
        world = (snap.get("manifest") or {}).get("world_size")
        if world is None:  # written before manifests: every rank file present is all there is
            world = len(list(path.glob("clients_rank*.pt")))
        clients: dict[int, dict] = {}
        for k in range(world):
            part = safe_load(path / f"clients_rank{k}.pt", device)
            if "clients" not in part:  # format 1: the client dict itself
                part = {"rank": k, "world_size": world, "clients": part}
            owned = set(part["clients"])
            if part["rank"] != k or part["world_size"] != world or any(c % world != k for c in owned):
                raise Unusable(f"clients_rank{k}.pt does not hold rank {k} of {world}'s clients")
            clients.update(part["clients"])
        return snap, clients

    def load_latest(self) -> tuple[int, dict, dict[int, dict]] | None:
        """The newest usable checkpoint (falling back to the older one, with a message), after checking
        that it was written under the same config, code and data; None when there is none."""
        force = self.cfg.resume == "force"
        skipped = []
        for path in self.complete():
            try:
                snap, clients = self.read(path)
            except Unusable as why:
                skipped.append(f"{path.name}: {why}")
                continue
            break
        else:
            if skipped:
                raise CheckpointError(f"Cannot resume: no usable checkpoint under {self.dir} ("
                                      + "; ".join(skipped) + "). Delete the folder to start over without --resume.")
            self.say(f"--resume: no checkpoint under {self.dir}; starting from round 0.")
            return None
        if skipped:
            self.say(f"--resume: {'; '.join(skipped)}. Resuming from the older checkpoint {path.name} instead.")
        diffs = binding_differences(snap.pop("binding", None), binding(self.cfg, self.data_fingerprint))
        if diffs and not force:
            raise CheckpointError(
                f"Cannot resume from {path}: it was written under a different setup: {'; '.join(diffs)}. "
                "Resume with the setup it was written with, start over without --resume, or pass "
                "--resume force to continue anyway (the record will list these differences).")
        if diffs:
            self.say(f"--resume force: continuing from {path.name} despite: {'; '.join(diffs)}.")
        self.prior_seconds = float(snap.pop("wall_seconds", 0.0))
        for key in ("format", "manifest"):
            snap.pop(key, None)
        self.previous = path
        last_round = snap.pop("round")
        self.resumed = {"from_round": last_round, "checkpoint": str(path), "skipped": skipped}
        if diffs:
            self.resumed["forced_differences"] = diffs
        return last_round, snap, clients

    def say(self, message: str) -> None:
        if self.fabric is None or self.fabric.global_rank == 0:
            print(f"fedbench: {message}", file=sys.stderr, flush=True)
