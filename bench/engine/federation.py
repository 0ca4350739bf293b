"""The Fabric round orchestrator: each rank trains its share of a round's clients; one all-reduce a round."""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from bench.core.batches import DeviceData
from bench.core.errors import FedbenchError
from bench.core.seeding import METHOD, TORCH_GLOBAL, derive_seed, sample_clients, torch_generator
from bench.engine.aggregation import RoundBuffer, client_metrics_row, copy_into
from bench.engine.checkpoint import Checkpointer, CheckpointError
from bench.engine.evaluation import eval_batch_size, evaluate_local, evaluate_sharded
from bench.engine.health import check_finite_state, nonfinite_hint
from bench.engine.liveness import other_rank_error, post_rank_error, set_round, waiting_on
from bench.engine.metrics import METRIC_NAMES, VAL_SCORES
from bench.engine.placement import assign_clients
from bench.engine.round_plan import RoundPlan
from lightning_modules.base import (
    ClientContext,
    FederatedModule,
    NoClientState,
    ServerContext,
    needs_loss_scaling,
)

CLIENT_METRICS = "__client_metrics"  # per-client metric sums ride in the round's one buffer
RANK_BUSY = "__rank_busy_seconds"  # each rank's seconds of work before the all-reduce (its own slot)
RANK_SAMPLES = "__rank_samples"  # each rank's samples trained this round
# the round bar's postfix: which split each number is from (val and test accuracy side by side)
BAR_KEYS = {"val/accuracy": "val_acc", "test/accuracy": "test_acc", "test/balanced_accuracy": "test_bacc"}
TRAIN_LOSS = "__train_loss"  # [sum of loss x batch size, samples] over the round's local steps
TERM_LOSS = "__term_loss/"  # + an objective term's name: the same for that term (logged as method/<name>_loss)


def loss_upload(losses: list, device) -> torch.Tensor:
    """A client's [sum of loss x batch size, samples] over its local steps, as float64 on ``device`` (one
    stack of the step losses; no host sync)."""
    total = torch.stack([weighted.to(torch.float64) for weighted, _ in losses]).sum()
    samples = torch.tensor(float(sum(n for _, n in losses)), dtype=torch.float64, device=device)
    return torch.stack([total.to(device), samples])


@dataclass
class ClientSplit:
    """A client's sample indices: what it trains on (into the training data), and its own test split
    (per-client protocol): indices into ``test_data``, or into the training data when that is None
    (a test split carved from the client's training share)."""

    train: torch.Tensor
    test: torch.Tensor | None = None
    test_data: DeviceData | None = None


@dataclass
class RoundLog:
    """One round of a run's history. Timings are rank 0's, except ``rank_busy_seconds`` (each rank's
    work before the round's all-reduce: training, per-client evaluation) and ``rank_idle_seconds``
    (how long each rank then waited at the all-reduce for the slowest: max busy - its own)."""

    round: int
    clients: list[int]
    lr: float
    train_seconds: float
    round_seconds: float
    samples_trained: int  # by all ranks
    metrics: dict[str, float] = field(default_factory=dict)
    eval_seconds: float = 0.0
    rank_clients: list[list[int]] = field(default_factory=list)  # the clients each rank trained
    rank_busy_seconds: list[float] = field(default_factory=list)
    rank_idle_seconds: list[float] = field(default_factory=list)
    train_loss: float | None = None  # mean local training loss over the round's clients' steps, by samples
    # the objective terms' mean losses and the server part's scalars
    method_scalars: dict[str, float] = field(default_factory=dict)


def server_context(fabric, num_clients: int) -> ServerContext:
    """The ServerContext a method's server part gets on this rank: the federation's size, whether this
    rank is the server (rank 0), and Fabric's broadcast from rank 0 (under the collective timeout)."""
    def broadcast(obj):
        if fabric.world_size == 1:
            return obj
        with waiting_on(fabric, "the server step's broadcast from rank 0"):
            return fabric.broadcast(obj, src=0)

    return ServerContext(num_clients=num_clients, is_server=fabric.global_rank == 0, broadcast=broadcast)


class Federation:
    """Runs the rounds of one experiment on this rank's shard of clients.

    Client c lives on rank c % world_size; its persistent state never leaves that rank. When the
    method keeps no per-client state, the round's clients are spread over the ranks by their sizes
    instead (bench/engine/placement.py). The sampled clients of a round are a pure function of (seed,
    round); every draw of a client's training derives from (seed, round, client); so the result does
    not depend on world size.
    """

    def __init__(self, fabric, plan: RoundPlan, module: FederatedModule, data: DeviceData,
                 clients: list[ClientSplit], val: DeviceData | None, test: DeviceData) -> None:
        self.fabric, self.plan, self.module = fabric, plan, module
        self.data, self.clients, self.val, self.test = data, clients, val, test
        self.num_classes = module.num_classes
        self.rank, self.world = fabric.global_rank, fabric.world_size
        self.owned = [c for c in range(len(clients)) if c % self.world == self.rank]
        self.client_states: dict[int, dict] = {c: {} for c in self.owned}
        self.model_state = module.state_dict()  # references to the live tensors
        self.shared = module.shared_keys()
        self.personal = module.personal_keys()
        # clients may train on any rank when nothing of theirs persists between rounds
        self.movable = not (self.personal or plan.keep_optimizer_state or module.keeps_client_state)
        # ... and are spread over the ranks by size only when the float64 sum of their float32 states does
        # not depend on which rank adds which client (it rounds to the same float32 model); under 64-true the
        # states are float64, where the order of the sum moves the last bits (1 vs 2 ranks of FedBM in
        # float64 differed by 3.5e-11 spread, 2.2e-16 by c % N): those runs keep client c on rank c % N
        self.spread = self.movable and not any(v.dtype == torch.float64 for v in self.model_state.values())
        self.sizes = [len(s.train) for s in clients]
        self.global_state = {k: self.model_state[k].clone() for k in self.shared}
        self.initial_personal = {k: self.model_state[k].clone() for k in self.personal}
        self.protocol = plan.protocol
        self.client_metrics: dict[int, dict[str, float]] = {}
        self.history: list[dict] = []
        self.start_round = 0
        self.checkpointer = Checkpointer(plan.checkpoint, fabric)
        self.on_round_end: Callable[[dict], None] | None = None
        self.on_round_done: Callable[[int], None] | None = None  # after the round's checkpoint, if due
        self.server = server_context(fabric, len(clients))

    # ---- one client ----------------------------------------------------------------------
    def client_state(self, c: int) -> dict:
        """Client c's persistent state, kept on its rank; for a method that keeps none, an empty
        state that refuses writes (the client may train on any rank)."""
        return NoClientState(self.module.method_name()) if self.movable else self.client_states[c]

    def load_client_model(self, c: int) -> dict:
        state = self.client_state(c)
        copy_into(self.model_state, self.global_state)
        if self.personal:
            copy_into(self.model_state, state.get("personal", self.initial_personal))
        return state

    def train_client(self, c: int, r: int) -> tuple[float, dict[str, torch.Tensor], int, ClientContext]:
        """Client c's local update in round r (module.client_batches, local_update, on_client_end);
        returns its aggregation weight, its extra uploads, the samples trained and its context."""
        plan, module = self.plan, self.module
        state = self.load_client_model(c)
        ctx = ClientContext(
            client_id=c, round_idx=r, seed=plan.seed, data=self.data, indices=self.clients[c].train,
            num_classes=self.num_classes, global_state=self.global_state, state=state,
            generator=torch_generator(derive_seed(plan.seed, r, c, METHOD), self.fabric.device),
            lr=plan.lr.at(r), batch_size=plan.batch_size, local_epochs=plan.local_epochs,
            augment=plan.augment, keep_optimizer_state=plan.keep_optimizer_state,
            autocast=self.fabric.autocast, loss_scaling=needs_loss_scaling(plan.precision, self.fabric.device),
        )
        torch.manual_seed(derive_seed(plan.seed, r, c, TORCH_GLOBAL))  # dropout and other global draws
        module.train()
        seen = module.local_update(ctx, module.client_batches(ctx))
        module.on_client_end(ctx)
        if self.personal:
            state["personal"] = {k: self.model_state[k].clone() for k in self.personal}
        weight = float(len(ctx.indices)) if plan.weighting == "samples" else 1.0
        return weight, ctx.uploads, seen, ctx

    def client_eval(self, ctx: ClientContext) -> dict[str, float] | None:
        """Per-client protocols: the client's model right after its local training, evaluated
        through the method's ``evaluate_client`` hook (FedBABU fine-tunes its head there)."""
        c, r = ctx.client_id, ctx.round_idx
        if self.protocol == "per_client":
            def evaluate() -> dict[str, float]:
                split = self.clients[c]
                data = self.data if split.test_data is None else split.test_data
                m = evaluate_local(self.module, data, split.test, self.fabric, self.num_classes,
                                   eval_batch_size(data, self.plan.eval_batch_size))
                return {f"test/{k}": v for k, v in m.items()}

            scores = self.module.evaluate_client(ctx, evaluate)
            return {k if "/" in k else f"test/{k}": v for k, v in scores.items()}
        if self.protocol == "local_mean" and self.is_eval_round(r):
            res = {}
            for split, data in (("val", self.val), ("test", self.test)):
                if data is not None:
                    m = evaluate_local(self.module, data, torch.arange(len(data.labels), device=data.labels.device),
                                       self.fabric, self.num_classes, eval_batch_size(data, self.plan.eval_batch_size))
                    res.update({f"{split}/{k}": v for k, v in m.items()})
            return res
        return None

    def is_eval_round(self, r: int) -> bool:
        return self.plan.is_eval_round(r)

    # ---- one round -----------------------------------------------------------------------
    def metric_keys(self) -> list[str]:
        if self.protocol == "local_mean":
            return [f"{s}/{m}" for s in ("val", "test") for m in METRIC_NAMES]
        return [f"test/{m}" for m in METRIC_NAMES]

    def run_round(self, r: int) -> RoundLog:
        """Sample the round's clients, train this rank's share into the round buffer, all-reduce it once,
        then aggregate, step the server and evaluate."""
        t0 = time.perf_counter()
        sampled = sample_clients(self.plan.seed, r, len(self.clients), self.plan.sample_ratio)
        placement = assign_clients(sampled, self.sizes, self.world, self.spread)
        keys = self.metric_keys()
        buf = self.round_buffer(len(keys))
        error, seen, train_time = self.train_share(r, placement[self.rank], buf, keys)
        busy, samples = (torch.zeros(self.world, dtype=torch.float64, device=buf.buf.device) for _ in range(2))
        busy[self.rank], samples[self.rank] = time.perf_counter() - t0, seen
        buf.add_extras({RANK_BUSY: busy, RANK_SAMPLES: samples})
        self.all_reduce_round(buf, r, error)
        busy_seconds, seen, train_loss, term_losses = self.apply_round(buf, keys, r)
        # one sync a round: the aggregate and the server step (finite client models can still average or
        # step into inf) must not carry NaN/inf into the next round, the record or a checkpoint
        check_finite_state(self.global_state, f"after aggregation and the server step of round {r}",
                           self.nonfinite_hint())
        log = RoundLog(r, sampled, self.plan.lr.at(r), train_time, 0.0, seen,
                       rank_clients=placement, rank_busy_seconds=busy_seconds,
                       rank_idle_seconds=[max(busy_seconds) - b for b in busy_seconds],
                       train_loss=train_loss, method_scalars={**term_losses, **self.module.server_side.scalars(r)})
        if self.is_eval_round(r):
            t = time.perf_counter()
            log.metrics = self.evaluate(r)
            log.eval_seconds = time.perf_counter() - t
        log.round_seconds = time.perf_counter() - t0
        return log

    def nonfinite_hint(self) -> str:
        return nonfinite_hint(self.plan.precision, self.plan.lr.base, self.plan.optimizer)

    def round_buffer(self, n_metrics: int) -> RoundBuffer:
        """The round's one buffer: shared state, the method's uploads, the per-client metrics table, each
        rank's busy seconds and samples, and the training-loss sum."""
        extra_shapes = dict(self.module.server_side.upload_shapes())
        extra_shapes[CLIENT_METRICS] = (len(self.clients), n_metrics + 1)
        extra_shapes[RANK_BUSY] = extra_shapes[RANK_SAMPLES] = (self.world,)
        extra_shapes[TRAIN_LOSS] = (2,)
        extra_shapes.update({TERM_LOSS + name: (2,) for name in self.module.terms})
        return RoundBuffer({k: self.global_state[k].shape for k in self.shared}, extra_shapes, self.fabric.device)

    def train_share(self, r: int, mine: list[int], buf: RoundBuffer, keys: list[str]):
        """Train this rank's clients of round r into ``buf``: (the first client error or None, samples
        seen, training seconds). A failing client marks the buffer, so that every rank stops after the
        all-reduce."""
        error: Exception | None = None
        seen, train_time = 0, 0.0
        for c in mine:
            try:
                t = time.perf_counter()
                weight, extras, n, ctx = self.train_client(c, r)
                check_finite_state(self.model_state, f"after local training in round {r}, client {c}",
                                   self.nonfinite_hint())
                train_time += time.perf_counter() - t
                seen += n
                scores = self.client_eval(ctx)
            except FedbenchError as err:
                error = err
                buf.mark_failure()
                if self.world > 1:
                    post_rank_error(self.rank, str(err))
                break
            if scores is not None:
                row = client_metrics_row(len(self.clients), c, [scores.get(k, float("nan")) for k in keys],
                                         buf.buf.device)
                extras = {**extras, CLIENT_METRICS: row}
            if ctx.losses:
                extras = {**extras, TRAIN_LOSS: loss_upload(ctx.losses, buf.buf.device)}
            extras = {**extras, **{TERM_LOSS + name: loss_upload(steps, buf.buf.device)
                                   for name, steps in ctx.term_losses.items() if steps}}
            buf.add_client({k: self.model_state[k] for k in self.shared}, weight, extras)
        return error, seen, train_time

    def all_reduce_round(self, buf: RoundBuffer, r: int, error: Exception | None) -> None:
        """The round's one all-reduce; then every rank raises a failing client's error (printed once, by
        rank 0)."""
        if self.world > 1:
            with waiting_on(self.fabric, "the round's aggregation all-reduce"):
                self.fabric.all_reduce(buf.buf, reduce_op="sum")
        if buf.failures:
            raise error if error is not None else FedbenchError(
                other_rank_error(self.rank, self.world)
                or f"Round {r}: a client on another rank failed (see that rank's error above).")

    def apply_round(self, buf: RoundBuffer, keys: list[str], r: int
                    ) -> tuple[list[float], int, float | None, dict[str, float]]:
        """Aggregate the reduced buffer into the global state, keep the per-client metrics, step the
        server: (each rank's busy seconds, samples seen over all ranks, the round's mean training loss,
        each objective term's mean loss as ``<term>_loss``)."""
        if self.shared:
            copy_into(self.global_state, buf.averaged_state())
        extras = buf.summed_extras()
        busy_seconds = extras.pop(RANK_BUSY).tolist()
        seen = int(extras.pop(RANK_SAMPLES).sum())  # over all ranks
        table = extras.pop(CLIENT_METRICS)
        loss_sum, loss_samples = extras.pop(TRAIN_LOSS).tolist()
        term_losses = {}
        for name in self.module.terms:
            term_sum, term_samples = extras.pop(TERM_LOSS + name).tolist()
            if term_samples:
                term_losses[f"{name}_loss"] = term_sum / term_samples
        for c in range(len(self.clients)):
            if table[c, -1] > 0:
                self.client_metrics[c] = dict(zip(keys, table[c, :-1].tolist()))
        self.module.server_side.step(self.global_state, extras, r, self.server)
        return busy_seconds, seen, (loss_sum / loss_samples if loss_samples else None), term_losses

    def test_due(self, r: int, val_metrics: dict[str, float]) -> bool:
        """Whether round r's evaluation scores the test set too: with ``fed.test_rounds: all`` at every
        evaluated round; with ``val_improves`` at the final round and where the validation metrics beat
        every earlier round's by accuracy or by FedBM's sum of five (the two validation round rules,
        bench/tables/protocols.py, whose ties go to the earliest round): the test metrics those
        rules report are the ones every-round evaluation would give."""
        if self.plan.test_rounds == "all" or r + 1 == self.plan.rounds or not val_metrics:
            return True
        earlier = [h["metrics"] for h in self.history if h.get("metrics")]
        return any(score(val_metrics) > max(map(score, earlier), default=-math.inf) for score in VAL_SCORES.values())

    def evaluate(self, r: int) -> dict[str, float]:
        if self.protocol in ("per_client", "local_mean"):
            if not self.client_metrics:
                return {}
            keys = self.metric_keys()
            rows = torch.tensor([[m[k] for k in keys] for m in self.client_metrics.values()], dtype=torch.float64)
            means = rows.nanmean(0).tolist()
            return {**dict(zip(keys, means)), "clients_evaluated": float(len(self.client_metrics))}
        copy_into(self.model_state, self.global_state)
        if self.personal:  # per-client parts at their initial values: the central model of FedETF's code
            copy_into(self.model_state, self.initial_personal)
        out = {}
        for split, data in (("val", self.val), ("test", self.test)):
            if data is None or (split == "test" and not self.test_due(r, out)):
                continue
            m = evaluate_sharded(self.module, data, self.fabric, self.num_classes,
                                 eval_batch_size(data, self.plan.eval_batch_size), self.module.global_logits)
            out.update({f"{split}/{k}": v for k, v in m.items()})
        return out

    # ---- the run -------------------------------------------------------------------------
    def run(self) -> list[dict]:
        plan = self.plan
        if plan.checkpoint.resume:
            self.restore(self.checkpointer.load_latest())
        bar = tqdm(range(self.start_round, plan.rounds), desc=f"{plan.method} rounds", leave=None,
                   disable=not (plan.progress and self.rank == 0), initial=self.start_round, total=plan.rounds)
        for r in bar:
            set_round(r)
            log = self.run_round(r)
            entry = vars(log)
            self.history.append(entry)
            if log.metrics:  # (on_round_end logs the round: bench/assembly/run_outputs.py log_round)
                bar.set_postfix({BAR_KEYS[k]: f"{v:.1f}" for k, v in log.metrics.items() if k in BAR_KEYS})
            if self.on_round_end is not None:
                self.on_round_end(entry)
            if self.checkpointer.due(r):
                self.checkpointer.save(r, self.snapshot(), {c: self.client_states[c] for c in self.owned})
            if self.on_round_done is not None:
                self.on_round_done(r)
        bar.close()
        # The module ends as the global model: shared state, and the initial personal parts (each
        # client's own parts live in client_states on its rank), so it does not depend on world size.
        copy_into(self.model_state, self.global_state)
        if self.personal:
            copy_into(self.model_state, self.initial_personal)
        return self.history

    def snapshot(self) -> dict:
        return {"global_state": self.global_state, "server_state": self.module.server_side.state(),
                "history": self.history, "client_metrics": self.client_metrics}

    def restore(self, ckpt: tuple[int, dict, dict] | None) -> None:
        if ckpt is None:
            return
        last_round, snap, clients = ckpt
        copy_into(self.global_state, snap["global_state"])
        self.module.server_side.load_state(snap["server_state"], self.server)
        self.history = list(snap["history"])
        self.client_metrics = {int(k): v for k, v in snap["client_metrics"].items()}
        missing = sorted(set(range(len(self.clients))) - set(clients))
        if missing:
            raise CheckpointError(f"The checkpoint holds no state for client(s) {missing[:10]} of "
                                  f"{len(self.clients)}: it does not belong to this partition; start over.")
        for c in self.owned:
            self.client_states[c] = clients[c]
        self.start_round = last_round + 1
