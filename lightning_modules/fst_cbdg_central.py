"""FST-CBDG trained centrally: one client holding the pooled (unlabeled) training data, rounds x
local_epochs epochs (bench/assembly/central.py). FST-CBDG Table 3's "L_tSamp (Centralized)" row is this with
``ist_weight: 0`` (the text-sampling loss alone, Eq. 6, with Eq. 7's counts over the pooled pseudo-labels)."""
from lightning_modules.base import METHODS
from lightning_modules.fst_cbdg import FstCbdg


@METHODS.register("fst-cbdg-central")
class FstCbdgCentral(FstCbdg):
    runs_centrally = True
