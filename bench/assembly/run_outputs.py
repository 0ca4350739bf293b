"""What a run reports as it goes: the observer interface (RunObserver; W&B's implements it), each round's
scalars to the run's loggers and its observer, the CSV and TensorBoard loggers, and the record's facts of how
the run executed and what CPU time and page faults it cost per rank. Split out of bench/assembly/experiment.py."""
from __future__ import annotations

import contextlib
import math
import resource
import sys
from pathlib import Path
from typing import Any

import torch
from lightning.fabric import Fabric
from lightning.fabric.loggers import CSVLogger, Logger

from bench.assembly.config import RunConfig
from bench.core.allocator import allocator_status
from bench.core.numerics import gpu_math_settings
from bench.engine.liveness import waiting_on
from lightning_modules.base import FederatedModule, needs_loss_scaling


class RunObserver:
    """What a caller watches of a run: run_experiment calls it on every rank (an observer that logs
    acts on rank 0). This one does nothing; W&B's is bench.tracking.wandb_logger.WandbObserver,
    which the CLI and the table runner pass when cfg.wandb is set."""

    def start(self, cfg: RunConfig, rank: int) -> None:
        """The run's data and model are built; ``rank`` is this process's global rank."""

    def loggers(self) -> list[Logger]:
        """Fabric loggers this observer adds to the run (after ``start``; W&B's on rank 0): every round's
        scalars reach them, with the CSV and TensorBoard loggers, through ``fabric.log_dict``."""
        return []

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """The scalars of round ``step`` (what the run's Fabric loggers received)."""

    def federation_built(self, federation: Any) -> None:
        """The run's Federation (bench/engine/federation.py) is built, before its first round: a caller that
        inspects the run (its module, client states, history; a test) keeps it instead of patching the engine."""

    def round_done(self, round_idx: int) -> None:
        """Round ``round_idx`` is over: logged and, when due, checkpointed (a run stopped here resumes after
        it). What a caller (or a test stopping a run at a round) hooks instead of patching the engine."""

    def summary(self, record: dict[str, Any]) -> None:
        """The finished run's record, before it is written."""

    def finish(self, exit_code: int = 0) -> None:
        """The run is over: exit code 0 after ``summary``, 1 when it raised."""



def bytes_per_client_round(module: FederatedModule) -> dict[str, int]:
    """What one client receives (the shared state) and sends (it plus the method's extra uploads, as
    float32 on the wire) per round."""
    shared = set(module.shared_keys())
    shared_bytes = sum(t.numel() * t.element_size() for k, t in module.state_dict().items() if k in shared)
    extra_bytes = 4 * sum(math.prod(s) for s in module.server_side.upload_shapes().values())
    return {"down": shared_bytes, "up": shared_bytes + extra_bytes}



def round_scalars(entry: dict, per_client: dict[str, int]) -> dict[str, float]:
    """Everything a round's history entry says, as flat scalars for a per-round logger (W&B): its
    evaluation metrics (evaluated rounds), lr, seconds, clients and samples trained, bytes moved."""
    clients = len(entry["clients"])
    loss = {} if entry.get("train_loss") is None else {"train/loss": entry["train_loss"]}
    loss.update({f"method/{k}": v for k, v in (entry.get("method_scalars") or {}).items()})
    return {**(entry.get("metrics") or {}), **loss, "lr": entry["lr"], "time/round_seconds": entry["round_seconds"],
            "time/train_seconds": entry["train_seconds"], "time/eval_seconds": entry["eval_seconds"],
            "clients_trained": clients, "samples_trained": entry["samples_trained"],
            "comm/bytes_down": per_client["down"] * clients, "comm/bytes_up": per_client["up"] * clients}



def run_loggers(cfg: RunConfig) -> list[Logger]:
    """The run's own Fabric loggers: CSV (always), under <output_dir>/<experiment>/csv/<run name>, and
    TensorBoard (cfg.tensorboard; validate_config checks the package is there) under .../tensorboard."""
    run_dir = Path(cfg.output_dir) / cfg.experiment
    out: list[Logger] = [CSVLogger(root_dir=str(run_dir / "csv"), name=cfg.run_name())]
    if cfg.tensorboard:
        from lightning.fabric.loggers import TensorBoardLogger

        out.append(TensorBoardLogger(root_dir=str(run_dir / "tensorboard"), name=cfg.run_name()))
    return out



@contextlib.contextmanager
def attached_loggers(fabric: Fabric, loggers: list[Logger]):
    """``loggers`` in ``fabric.loggers`` for the body (a table's runs share one launched Fabric, each with
    its own loggers); on leaving, each is finalized ("success", or "failed" when the body raised; the CSV
    file is written then) and taken out again."""
    fabric.loggers.extend(loggers)
    status = "failed"
    try:
        yield
        status = "success"
    finally:
        for logger in loggers:
            fabric.loggers.remove(logger)
            try:
                logger.finalize(status)
            except OSError as err:  # a full disk: the per-round CSV is a copy of what the record holds
                optional_output_failed(f"the {type(logger).__name__} log under {logger.log_dir}", err)



def optional_output_failed(what: str, err: BaseException) -> None:
    """An output the record does without (a plot, a CSV log) could not be written: one warning line."""
    print(f"fedbench: warning: {what} was not written ({err}); the run's record is written all the same.",
          file=sys.stderr, flush=True)



def log_round(fabric: Fabric, observer: RunObserver, entry: dict, per_client: dict[str, int]) -> None:
    """A finished round's scalars (round_scalars, with ``round``) to every Fabric logger, at step = round,
    and to the observer. Host floats from the round's history entry: no device sync, no collective (the
    loggers write on rank 0 only)."""
    scalars = {**round_scalars(entry, per_client), "round": entry["round"]}
    try:
        fabric.log_dict(scalars, step=entry["round"])
    except OSError as err:  # the CSV logger flushes every 100 steps: a full disk there must not end the run
        optional_output_failed(f"the loggers' copy of round {entry['round']}", err)
    observer.log(scalars, step=entry["round"])



def execution_record(fabric: Fabric, precision: str) -> dict[str, Any]:
    """How this run executed: ranks, torch threads per rank, the C allocator's policy
    (bench/core/allocator.py), the device, the precision and the CUDA float32 flags in effect
    (bench/core/numerics.py), with whether float16 losses were scaled."""
    return {"ranks": fabric.world_size, "threads_per_rank": torch.get_num_threads(),
            "allocator": allocator_status(), "device": str(fabric.device), "precision": precision,
            "loss_scaling": needs_loss_scaling(precision, fabric.device), "math": gpu_math_settings(),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled()}



USAGE_FIELDS = ("user_seconds", "system_seconds", "minor_faults", "major_faults")



def process_usage() -> torch.Tensor:
    """This process's CPU time (user, system, seconds) and page faults (minor, major) so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return torch.tensor([r.ru_utime, r.ru_stime, r.ru_minflt, r.ru_majflt], dtype=torch.float64, device="cpu")



def ranks_cpu_usage(fabric: Fabric, since: torch.Tensor) -> dict[str, list[float]]:
    """Each rank's CPU time and page faults since ``since`` (its own ``process_usage`` at the start of
    the run), gathered with one all-reduce: what the whole run cost the machine, rank by rank."""
    table = torch.zeros(fabric.world_size, len(USAGE_FIELDS), dtype=torch.float64, device=fabric.device)
    table[fabric.global_rank] = (process_usage() - since).to(fabric.device)
    if fabric.world_size > 1:
        with waiting_on(fabric, "the CPU-usage all-reduce at the end of the run"):
            fabric.all_reduce(table, reduce_op="sum")
    return {name: table[:, i].tolist() for i, name in enumerate(USAGE_FIELDS)}
