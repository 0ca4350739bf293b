"""FedRep + NPR (FedNPR, Sec. 5.4 / Table 6): FedRep (fedrep.py) with FedNPR's non-parametric
regulariser added to its body phase.

Each sampled client, with the received body and its own head (FedRep's ``local_update``):
  0. its body objective is built from the received model: the NPR prototypes are refreshed from
     the received model's features (FedNPR Eqs. 1-2, fednpr.py), before the head phase updates any
     BatchNorm statistics;
  1. the head alone is trained for ``head_epochs`` with plain CE (body frozen; NPR does not reach
     the head, so it has no part in this phase);
  2. the body alone is trained for ``fed.local_epochs`` on  CE(head(f), y) + lambda * NPR(f, y),
     f the pooled features, the head frozen.
Only the body is averaged; each client keeps its head and is evaluated with it on its own test split.

Options: FedRep's (head_epochs) and NPR's (num_subclusters, lam, sinkhorn_eps, sinkhorn_iters,
npr_variant); Table 6: K=4 / lambda 0.1 (skin), K=2 / lambda 0.05 (ICH). NPR is added alone, without
FedNPR's balanced softmax (as for FedBABU+NPR). With ``lam: 0`` the method is FedRep exactly.
"""
from lightning_modules.base import METHODS, compose
from lightning_modules.fednpr import NPRegulariser
from lightning_modules.fedrep import FedRep

FedRepNPR = METHODS.register("fedrep-npr")(
    compose("FedRepNPR", FedRep, terms=(NPRegulariser,), doc=__doc__, module=__name__))
