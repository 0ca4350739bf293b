"""Central learning: the same module on the pooled training data, with a plain Lightning Trainer.

Epoch e sees exactly the batches a single federated client 0 would see in round e (same
derived seeds), so FedAvg with one client and one local epoch per round equals Central.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import lightning as L
import torch

from bench.config import RunConfig
from bench.core.batches import DeviceData, EpochBatches
from bench.core.seeding import TORCH_GLOBAL, derive_seed
from bench.evaluation import evaluate_local, evaluate_sharded
from bench.federation import lr_for_round


class _RoundLikeEpochs(L.Callback):
    """Per epoch: derive the batch order and global torch seed as for round e, set the round's lr,
    and evaluate after the epoch as the orchestrator does after a round."""

    def __init__(self, cfg: RunConfig, batches: EpochBatches, evaluate: Callable[[int], dict]) -> None:
        self.cfg, self.batches, self.evaluate = cfg, batches, evaluate
        self.history: list[dict] = []

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        e = trainer.current_epoch
        self.batches.round_idx = e
        torch.manual_seed(derive_seed(self.cfg.seed, e, 0, TORCH_GLOBAL))
        for group in trainer.optimizers[0].param_groups:
            group["lr"] = lr_for_round(self.cfg, e)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        e = trainer.current_epoch
        last = e + 1 == trainer.max_epochs
        metrics = self.evaluate(e) if ((e + 1) % self.cfg.fed.eval_every == 0 or last) else {}
        pl_module.train()
        self.history.append({"round": e, "clients": [0], "lr": lr_for_round(self.cfg, e), "metrics": metrics})


def train_central(fabric, cfg: RunConfig, module, train: DeviceData, val: DeviceData | None, test: DeviceData,
                  log: Callable[[dict, int], None] | None = None) -> list[dict]:
    """Train for rounds x local_epochs epochs on all of ``train``; returns a round-shaped history."""
    if fabric.world_size > 1:  # one device trains, the other ranks wait and receive its result
        history = None
        if fabric.global_rank == 0:
            history = _train(fabric, cfg, module, train, val, test, log, sharded_eval=False)
        history = fabric.broadcast(history, src=0)
        state = fabric.broadcast({k: v.cpu() for k, v in module.state_dict().items()}, src=0)
        module.load_state_dict(state)
        return history
    return _train(fabric, cfg, module, train, val, test, log, sharded_eval=True)


def _train(fabric, cfg: RunConfig, module, train: DeviceData, val: DeviceData | None, test: DeviceData,
           log: Callable[[dict, int], None] | None, sharded_eval: bool) -> list[dict]:
    indices = torch.arange(len(train.labels), device=train.labels.device)
    batches = EpochBatches(train, indices, cfg.fed.batch_size, cfg.seed, 0, 0, cfg.data.augment)

    def evaluate(e: int) -> dict:
        out = {}
        for split, data in (("val", val), ("test", test)):
            if data is not None:
                if sharded_eval:
                    m = evaluate_sharded(module, data, fabric, module.num_classes)
                else:  # only this rank is here: no collectives
                    m = evaluate_local(module, data, torch.arange(len(data.labels), device=data.labels.device),
                                       fabric, module.num_classes)
                out.update({f"{split}/{k}": v for k, v in m.items()})
        if log is not None:
            log(out, e)
        return out

    callback = _RoundLikeEpochs(cfg, batches, evaluate)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda"):
        logging.getLogger(name).setLevel(logging.WARNING)  # no "GPU available: False" chatter per run
    trainer = L.Trainer(
        max_epochs=cfg.fed.rounds * cfg.fed.local_epochs, accelerator=fabric.device.type, devices=1,
        precision=cfg.precision, logger=False, enable_checkpointing=False, enable_model_summary=False,
        enable_progress_bar=cfg.progress, num_sanity_val_steps=0, callbacks=[callback],
    )
    trainer.fit(module, train_dataloaders=batches)
    return callback.history

