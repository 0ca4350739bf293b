"""PNG figures of a table, from its run records: accuracy-vs-round curves and partition heatmaps.

Matplotlib's object API with the Agg canvas (no global state, no display needed); files are
written atomically (temporary file + rename).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.core.atomic_io import atomic_write
from datamodules.partition import plot_partition

LINESTYLES = ["-", "--", ":"]


def _save(fig, path: Path) -> None:
    atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=110))


def curve_of(record: dict, key: str) -> tuple[list[int], list[float]]:
    """(round numbers starting at 1, values) of ``key`` over the rounds that evaluated it."""
    xs, ys = [], []
    for entry in record.get("history", []):
        value = (entry.get("metrics") or {}).get(key)
        if value is not None:
            xs.append(entry["round"] + 1)
            ys.append(value)
    return xs, ys


def plot_curves(spec: dict, runs: list, records: dict[int, dict], path: Path, columns: list) -> dict[str, str]:
    """One panel per run column (bench/reporting/columns.py): the mean over seeds of the test metric
    per round, one line per row. Returns {"curves": path} or {} when no record has a curve."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metric = spec.get("metrics", ["accuracy"])[0]
    key = f"test/{metric}"
    columns = [c for c in columns if not c.derived]
    fig = Figure(figsize=(5.5 * len(columns), 4.2))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(columns), squeeze=False)[0]
    drawn = False
    for ax, column in zip(axes, columns):
        for i, label in enumerate(dict.fromkeys(r.label for r in runs)):
            curves = [curve_of(records[id(r)], key) for r in runs
                      if r.label == label and column.id in r.columns and id(r) in records]
            curves = [c for c in curves if c[0]]
            if not curves:
                continue
            n = min(len(c[0]) for c in curves)  # seeds evaluated at the same rounds
            ys = np.array([c[1][:n] for c in curves])
            ax.plot(curves[0][0][:n], ys.mean(0), marker="o", markersize=2.5, linewidth=1.2,
                    linestyle=LINESTYLES[i // 10 % len(LINESTYLES)],  # the default palette has 10 colours
                    label=f"{label} (n={len(curves)})")
            drawn = True
        ax.set_title(column.label.replace("=", " = "))
        ax.set_xlabel("round")
        ax.set_ylabel(f"test {metric} (%)")
        ax.grid(alpha=0.3)
    if not drawn:
        return {}
    axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle(f"{spec['table']} {spec['dataset']}: mean over seeds")
    fig.tight_layout()
    _save(fig, path)
    return {"curves": str(path)}


def plot_partitions(spec: dict, runs: list, records: dict[int, dict], out_dir: Path, name: str,
                    columns: list) -> dict[str, str]:
    """The client-by-class heatmap of the first seed's partition for each run column (rows that
    depend on the partition only)."""
    out = {}
    for column in (c for c in columns if not c.derived):
        candidates = sorted((r for r in runs if r.columns == [column.id] and id(r) in records),
                            key=lambda r: r.seed)
        rec = next((records[id(r)] for r in candidates if records[id(r)].get("partition", {}).get("counts")), None)
        if rec is None:
            continue
        path = out_dir / f"{name}_partition_{column.file_tag}.png"
        part = rec["config"]["partition"]
        plot_partition(np.array(rec["partition"]["counts"]), path, rec.get("class_names"),
                       title=f"{rec['dataset']}: {part['num_clients']} clients, {part['scheme']} {column.label}, "
                             f"seed {rec['config']['seed']}")
        out[f"partition {column.label}"] = str(path)
    return out
