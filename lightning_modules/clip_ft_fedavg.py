"""FACMIC's FedAVG baseline: the whole CLIP fine-tuned with its batch contrastive loss and averaged
(image and text towers and logit scale; see clip_finetune_base.py for what trains and why)."""
from lightning_modules.base import METHODS
from lightning_modules.clip_finetune_base import ClipFinetuneModule


@METHODS.register("clip-ft-fedavg")
class ClipFtFedAvg(ClipFinetuneModule):
    pass
