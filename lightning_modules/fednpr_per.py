"""FedNPR-Per (Sec. 3.5, Eq. 7): FedNPR whose final linear classifier stays with each client.

Every parameter and buffer except ``head`` is averaged; each client keeps and trains its own
head across rounds (starting from the common initial head), and is evaluated with it.
"""
from __future__ import annotations

from typing import ClassVar

from lightning_modules.base import METHODS
from lightning_modules.fednpr import FedNPR


@METHODS.register("fednpr-per")
class FedNPRPer(FedNPR):
    personal_prefixes: ClassVar[tuple[str, ...]] = ("head",)


@METHODS.register("fednpr-per-code")
class FedNPRPerPublicCode(FedNPRPer):
    """FedNPR-Per with ``npr_variant`` defaulting to ``public_code`` (see ``fednpr-code``)."""

    def __init__(self, *args, npr_variant: str = "public_code", **kwargs) -> None:
        super().__init__(*args, npr_variant=npr_variant, **kwargs)
