"""FedBM (Zhu et al., "FedBM: Stealing Knowledge from Pre-trained Language Models for Heterogeneous
Federated Learning", IEEE TMI 2025) = FedCB's LKCC + CGDE (a concept-conditioned generator).

Server (FedBMServer.step, after aggregation): in the rounds r (0-based) with
    r + 1 >= gen_start  and  (r + 1 - gen_start) % gen_every == 0
rank 0 trains the generator G for ``gen_steps`` Adam steps (lr ``gen_lr``, betas 0.5/0.999, a
fresh optimizer each time as in the public code; G itself persists) against the frozen global
model (eval mode), on batches of ``gen_batch`` uniform labels y and conditions
z ~ N(mu_y, full text covariance + 1e-4 I) (``condition: noise``: z ~ N(0, I)):
    L_G = L_sem + lambda_div L_div + lambda_dis L_dis                       (Eq. 10)
with L_sem the LKCC loss of the global model on normalise(A(G(z))), A the public code's augmentation
(``augment_generated``: RandomCrop with zero padding 4, horizontal and vertical flips, one draw per
batch from the same CPU stream; ``augment_synthetic: false`` turns it off here and below), L_div the
per-class pairwise diversity term, L_dis the BN-statistics term (``components/cgde_generator.py``); ``use_sem``,
``use_div``, ``use_dis`` switch terms off (ablation). Labels and conditions come from
derive_seed(server_seed, r, -1, SERVER), server_seed a pure function of the run seed. G's state
is then broadcast, so every rank holds the same G.
Client (``client_objective``): once G exists, every real batch (x, y) is concatenated with
``g_batch`` synthetic samples (``with_synthetic``: G in eval mode, no grad; labels uniform; draws
from ctx.generator, i.e. a function of (seed, round, client)), augmented like the generator's training
batches (A, from a CPU generator seeded from (seed, round, client): the same on every device and rank),
normalised with the data's mean/std
like real images; one forward pass and one mean LKCC loss over the B + g_batch samples (Eq. 11, as
the public code does).

G is sized to the data (channels and square image size of the training split, read in
``prepare_splits``); it is server state, not part of the model's state_dict: it is never
aggregated and is checkpointed through ``server_state``.

Defaults are the public code's OCT-C8 run (gen_steps 100, gen_batch 64, gen_lr 3e-4, every 5
rounds from round 5, g_batch 16, lambda_div 1, lambda_dis 0.1); Kvasir uses g_batch 32 and
lambda_dis 1 (beta 0.05) / 0.1 (beta 0.1). ``gen_base_channels`` defaults to the reference 128
for images >= 64 px and 64 below (a cheaper generator for 28-32 px data). ``classifier``:
distribution (default) or embedding_average (then L_sem is its plain CE); ``learned`` is FedBM
Table VI's "w/o LKCC":
the classifier is an ordinary trainable linear layer on the pooled feature (trained with CE and
aggregated, as FedAvg's), the generator is still conditioned on the concept distributions
(z ~ N(mu_y, cov_y)) and L_sem is the CE of the global model's (learned, biased) classifier on
the synthetic images; the local loss is the CE over real + synthetic samples. The paper says only
that this ablation removes LKCC and that the global model then has a biased classifier (Sec. IV-D);
the public code has no such switch.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn

from bench.core.batches import DeviceData
from bench.core.errors import FedbenchError
from bench.core.seeding import AUGMENT, METHOD, SERVER, derive_seed
from lightning_modules.base import METHODS, Batch, ClientContext, Objective
from lightning_modules.components.cgde_generator import (
    ConceptGenerator,
    augment_generated,
    generate_batch,
    train_generator,
)
from lightning_modules.components.concept_distributions import ConceptDistribution
from lightning_modules.fedcb import FedCB
from lightning_modules.server_part import ServerContext, ServerPart

CONDITIONS = ("concept", "noise")


@dataclass
class CGDEServer:
    """The server side of CGDE: the generator and what it needs, kept off the model's state_dict."""

    generator: ConceptGenerator | None = None
    mean: torch.Tensor | None = None  # [1, C, 1, 1]: the data's normalisation
    std: torch.Tensor | None = None
    trained: bool = False
    log: list[dict] = field(default_factory=list)  # per training: round, last losses, seconds

    def normalise(self, images: torch.Tensor) -> torch.Tensor:
        return (images - self.mean) / self.std


@METHODS.register("fedbm")
class FedBM(FedCB):
    takes_learned_classifier = True
    def __init__(self, *args, g_batch: int = 16, gen_start: int = 5, gen_every: int = 5, gen_steps: int = 100,
                 gen_batch: int = 64, gen_lr: float = 3e-4, gen_base_channels: int | None = None,
                 lambda_div: float = 1.0, lambda_dis: float = 0.1, use_sem: bool = True, use_div: bool = True,
                 use_dis: bool = True, condition: str = "concept", augment_synthetic: bool = True,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if condition not in CONDITIONS:
            raise FedbenchError(f"FedBM's condition must be one of {', '.join(CONDITIONS)}, got {condition!r}.")
        if not (use_sem or use_div or use_dis):
            raise FedbenchError("FedBM: use_sem, use_div and use_dis are all false; the generator needs a loss.")
        for name, value, low in (("g_batch", g_batch, 0), ("gen_start", gen_start, 1), ("gen_every", gen_every, 1),
                                 ("gen_steps", gen_steps, 1), ("gen_batch", gen_batch, 2)):
            if value < low:
                raise FedbenchError(f"FedBM's {name} must be >= {low}, got {value}.")
        if lambda_div < 0 or lambda_dis < 0 or gen_lr <= 0:
            raise FedbenchError("FedBM needs lambda_div >= 0, lambda_dis >= 0 and gen_lr > 0.")
        self.g_batch, self.gen_start, self.gen_every = g_batch, gen_start, gen_every
        self.gen_steps, self.gen_batch, self.gen_lr = gen_steps, gen_batch, gen_lr
        self.gen_base_channels = gen_base_channels
        self.lambda_div, self.lambda_dis = lambda_div, lambda_dis
        self.use_sem, self.use_div, self.use_dis = use_sem, use_div, use_dis
        self.noise_only = condition == "noise"
        if not isinstance(augment_synthetic, bool):
            raise FedbenchError(f"FedBM's augment_synthetic must be true or false, got {augment_synthetic!r}.")
        self.augment_synthetic = augment_synthetic
        self._augment_rng: tuple[tuple[int, int, int], torch.Generator] | None = None
        # a pure function of the run seed (the module is built under a seeded global stream)
        self.server_seed = int(torch.randint(0, 2**62, (1,)).item())
        self.cgde = CGDEServer()
        self.server_side = FedBMServer(self)

    # ---- the generator ---------------------------------------------------------------------
    def prepare_splits(self, train: DeviceData, val: DeviceData | None, test: DeviceData):
        """Size the generator to the training images and remember their normalisation."""
        if train.images.dtype != torch.uint8 or train.images.ndim != 4:
            raise FedbenchError("FedBM generates images: it needs uint8 image splits [N, C, H, W].")
        _, channels, height, width = train.images.shape
        if height != width:
            raise FedbenchError(f"FedBM's generator makes square images; the data is {height}x{width}.")
        base = self.gen_base_channels or (128 if height >= 64 else 64)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.server_seed, -1, -1, SERVER))
            generator = ConceptGenerator(self.distribution.dim, channels, height, base)
        device = train.images.device  # the generator computes in the run's precision (train.mean's dtype)
        self.cgde = CGDEServer(generator.to(device, train.mean.dtype), train.mean.to(device), train.std.to(device))
        return train, val, test

    def built_generator(self) -> ConceptGenerator:
        if self.cgde.generator is None:
            raise FedbenchError("FedBM's generator is built in prepare_splits (the image size comes from the data).")
        return self.cgde.generator

    def condition_distribution(self) -> ConceptDistribution:
        """The classifier's mu / sigma_diag (for L_sem) with the text covariance (for z), on the
        classifier's device and in its dtype (moved once, not per batch)."""
        d = self.distribution
        weight = next(self.head.parameters())
        device, dtype = weight.device, weight.dtype  # float64 under precision 64-true
        if d.chol.device != device or d.chol.dtype != dtype:
            self.distribution = d = d.to(device, dtype)
        if self.classifier == "learned":  # no LKCC classifier: the text distributions themselves
            return d
        return ConceptDistribution(self.head.mu, self.head.sigma_diag, d.cov, d.chol)

    def idle_options(self, rounds: int) -> list[str]:
        if self.g_batch == 0 or self.gen_start < rounds:
            return []
        return [(f"FedBM's generator never acts: it first trains after round gen_start={self.gen_start} and its "
                 f"images are used from the next round on, but the run has fed.rounds={rounds}, so this run equals "
                 f"FedCB. Set method.args gen_start to at most {max(1, rounds - 1)} (e.g. --method.args "
                 f"'{{\"gen_start\": 1}}') or fed.rounds to at least {self.gen_start + 1}.")]

    def is_generator_round(self, round_idx: int) -> bool:
        done = round_idx + 1
        return done >= self.gen_start and (done - self.gen_start) % self.gen_every == 0

    def train_generator(self, global_state: dict[str, torch.Tensor], round_idx: int) -> dict[str, float]:
        """Train G against the global model (loaded into this module) on this rank."""
        state = self.state_dict()
        with torch.no_grad():
            for k, v in global_state.items():
                state[k].copy_(v)
        teacher = nn.ModuleList([self.backbone, self.head])  # the model without G
        with torch.enable_grad():
            return train_generator(
                self.built_generator(), self.embed, teacher, self.condition_distribution(),
                steps=self.gen_steps, batch_size=self.gen_batch, lr=self.gen_lr, tau=self.tau,
                lambda_div=self.lambda_div, lambda_dis=self.lambda_dis, normalise=self.cgde.normalise,
                seed=derive_seed(self.server_seed, round_idx, -1, SERVER), use_sem=self.use_sem,
                use_div=self.use_div, use_dis=self.use_dis, noise_only=self.noise_only,
                sem_loss=self.head.loss if self.classifier == "learned" else None, augment=self.augment_synthetic)

    # ---- local training --------------------------------------------------------------------
    def augment_rng(self, ctx: ClientContext) -> torch.Generator:
        """The CPU stream of this client's augmentation draws in this round (one per (seed, round, client),
        kept across its batches): independent of the device and of which rank trains the client."""
        key = (ctx.seed, ctx.round_idx, ctx.client_id)
        if self._augment_rng is None or self._augment_rng[0] != key:
            seed = derive_seed(derive_seed(ctx.seed, ctx.round_idx, ctx.client_id, METHOD), -1, -1, AUGMENT)
            self._augment_rng = (key, torch.Generator().manual_seed(seed))
        return self._augment_rng[1]

    def synthetic_batch(self, ctx: ClientContext) -> tuple[torch.Tensor, torch.Tensor]:
        """g_batch synthetic images (labels and conditions drawn from ctx.generator), augmented
        (``augment_rng``) and normalised, and their labels."""
        images, labels = generate_batch(self.built_generator(), self.condition_distribution(), self.g_batch,
                                        ctx.generator, noise_only=self.noise_only)
        if self.augment_synthetic:
            images = augment_generated(images, self.augment_rng(ctx))
        return self.cgde.normalise(images), labels

    def with_synthetic(self, ctx: ClientContext, batch: Batch) -> Batch:
        """Eq. 11's batch: the real one and, once G exists, g_batch synthetic samples appended."""
        if not (self.cgde.trained and self.g_batch > 0):
            return batch
        (x, y), (xs, ys) = batch, self.synthetic_batch(ctx)
        return torch.cat([x, xs.to(x.dtype)]), torch.cat([y, ys.to(y.device)])

    def client_objective(self, ctx: ClientContext) -> Objective:
        return lambda batch: self.training_step(self.with_synthetic(ctx, batch))  # FedCB's LKCC loss


class FedBMServer(ServerPart):
    """FedBM's server side: the generator's training (on the server rank, broadcast to the others) and its
    checkpoint. The generator itself stays on the model (``cgde``): the clients draw their synthetic images
    from it."""

    def scalars(self, round_idx: int) -> dict[str, float]:
        """The generator's last-step losses in the rounds it trained (on the server rank, which trains it)."""
        m = self.module
        last = m.cgde.log[-1] if m.cgde.log else None
        if last is None or last["round"] != round_idx:
            return {}
        return {f"generator_{k}": float(last[k]) for k in ("loss", "sem", "div", "dis")}

    def step(self, global_state: dict[str, torch.Tensor], extras: dict[str, torch.Tensor], round_idx: int,
             server: ServerContext) -> None:
        m = self.module
        if not m.is_generator_round(round_idx):
            return
        generator = m.built_generator()
        payload = None
        if server.is_server:
            start = time.perf_counter()
            losses = m.train_generator(global_state, round_idx)
            m.cgde.log.append({"round": round_idx, **losses, "seconds": time.perf_counter() - start})
            payload = {k: v.detach().cpu() for k, v in generator.state_dict().items()}
        payload = server.broadcast(payload)
        generator.load_state_dict(payload)
        m.cgde.trained = True

    def state(self) -> dict[str, torch.Tensor]:
        m = self.module
        state = {f"generator.{k}": v.detach().clone() for k, v in m.built_generator().state_dict().items()}
        return {**state, "generator_trained": torch.tensor(m.cgde.trained)}

    def load_state(self, state: dict[str, torch.Tensor], server: ServerContext) -> None:
        m = self.module
        prefix = "generator."
        m.built_generator().load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
        m.cgde.trained = bool(state["generator_trained"])
