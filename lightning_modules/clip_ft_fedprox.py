"""FACMIC's FedProx baseline: whole-CLIP fine-tuning (clip_finetune_base.py) plus FedProx's proximal
term (mu / 2) ||w - w_global||^2 over every CLIP parameter (``ProximalTerm``, lightning_modules/fedprox.py).

mu = 0.01: FACMIC's code (utils/training.py: 1e-2 / 2 x the distance); the paper gives no value. The
code adds the UNsquared L2 distance and only from the client's second call on; here FedProx's own
squared term (the paper cites Li et al.) from the first round.
"""
from lightning_modules.base import METHODS, compose
from lightning_modules.clip_finetune_base import ClipFinetuneModule
from lightning_modules.fedprox import ProximalTerm

ClipFtFedProx = METHODS.register("clip-ft-fedprox")(
    compose("ClipFtFedProx", ClipFinetuneModule, terms=(ProximalTerm,), defaults={"mu": 0.01}, doc=__doc__,
            module=__name__))
