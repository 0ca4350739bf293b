"""FedNTD on FST-CBDG's CLIP linear probe: the FedNTD row of FST-CBDG's Tables 1-2.

The model is CLIP-FC's (clip_fc.py): logits = W normalize(I) + b on frozen CLIP features, W initialised
from the class text features, b = 0, only (W, b) trained and averaged. The local objective is FedNTD's
(its objective term ``NotTrueDistillation``, fedntd.py, Lee et al. 2022 Eq. 4-5): CE + beta * KL over the not-true classes between the received
global probe (the teacher, on the same normalised features) and the local one; beta 1, tau 1 (FedNTD's
config/fedntd.json; FST-CBDG gives neither).
"""
from lightning_modules.base import METHODS, compose
from lightning_modules.clip_fc import ClipLinearProbe
from lightning_modules.fedntd import NotTrueDistillation

ClipFcFedNTD = METHODS.register("clip-fc-fedntd")(
    compose("ClipFcFedNTD", ClipLinearProbe, terms=(NotTrueDistillation,), doc=__doc__, module=__name__))
