"""The client-by-class heatmap of a partition (a PNG), drawn by a run (bench/assembly/experiment.py, once per
partition) and by the tables (bench/reporting/plots.py).

It sits in run assembly rather than in bench/reporting because bench.assembly.experiment draws it and the round
core imports nothing above itself (tests/core/test_layering.py); datamodules only computes partitions.
"""
from __future__ import annotations

import io
import os
from collections import OrderedDict

import numpy as np

from bench.core.atomic_io import atomic_write

# the last PNGs this process drew, by what they show: the runs of a table share their partition's heatmap, and a
# test session draws the same few partitions many times (0.25-0.4 s each); a few hundred KiB at most
MEMO_SIZE = 32
_drawn: OrderedDict[tuple, bytes] = OrderedDict()


def plot_partition(
    counts: np.ndarray, path: str | os.PathLike, class_names: list[str] | None = None, title: str = ""
) -> None:
    """Heatmap of samples per client (rows) and class (columns), written atomically as a PNG."""
    counts = np.asarray(counts)
    _, num_classes = counts.shape
    if class_names is not None and len(class_names) != num_classes:
        raise ValueError(f"{len(class_names)} class names for {num_classes} columns")
    key = (counts.dtype.str, counts.shape, counts.tobytes(), None if class_names is None else tuple(class_names), title)
    png = _drawn.pop(key, None) or heatmap_png(counts, class_names, title)
    _drawn[key] = png
    while len(_drawn) > MEMO_SIZE:
        _drawn.popitem(last=False)
    atomic_write(path, lambda fh: fh.write(png), needed=len(png))


def heatmap_png(counts: np.ndarray, class_names: list[str] | None, title: str) -> bytes:
    """The PNG of ``plot_partition``'s heatmap."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    num_clients, num_classes = counts.shape
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
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=120)
    return out.getvalue()
