"""Central learning: the FedAvg module trained on the pooled data, as a federation of one client
(bench/assembly/central.py: rounds x local_epochs one-epoch rounds, one optimizer)."""
from lightning_modules.base import METHODS, FederatedModule


@METHODS.register("central")
class Central(FederatedModule):
    runs_centrally = True
