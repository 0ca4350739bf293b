"""CLIP-FC-Centralized (FST-CBDG's upper reference): the CLIP-FC probe on the pooled labeled data,
trained with a plain Lightning Trainer for rounds x local_epochs epochs."""
from lightning_modules.base import METHODS
from lightning_modules.clip_fc import ClipLinearProbe


@METHODS.register("clip-fc-central")
class ClipLinearProbeCentral(ClipLinearProbe):
    runs_centrally = True
