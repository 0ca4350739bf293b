"""FedAvg + NPR: FedAvg's cross-entropy plus the NPR regulariser, every tensor averaged.

Unlike FedNPR there is no balanced softmax (it is ``fednpr`` with ``balanced_softmax: false``), so the
two isolate BSM's share. FedNPR's Table 6 row "FedAvg+NPR" prints FedNPR's own Table 3 numbers, so the
table configs compare that row with ``fednpr``, not with this method. Evaluated under FedNPR's
per-client protocol; with ``lam: 0`` it is plain FedAvg under that protocol (the prototypes are then
never computed).
"""
from lightning_modules.base import METHODS, compose
from lightning_modules.fedavg import FedAvg
from lightning_modules.fednpr import NPRegulariser

FedAvgNPR = METHODS.register("fedavg-npr")(compose("FedAvgNPR", FedAvg, terms=(NPRegulariser,), protocol="per_client",
                                                   doc=__doc__, module=__name__))
