"""FedBABU + NPR (FedNPR, Sec. 5.4 / Table 6): FedBABU (fedbabu.py) with FedNPR's non-parametric
regulariser added to its local objective.

Each sampled client, from the received body (``client_objective``):
  1. its NPR prototypes are refreshed from the received model (FedNPR Eqs. 1-2, fednpr.py);
  2. local loss = CE(head(f), y) + lambda * NPR(f, y) on the pooled features f of each batch, the
     head being FedBABU's random classifier, frozen (never trained, never aggregated).
Everything else is FedBABU's: only the body is averaged; each client is evaluated on its own test
split after fine-tuning its head on its own data with plain CE (the fine-tuning trains the head,
which NPR does not reach, so NPR has no part in it), and the fine-tuning is undone before upload.

Options: FedBABU's (finetune_epochs, finetune_part) and NPR's (num_subclusters, lam, sinkhorn_eps,
sinkhorn_iters, npr_variant). Table 6 uses the paper's best NPR settings: K=4 / lambda 0.1 (skin),
K=2 / lambda 0.05 (ICH). NPR is added alone, without FedNPR's balanced softmax (Sec. 5.4: "the NPR
module can be independently added"); the paper does not say otherwise for this row. With ``lam: 0``
the method is FedBABU exactly.
"""
from lightning_modules.base import METHODS, compose
from lightning_modules.fedbabu import FedBABU
from lightning_modules.fednpr import NPRegulariser

FedBABUNPR = METHODS.register("fedbabu-npr")(
    compose("FedBABUNPR", FedBABU, terms=(NPRegulariser,), doc=__doc__, module=__name__))
