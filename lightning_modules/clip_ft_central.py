"""FACMIC's "Centralized" row: the whole CLIP fine-tuned on the pooled training data, as a federation
of one client (bench/assembly/central.py).

FACMIC's paper: "the centralized method is designed with only one client holding all the training
data". Its first committed main.py (Anonymous-Au/FACMIC bc58630, dataset 'SkinCen': all Real training
data as one client plus the test folder) runs the fine-tuning baselines' code path (FedProx's, with the
proximal term commented out) with Adam over all CLIP parameters: that is this row. The code of the
BT/SC (and BT2) Centralized runs was not found; see results/paper/facmic.json.
"""
from lightning_modules.base import METHODS
from lightning_modules.clip_ft_fedavg import ClipFtFedAvg


@METHODS.register("clip-ft-central")
class ClipFtCentral(ClipFtFedAvg):
    runs_centrally = True
