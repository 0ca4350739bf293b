"""A method's server side: a part its module holds (``module.server_side``), as objective terms are the
parts of its client objective (lightning_modules/base.py).

The orchestrator (bench/engine/federation.py) drives it, on every rank, with identical inputs:

    upload_shapes()                           the shapes of the extra uploads clients put in ctx.uploads
                                              (known on every rank: they share the round's one all-reduce)
    step(global_state, extras, round, server) after aggregation: update the server state from the summed
                                              uploads; may edit global_state in place (FedDyn)
    scalars(round)                            numbers worth a per-round curve, read after ``step``
    state() / load_state(state, server)       the server state beyond the global model, checkpointed

``server`` is always the run's ServerContext: how many clients the federation has, whether this rank runs
the once-only work (rank 0: FedBM's generator training) and ``broadcast`` to hand its result to the other
ranks. The base part does nothing: FedAvg's server only averages. A part keeps its own state (Scaffold's
control variate, FedDyn's h) and reaches the model through ``self.module``; a client step reads that state
through ``module.server_side``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # the module type, for annotations only (base.py imports this file)
    from lightning_modules.base import FederatedModule


@dataclass(frozen=True)
class ServerContext:
    """What a method's server side is given besides the round's inputs (the server's counterpart of
    ClientContext, passed to ``ServerPart.step`` and ``load_state``): ``num_clients`` in the federation;
    ``is_server``, True on the rank that runs once-only work (rank 0); ``broadcast(obj)``, that rank's
    ``obj`` on every rank. A single process (a unit test) uses ``ServerContext(num_clients)``."""

    num_clients: int
    is_server: bool = True
    broadcast: Callable[[Any], Any] = lambda obj: obj


class ServerPart:
    """The server side of a method (module docstring). This one does nothing: the orchestrator's
    average is the whole server step."""

    def __init__(self, module: FederatedModule) -> None:
        self.module = module

    def upload_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes of the extra uploads, known on every rank (they share the one all-reduce)."""
        return {}

    def step(self, global_state: dict[str, torch.Tensor], extras: dict[str, torch.Tensor], round_idx: int,
             server: ServerContext) -> None:
        """Runs on every rank after aggregation, with identical inputs; may edit global_state in place.
        Work that should run once runs where ``server.is_server`` and reaches the other ranks through
        ``server.broadcast``."""

    def scalars(self, round_idx: int) -> dict[str, float]:
        """Numbers worth a curve (FedBM's generator loss, Scaffold's control-variate norm), read once per
        round after ``step`` on every rank (identical there); logged as ``method/<name>`` in the history
        and W&B. Default: none."""
        return {}

    def state(self) -> dict[str, torch.Tensor]:
        """Server state beyond the global model (checkpointed)."""
        return {}

    def load_state(self, state: dict[str, torch.Tensor], server: ServerContext) -> None:
        """Restore what ``state`` returned (a resumed run)."""
