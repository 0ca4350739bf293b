"""Central learning as a federation of one client holding the pooled training data.

Central trains for rounds x local_epochs epochs with one optimizer; epoch e sees exactly the batches,
learning rate and global torch seed of client 0's single local epoch in round e of a federation.
So the Federation runs it as it is: one client (all training samples), rounds' = rounds x
local_epochs rounds of one local epoch each, the client's optimizer state carried over between
rounds. FedAvg with one client and one local epoch per round equals Central (tests/engine/test_core_equivalences.py).
"""
from __future__ import annotations

import copy

import torch

from bench.assembly.config import RunConfig
from bench.engine.federation import ClientSplit


def as_one_client(cfg: RunConfig, num_train: int, device) -> tuple[RunConfig, list[ClientSplit]]:
    """The config and client list under which a Federation trains ``cfg``'s central run."""
    central = copy.deepcopy(cfg)
    central.fed.rounds = cfg.fed.rounds * cfg.fed.local_epochs
    central.fed.local_epochs = 1
    central.fed.sample_ratio = 1.0
    central.fed.keep_optimizer_state = True  # one optimizer across all epochs
    return central, [ClientSplit(torch.arange(num_train, device=device))]
