"""FedRoD + NPR (FedNPR, Sec. 5.4 / Table 6): FedRoD (fedrod.py) with FedNPR's non-parametric
regulariser added to its local objective.

Each sampled client, from the received body, generic head and its own personalised head
(``client_objective``):
  1. its NPR prototypes are refreshed from the received model (FedNPR Eqs. 1-2, fednpr.py);
  2. local loss = FedRoD's loss on the pooled features f (the generic head's balanced softmax + the
     personalised head's CE on detached features) + lambda * NPR(f, y); NPR's gradient reaches the
     body only.
Body and generic head are averaged; each client keeps its personalised head and is evaluated with
generic + personalised logits on its own test split.

Options: FedRoD's (gamma) and NPR's (num_subclusters, lam, sinkhorn_eps, sinkhorn_iters,
npr_variant); Table 6: K=4 / lambda 0.1 (skin), K=2 / lambda 0.05 (ICH). With ``lam: 0`` the method
is FedRoD exactly.
"""
from lightning_modules.base import METHODS, compose
from lightning_modules.fednpr import NPRegulariser
from lightning_modules.fedrod import FedRoD

FedRoDNPR = METHODS.register("fedrod-npr")(
    compose("FedRoDNPR", FedRoD, terms=(NPRegulariser,), doc=__doc__, module=__name__))
