"""FACMIC's MOON baseline: whole-CLIP fine-tuning (clip_finetune_base.py) plus MOON's model-contrastive
term on the image embeddings (lightning_modules/moon.py):

    L = L_contr(I, T_y) + mu * -log( e^{cos(I, I_glob)/tau} / (e^{cos(I, I_glob)/tau} + e^{cos(I, I_prev)/tau}) )

I the image embedding of the model being trained, I_glob that of the received global model, I_prev
that of the client's own model at the end of its previous participation (the term starts at its
second participation). mu = 1, tau = 0.5 as in FACMIC's code and MOON's paper. FACMIC's code passes
the client's current model as the "previous" one (the same object), which makes the negative the
trained embedding itself; here the previous model is MOON's.

The representation is CLIP's image embedding (no projection head, so MOON's ``projection_dim`` is no
option here); prediction stays the CLIP's (cosine to the class prompts): the fine-tuned CLIP with MOON's
objective term (``ModelContrast``, moon.py), options mu and temperature.
"""
from lightning_modules.base import METHODS, compose
from lightning_modules.clip_finetune_base import ClipFinetuneModule
from lightning_modules.moon import ModelContrast

ClipFtMoon = METHODS.register("clip-ft-moon")(
    compose("ClipFtMoon", ClipFinetuneModule, terms=(ModelContrast,), doc=__doc__, module=__name__))
