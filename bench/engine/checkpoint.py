"""Round checkpoints: global state (rank 0) plus each rank's client states, published atomically,
bound to the config that wrote them and loaded tensors-only.

Layout: <checkpoint_dir>/<experiment>/<record_name>/round_00003/{global.pt, clients_rank0.pt, ...}: the
folder is keyed like the run's record (run name + result identity), so runs of one name under
different result configs (another lr, another number of rounds) never share or prune each other's
checkpoints. A round directory is written as round_00003.tmp and renamed only after every rank wrote
its part, so a killed run never leaves a checkpoint that looks complete but is not; a part that
cannot be written (full disk) removes the temporary folder and stops the run with one error, the
previous checkpoint untouched. A run keeps its last two complete rounds and prunes only its own:
when the newest cannot be used (unreadable, a rank's file missing), ``load_latest`` falls back to the
older one and says so.

``global.pt`` holds the binding (the result-determining config, its hash, the code version and
the data files' fingerprint), the manifest (world size: one ``clients_rank<k>.pt`` per rank, each
holding exactly the clients c with c % world_size == k) and the run's wall time so far. Client
states are keyed by client id, so a run can resume on a different number of ranks. Everything is
tensors and plain containers, loaded with ``torch.load(weights_only=True)``: a file that needs
anything else (a crafted pickle) is refused without running it.
"""
from __future__ import annotations

import glob
import hashlib
import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.core.atomic_io import atomic_torch_save
from bench.core.code_version import same_code
from bench.core.errors import FedbenchError, first_line
from bench.engine.liveness import barrier, other_rank_error, post_rank_error, waiting_on
from bench.engine.round_plan import CheckpointPlan

FORMAT = 2
KEEP = 2  # complete checkpoints kept: the newest and one to fall back to


class CheckpointError(FedbenchError):
    pass


class Unusable(Exception):
    """A checkpoint folder that cannot be resumed from (the reason is the message)."""


def attempt(write) -> OSError | None:
    """Run ``write``; the OSError it raised (a full disk: NoSpaceError, bench/core/atomic_io.py), or None."""
    try:
        write()
    except OSError as err:
        return err
    return None


def binding(plan: CheckpointPlan, data_fingerprint: str) -> dict[str, Any]:
    """What a checkpoint is bound to: the result-determining config, its hash, the code version and the data
    files' fingerprint."""
    digest = hashlib.sha256(json.dumps(plan.config, sort_keys=True).encode()).hexdigest()[:16]
    return {"config": plan.config, "config_hash": digest, "code_version": plan.code_version, "data": data_fingerprint}


def config_differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """The keys whose values differ, as dotted paths with both values: ['method.lr: 0.01 -> 0.5']."""
    out = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, f"{prefix}{key}.")
        elif json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True, default=str):
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


def binding_differences(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    if not old:
        return ["(checkpoint written by a fedbench without a config binding)"]
    diffs = [] if old.get("config_hash") == new["config_hash"] else config_differences(old["config"], new["config"])
    if not same_code(old.get("code_version"), new["config"]):  # a legacy version: by its tree's parts
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


def unfinished(snap: dict) -> bool:
    """Whether a checkpoint's run stopped before its last round (one a user would mean to resume)."""
    rounds = (((snap.get("binding") or {}).get("config") or {}).get("fed") or {}).get("rounds")
    return not isinstance(rounds, int) or snap["round"] + 1 < rounds


class Checkpointer:
    def __init__(self, plan: CheckpointPlan, fabric) -> None:
        self.plan, self.fabric = plan, fabric
        self.dir = plan.folder
        self.data_fingerprint = ""  # set by run_experiment once the data is loaded
        self.session_start = time.time()
        self.prior_seconds = 0.0  # wall time of the sessions before a resume
        self.previous: Path | None = None  # the last checkpoint this run wrote or resumed from
        self.mine: set[Path] = set()  # round folders of this run (written, or continued): the only ones it prunes
        self.resumed: dict[str, Any] | None = None  # what load_latest restored, for the record

    def elapsed(self) -> float:
        """Wall seconds of the whole run so far, across resumes."""
        return self.prior_seconds + time.time() - self.session_start

    def due(self, r: int) -> bool:
        every = self.plan.every
        return every > 0 and ((r + 1) % every == 0 or r + 1 == self.plan.rounds)

    def barrier(self) -> None:
        barrier(self.fabric, "the checkpoint barrier")

    def save(self, r: int, snapshot: dict, clients: dict[int, dict]) -> None:
        """Write round ``r``'s checkpoint into round_<r>.tmp, then publish it as round_<r> once every rank
        wrote its part. A rank that cannot write (full disk) makes every rank stop with one CheckpointError;
        the temporary folder is removed and the previous checkpoint stays as it was."""
        final = self.dir / f"round_{r:05d}"
        tmp = self.dir / f"round_{r:05d}.tmp"
        rank, world = self.fabric.global_rank, self.fabric.world_size
        failed = None
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            failed = attempt(lambda: tmp.mkdir(parents=True))
        self.barrier()
        if failed is None:
            failed = attempt(lambda: atomic_torch_save({"rank": rank, "world_size": world, "clients": clients},
                                                       tmp / f"clients_rank{rank}.pt"))
        if failed is None and rank == 0:
            header = {"format": FORMAT, "round": r, "binding": binding(self.plan, self.data_fingerprint),
                      "manifest": {"world_size": world}, "wall_seconds": self.elapsed()}
            failed = attempt(lambda: atomic_torch_save({**header, **snapshot}, tmp / "global.pt"))
        failure = self.agree(failed)  # a collective: every rank learns whether all parts were written
        if failure is not None:
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            kept = (f"The previous checkpoint {self.previous} is intact: free space, then continue the run with "
                    "--resume true." if self.previous else "This run has no earlier checkpoint: free space (or "
                    "point --checkpoint_dir elsewhere) and run it again.")
            raise CheckpointError(f"Checkpoint {final.name} was not written: {failure}. {kept}")
        if rank == 0:
            self.publish(tmp, final)
        self.previous = final
        self.barrier()

    def agree(self, failed: OSError | None) -> str | None:
        """Every rank's view of one checkpoint write: None when all ranks wrote their part, else the error
        (this rank's own, or the one the failing rank posted)."""
        if self.fabric.world_size == 1:
            return None if failed is None else str(failed)
        if failed is not None:
            post_rank_error(self.fabric.global_rank, str(failed))
        flag = torch.tensor([0.0 if failed is None else 1.0], device=self.fabric.device)
        with waiting_on(self.fabric, "the checkpoint barrier"):
            self.fabric.all_reduce(flag, reduce_op="sum")
        if flag.item() == 0:
            return None
        if failed is not None:
            return str(failed)
        return other_rank_error(self.fabric.global_rank, self.fabric.world_size) or "another rank could not write its part"

    def publish(self, tmp: Path, final: Path) -> None:
        """Rank 0: rename the complete ``tmp`` to ``final`` and prune this run's own older round folders
        (the newest and the one before stay). Folders of other runs are never touched."""
        shutil.rmtree(final, ignore_errors=True)  # only ever this configuration's own round r
        tmp.rename(final)
        self.mine.add(final)
        for old in sorted(self.mine - {final, self.previous}):
            shutil.rmtree(old, ignore_errors=True)
        self.mine &= {final, self.previous}

    def complete(self, folder: Path | None = None) -> list[Path]:
        """Published round folders (of this run's folder, or ``folder``), newest first."""
        folder = self.dir if folder is None else folder
        return sorted((p for p in folder.glob("round_*") if not p.name.endswith(".tmp")
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

    def newest_usable(self, folder: Path) -> tuple[Path, dict, dict[int, dict], list[str]] | None:
        """(round folder, snapshot, client states, the newer folders skipped with why) of ``folder``'s newest
        readable checkpoint; None when it has no published round; CheckpointError when none is readable."""
        skipped = []
        for path in self.complete(folder):
            try:
                snap, clients = self.read(path)
            except Unusable as why:
                skipped.append(f"{path.name}: {why}")
                continue
            return path, snap, clients, skipped
        if skipped:
            raise CheckpointError(f"Cannot resume: no usable checkpoint under {folder} ("
                                  + "; ".join(skipped) + "). Delete the folder to start over without --resume.")
        return None

    def other_runs(self) -> list[Path]:
        """The checkpoint folders of the same run name under other result identities (and the folder of
        the layout before checkpoints were keyed by identity: the bare run name), newest first."""
        pattern = re.compile(re.escape(self.plan.run_name) + r"(_[0-9a-f]{8})?")
        folders = [p for p in self.dir.parent.glob(f"{glob.escape(self.plan.run_name)}*")
                   if p != self.dir and p.is_dir() and pattern.fullmatch(p.name) and self.complete(p)]
        return sorted(folders, key=lambda p: self.complete(p)[0].stat().st_mtime, reverse=True)

    def from_other_run(self) -> tuple[Path, dict, dict[int, dict], list[str]] | None:
        """With no checkpoint of this configuration: one of the same run name written under this very
        setup (the layout before identity folders), else the newest unfinished one under another setup,
        which ``load_latest`` refuses unless --resume force; None when there is neither."""
        mine = binding(self.plan, self.data_fingerprint)
        other = None
        for folder in self.other_runs():
            try:
                found = self.newest_usable(folder)
            except CheckpointError:
                continue
            if found is None:
                continue
            diffs = binding_differences(found[1].get("binding"), mine)
            if not diffs:
                return found
            if other is None and unfinished(found[1]):
                other = found
        return other

    def load_latest(self) -> tuple[int, dict, dict[int, dict]] | None:
        """The newest usable checkpoint of this configuration (falling back to the older one, with a
        message), after checking that it was written under the same config, code and data; with none, an
        unfinished one of the same run name under another setup is refused (--resume force: used). None
        when there is none."""
        found = self.newest_usable(self.dir)
        if found is None:
            found = self.from_other_run()
        if found is None:
            self.say(f"--resume: no checkpoint under {self.dir}; starting from round 0.")
            return None
        path, snap, clients, skipped = found
        if skipped:
            self.say(f"--resume: {'; '.join(skipped)}. Resuming from the older checkpoint {path.name} instead.")
        diffs = binding_differences(snap.pop("binding", None), binding(self.plan, self.data_fingerprint))
        if diffs and self.plan.resume != "force":
            where = "" if path.parent == self.dir else (
                f" (there is no checkpoint of this configuration under {self.dir}; this one is of another run "
                "of the same name)")
            raise CheckpointError(
                f"Cannot resume from {path}{where}: it was written under a different setup: {'; '.join(diffs)}. "
                "Resume with the setup it was written with, start over without --resume, or pass "
                "--resume force to continue anyway (the record will list these differences).")
        if diffs:
            self.say(f"--resume force: continuing from {path} despite: {'; '.join(diffs)}.")
        return self.restored(path, snap, clients, skipped, diffs)

    def restored(self, path: Path, snap: dict, clients: dict[int, dict], skipped: list[str],
                 diffs: list[str]) -> tuple[int, dict, dict[int, dict]]:
        self.prior_seconds = float(snap.pop("wall_seconds", 0.0))
        for key in ("format", "manifest"):
            snap.pop(key, None)
        self.previous = path
        if path.parent == self.dir:  # this configuration's own folder: the run it continues is this one
            self.mine = set(self.complete())
        last_round = snap.pop("round")
        self.resumed = {"from_round": last_round, "checkpoint": str(path), "skipped": skipped}
        if diffs:
            self.resumed["forced_differences"] = diffs
        return last_round, snap, clients

    def say(self, message: str) -> None:
        if self.fabric is None or self.fabric.global_rank == 0:
            print(f"fedbench: {message}", file=sys.stderr, flush=True)
