"""The client-by-class heatmap of a partition (a PNG), drawn by a run (bench/assembly/experiment.py, once per
partition) and by the tables (bench/reporting/plots.py).

It sits in run assembly rather than in bench/reporting because bench.assembly.experiment draws it and the round
core imports nothing above itself (tests/core/test_layering.py); datamodules only computes partitions.
"""
from __future__ import annotations

import os

import numpy as np

from bench.core.atomic_io import atomic_write


def plot_partition(
    counts: np.ndarray, path: str | os.PathLike, class_names: list[str] | None = None, title: str = ""
) -> None:
    """Heatmap of samples per client (rows) and class (columns), written atomically as a PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = np.asarray(counts)
    num_clients, num_classes = counts.shape
    if class_names is not None and len(class_names) != num_classes:
        raise ValueError(f"{len(class_names)} class names for {num_classes} columns")
    fig = Figure(figsize=(min(2 + 0.6 * num_classes, 24), min(1.5 + 0.4 * num_clients, 24)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    im = ax.imshow(counts, aspect="auto", cmap="viridis")
    fig.colorbar(im, ax=ax, label="samples")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_yticks(range(num_clients))
    ax.set_xticks(range(num_classes))
    if class_names is not None:
        ax.set_xticklabels(class_names, rotation=45, ha="right", fontsize=7)
    if num_clients * num_classes <= 400:
        top = counts.max() if counts.size else 0
        for (i, j), v in np.ndenumerate(counts):
            # inside the axes: left out of tight_layout's measuring (the same layout, a fraction of its cost)
            ax.text(j, i, str(int(v)), ha="center", va="center", fontsize=6,
                    color="black" if v > 0.6 * top else "white", in_layout=False)
    ax.set_title(title or f"{num_clients} clients x {num_classes} classes")
    fig.tight_layout()
    atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=120))
