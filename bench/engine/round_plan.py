"""What the round engine reads of a run, resolved once (issue 40, "resolved once").

The round engine (bench/engine/federation.py and bench/engine/checkpoint.py) never sees the RunConfig: the run's assembly
(bench/assembly/run_plan.py) resolves it into these frozen values once, after the evaluation protocol is known, and
the engine reads them. A central run is planned as the federation of one client that trains it
(bench/assembly/central.py), so its plan already holds that federation's rounds.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LrSchedule:
    """The client learning rate of round r: ``base x decay^r``, times ``gamma`` for each milestone reached."""

    base: float
    decay: float
    milestones: tuple[int, ...]
    gamma: float

    def at(self, round_idx: int) -> float:
        lr = self.base * self.decay**round_idx
        return lr * self.gamma ** sum(round_idx >= m for m in self.milestones)


@dataclass(frozen=True)
class CheckpointPlan:
    """Where and when a run checkpoints, and what its checkpoints are bound to."""

    folder: Path  # <checkpoint_dir>/<experiment>/<record name>: keyed like the run's record
    run_name: str  # other folders of this name (other result identities) are looked at on --resume
    every: int  # checkpoint every this many rounds and at the last (0: never)
    rounds: int
    resume: bool | str  # False, True or "force"
    config: dict[str, Any]  # the result-determining config (JSON-plain), as checkpoints store it
    code_version: str


@dataclass(frozen=True)
class RoundPlan:
    """One run's rounds, as the Federation runs them."""

    method: str
    seed: int
    rounds: int
    sample_ratio: float
    weighting: str  # "samples" or "uniform": a client's aggregation weight
    batch_size: int
    local_epochs: int
    augment: str
    keep_optimizer_state: bool
    precision: str
    optimizer: str
    lr: LrSchedule
    protocol: str  # what the run scores: global, per_client or local_mean
    eval_every: int
    eval_batch_size: int | None
    test_rounds: str  # "all" or "val_improves"
    progress: bool
    checkpoint: CheckpointPlan

    def is_eval_round(self, r: int) -> bool:
        return (r + 1) % self.eval_every == 0 or r + 1 == self.rounds
