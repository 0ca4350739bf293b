"""FACMIC's and FST-CBDG's published cells are reproduced by the paper-scale configs (issue 18's
done-when), each with a row measured as the paper measured it."""
from __future__ import annotations

import shutil
from pathlib import Path

from conftest import REPO

from bench.commands.coverage import coverage

CONFIGS = ["facmic_table2.yaml", "facmic_table45.yaml", "fstcbdg_cifar10.yaml", "fstcbdg_cifar100.yaml",
           "fstcbdg_cinic10.yaml"]


def test_facmic_and_fstcbdg_cells_are_covered_with_the_papers_protocol(tmp_path):
    for name in CONFIGS:
        shutil.copy(REPO / "configs" / "tables" / name, tmp_path / name)
    result = coverage(str(tmp_path), str(REPO / "results" / "paper"), papers=["facmic", "fstcbdg"])
    assert result["errors"] == []
    s = result["summary"]
    assert (s["facmic"]["covered"], s["facmic"]["total"]) == (101, 101)
    assert (s["fstcbdg"]["covered"], s["fstcbdg"]["total"]) == (83, 83)
    by = {(c["paper"], c["table"], c["dataset"], c["partition"], c["method"], c["metric"], c["setting"]): c
          for c in result["cells"]}
    # the fine-tuning baselines and Centralized are compared only with rows training the paper's model
    fedavg = by[("facmic", "2", "bt", "dirichlet-0.3", "FedAVG", "accuracy", None)]["by"][0]
    assert fedavg["row"] == "FedAVG (BT)" and not fedavg["inferred"]
    central = by[("facmic", "2", "real", "none", "Centralized", "balanced_accuracy", None)]["by"][0]
    assert central["row"] == "Centralized (Real)" and central["inferred"]
    avg = by[("facmic", "4", "real", "natural", "FACMIC", "accuracy", "batch_size=avg")]["by"][0]
    assert avg["row"] == "FACMIC bs avg (Real)"
    ntd = by[("fstcbdg", "2", "cifar10", "lda-0.05", "FedNTD", "accuracy", None)]["by"][0]
    assert (ntd["row"], ntd["column"], ntd["inferred"]) == ("FedNTD (C10)", "lda-0.05", True)
    zs = by[("fstcbdg", "3", "cifar100", "none", "CLIP-ZS", "accuracy", None)]["by"][0]
    assert zs["row"] == "CLIP-ZS (C100, Table 3)" and not zs["inferred"]  # zero-shot: any round
    assert Path(central["config"]).name == "facmic_table2.yaml"
