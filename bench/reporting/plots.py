"""PNG figures of a table, from its run records: accuracy-vs-round curves and partition heatmaps.

Matplotlib's object API with the Agg canvas (no global state, no display needed); files are
written atomically (temporary file + rename).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.core.atomic_io import atomic_write
from bench.partition_plot import plot_partition


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


def mean_curves(runs: list, records: dict[int, dict], key: str, label: str, column_id: str
                ) -> tuple[list[int], np.ndarray] | None:
    """(rounds, values [seeds, rounds]) of one row in one column, over the seeds evaluated at the same rounds."""
    curves = [curve_of(records[id(r)], key) for r in runs
              if r.label == label and column_id in r.columns and id(r) in records]
    curves = [c for c in curves if c[0]]
    if not curves:
        return None
    n = min(len(c[0]) for c in curves)
    return curves[0][0][:n], np.array([c[1][:n] for c in curves])


def plot_curves(spec: dict, runs: list, records: dict[int, dict], path: Path, columns: list,
                panels_per_row: int = 6) -> dict[str, str]:
    """Small multiples: one panel per table row, its mean test curve over seeds per run column (colour; the
    band spans the seeds' min to max) over every other row's mean curves in grey, on shared axes, so that
    twenty rows stay readable. Returns {"curves": path} or {} when no record has a curve."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    metric = spec.get("metrics", ["accuracy"])[0]
    key = f"test/{metric}"
    columns = [c for c in columns if not c.derived]
    labels = list(dict.fromkeys(r.label for r in runs))
    curves = {(label, col.id): mean_curves(runs, records, key, label, col.id) for label in labels for col in columns}
    drawn = [label for label in labels if any(curves[(label, c.id)] is not None for c in columns)]
    if not drawn:
        return {}
    ncols = min(panels_per_row, len(drawn))
    nrows = -(-len(drawn) // ncols)
    fig = Figure(figsize=(2.5 * ncols, 2.0 * nrows + 0.9))
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True)
    colours = [f"C{k % 10}" for k in range(len(columns))]
    for ax, label in zip(axes.flat, drawn):
        for (other, _), curve in curves.items():
            if other != label and curve is not None:
                ax.plot(curve[0], curve[1].mean(0), color="0.8", linewidth=0.7, zorder=1)
        seeds = 0
        for col, colour in zip(columns, colours):
            curve = curves[(label, col.id)]
            if curve is None:
                continue
            xs, ys = curve
            seeds = max(seeds, len(ys))
            ax.fill_between(xs, ys.min(0), ys.max(0), color=colour, alpha=0.18, linewidth=0, zorder=2)
            ax.plot(xs, ys.mean(0), color=colour, linewidth=1.6, zorder=3)
        ax.set_title(f"{label} (n={seeds})", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(drawn):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel(f"test {metric} (%)", fontsize=7)
    for i, ax in enumerate(list(axes.flat)[:len(drawn)]):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers: no 2.5 tick
        if i + ncols >= len(drawn):  # the lowest panel of its column: the round axis is labelled
            ax.xaxis.set_tick_params(labelbottom=True)
            ax.set_xlabel("round", fontsize=7)
    handles = [Line2D([], [], color=c, linewidth=1.6) for c in colours]
    names = [col.label.replace("=", " = ") for col in columns]
    handles.append(Line2D([], [], color="0.8", linewidth=0.7))
    names.append("other rows")
    fig.legend(handles, names, loc="upper center", ncol=len(names), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1.0))
    fig.suptitle(f"{spec['table']} {spec['dataset']}: test {metric} per round, mean over seeds (band: min to max)",
                 fontsize=9, y=1.0 - 0.3 / fig.get_figheight())
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))
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
