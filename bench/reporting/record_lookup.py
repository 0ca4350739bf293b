"""Which record file holds a planned run: its identity name, or a record under the bare run name whose
result config is the run's (written by hand, by a test, or by a fedbench that named records by run name
alone). A record under the bare name with another config is never used for this run."""
from __future__ import annotations

from pathlib import Path

from bench.config import RunConfig, result_config
from bench.records import RecordError, latest_alias, load_record, run_record_path
from bench.reporting.spec import canonical, with_defaults


def same_result_config(rec: dict, cfg: RunConfig) -> bool:
    """Whether record ``rec`` was written under ``cfg``'s result config (options added since it was
    written count at their defaults)."""
    recorded = with_defaults(rec.get("config", {}))
    return canonical(result_config(recorded)) == canonical(result_config(cfg.to_dict()))


def find_record(cfg: RunConfig) -> Path | None:
    """The record file of ``cfg``'s run, or None. A broken bare-name file is skipped (RecordError only
    for the identity file, which is this run's for sure)."""
    path = run_record_path(cfg)
    if path.exists():
        return path
    bare = latest_alias(cfg)
    if bare.exists():
        try:
            if same_result_config(load_record(bare), cfg):
                return bare
        except RecordError:
            return None
    return None
