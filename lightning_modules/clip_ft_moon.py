"""FACMIC's MOON baseline: whole-CLIP fine-tuning (clip_finetune_base.py) plus MOON's model-contrastive
term on the image embeddings (lightning_modules/moon.py):

    L = L_contr(I, T_y) + mu * -log( e^{cos(I, I_glob)/tau} / (e^{cos(I, I_glob)/tau} + e^{cos(I, I_prev)/tau}) )

I the image embedding of the model being trained, I_glob that of the received global model, I_prev
that of the client's own model at the end of its previous participation (the term starts at its
second participation). mu = 1, tau = 0.5 as in FACMIC's code and MOON's paper. FACMIC's code passes
the client's current model as the "previous" one (the same object), which makes the negative the
trained embedding itself; here the previous model is MOON's.

The representation is CLIP's image embedding (no projection head: ``projection_dim`` must stay 0);
prediction stays the CLIP's (cosine to the class prompts), not MOON's linear head.
"""
from __future__ import annotations

import torch

from bench.core.errors import FedbenchError
from lightning_modules.base import METHODS, ClientContext, Objective
from lightning_modules.clip_finetune_base import ClipFinetuneModule
from lightning_modules.moon import Moon


@METHODS.register("clip-ft-moon")
class ClipFtMoon(Moon, ClipFinetuneModule):
    def __init__(self, *args, projection_dim: int = 0, **kwargs) -> None:
        if projection_dim != 0:
            raise FedbenchError("clip-ft-moon: the representation is CLIP's image embedding; projection_dim must "
                                f"be 0, got {projection_dim}.")
        super().__init__(*args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ClipFinetuneModule.forward(self, x)  # class scores, not MOON's head(representation)

    def client_objective(self, ctx: ClientContext) -> Objective:
        positive, negative = self.reference_models(ctx)

        def loss(batch):
            x, y = batch
            image = self.features(x)
            total = self.contrastive(image, y)
            if self.mu == 0 or negative is None:
                return total
            return total + self.mu * self.contrastive_loss(image, positive.features(x), negative.features(x))

        return loss
