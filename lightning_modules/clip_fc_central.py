"""CLIP-FC-Centralized (FST-CBDG's upper reference): the CLIP-FC probe on the pooled labeled data,
trained for rounds x local_epochs epochs as a federation of one client (bench/assembly/central.py)."""
from lightning_modules.base import METHODS
from lightning_modules.clip_fc import ClipLinearProbe


@METHODS.register("clip-fc-central")
class ClipLinearProbeCentral(ClipLinearProbe):
    runs_centrally = True
