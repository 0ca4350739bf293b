"""Resolve a RunConfig into what the round engine reads (bench/engine/round_plan.py), once per run.

Run assembly (bench/assembly/experiment.py, bench/assembly/central.py) sits above the engine: it holds the config and plans;
the Federation and the Checkpointer read only the plan.
"""
from __future__ import annotations

import json
from pathlib import Path

from bench.assembly.config import RunConfig, result_config
from bench.core.code_version import code_version
from bench.engine.round_plan import CheckpointPlan, LrSchedule, RoundPlan


def eval_protocol(cfg: RunConfig, module) -> str:
    """What a run evaluates (RunConfig.scored_protocol) with this method's module."""
    return cfg.scored_protocol(module.protocol, module.runs_centrally)


def checkpoint_plan(cfg: RunConfig) -> CheckpointPlan:
    """Where ``cfg``'s checkpoints go (keyed like its record, so that two configurations of one run name never
    share a folder) and what they are bound to: the result-determining config (result_config leaves out the
    EXECUTION options: devices, folders, data.cache_dir, timeout, ...) and the code version."""
    return CheckpointPlan(
        folder=Path(cfg.checkpoint_dir) / cfg.experiment / cfg.record_name(), run_name=cfg.run_name(),
        every=cfg.checkpoint_every, rounds=cfg.fed.rounds, resume=cfg.resume,
        config=json.loads(json.dumps(result_config(cfg.to_dict()), default=str)), code_version=code_version(cfg))


def plan_rounds(cfg: RunConfig, protocol: str) -> RoundPlan:
    """The rounds of ``cfg`` (for a central run: the config of its one-client federation, bench/assembly/central.py),
    scoring ``protocol``."""
    fed = cfg.fed
    return RoundPlan(
        method=cfg.method.name, seed=cfg.seed, rounds=fed.rounds, sample_ratio=fed.sample_ratio,
        weighting=fed.weighting, batch_size=fed.batch_size, local_epochs=fed.local_epochs, augment=cfg.data.augment,
        keep_optimizer_state=fed.keep_optimizer_state, precision=cfg.precision, optimizer=cfg.method.optimizer,
        lr=LrSchedule(cfg.method.lr, fed.lr_decay, tuple(fed.lr_milestones), fed.lr_gamma), protocol=protocol,
        eval_every=fed.eval_every, eval_batch_size=fed.eval_batch_size, test_rounds=fed.test_rounds,
        progress=cfg.progress, checkpoint=checkpoint_plan(cfg))
