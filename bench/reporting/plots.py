"""PNG figures of a table, from its run records: accuracy-vs-round curves and partition heatmaps.

Matplotlib's object API with the Agg canvas (no global state, no display needed); files are
written atomically (temporary file + rename).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bench.assembly.partition_plot import plot_partition
from bench.core.atomic_io import atomic_write

if TYPE_CHECKING:
    from bench.tables.table_spec import TableSpec


def _save(fig, path: Path) -> None:
    atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=110))


def curve_of(record: dict, key: str) -> tuple[list[int], list[float]]:
    """(round numbers, values) of ``key`` over the rounds that evaluated it. Rounds are numbered as the
    record's history, W&B's ``round`` and ``reported_round`` number them: from 0 (round r is the
    evaluation after r + 1 rounds of training)."""
    xs, ys = [], []
    for entry in record.get("history", []):
        value = (entry.get("metrics") or {}).get(key)
        if value is not None:
            xs.append(entry["round"])
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


def row_kinds(runs: list, records: dict[int, dict]) -> dict[str, str]:
    """Each row's kind for the curves: "central" (a federation of one client), "per-client" (scored on the
    clients' own splits or as their mean: not on the global model's scale) or "global"."""
    from lightning_modules.base import METHODS

    kinds: dict[str, str] = {}
    for r in runs:
        if r.label in kinds:
            continue
        protocol = next((records[id(x)].get("protocol") for x in runs if x.label == r.label and id(x) in records), None)
        central = METHODS.get(r.cfg.method.name).runs_centrally
        kinds[r.label] = "central" if central else "global" if protocol in (None, "global") else "per-client"
    return kinds


def plot_curves(spec: TableSpec, runs: list, records: dict[int, dict], path: Path, columns: list,
                panels_per_row: int = 6, baseline: str | None = None) -> dict[str, str]:
    """Small multiples: one panel per table row, its mean test curve over seeds per run column (colour; the
    band spans the seeds' min to max), on shared axes, so that twenty rows stay readable. Behind it, in grey,
    the other rows of its kind only (global-model rows, or per-client rows, which are on another scale);
    on global-model panels the ``baseline`` row (FedAvg) is drawn dashed as the reference and Central's
    final accuracy as a dotted line. Global-model rows come first, then Central, then per-client rows.
    Returns {"curves": path} or {} when no record has a curve."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metric = spec.metrics[0]
    columns = [c for c in columns if not c.derived]
    labels = list(dict.fromkeys(r.label for r in runs))
    curves = {(label, col.id): mean_curves(runs, records, f"test/{metric}", label, col.id)
              for label in labels for col in columns}
    kinds = row_kinds(runs, records)
    order = {"global": 0, "central": 1, "per-client": 2}
    drawn = sorted((label for label in labels if any(curves[(label, c.id)] is not None for c in columns)),
                   key=lambda label: order[kinds[label]])
    if not drawn:
        return {}
    central = next((label for label in drawn if kinds[label] == "central"), None)
    ncols = min(panels_per_row, len(drawn))
    nrows = -(-len(drawn) // ncols)
    fig = Figure(figsize=(2.5 * ncols, 2.0 * nrows + 0.9))
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True)
    colours = [f"C{k % 10}" for k in range(len(columns))]
    refs = {"baseline": baseline, "central": central}
    for ax, label in zip(axes.flat, drawn):
        draw_panel(ax, label, kinds, curves, columns, colours, refs)
    label_axes(axes, len(drawn), ncols, metric)
    legend = curves_legend(fig, columns, colours, baseline, central)
    title = fig.suptitle(f"{spec.heading}: test {metric} per round, mean over seeds (band: min to max)",
                         fontsize=9, y=1.0 - 0.3 / fig.get_figheight())
    widen_for(fig, [legend, title])
    place_panels(fig, nrows, ncols)
    _save(fig, path)
    return {"curves": str(path)}


def draw_panel(ax, label: str, kinds: dict, curves: dict, columns: list, colours: list[str], refs: dict) -> None:
    """One row's panel: the other rows of its kind in grey, then per column the baseline (dashed) and
    Central's final value (dotted) on global-model panels, and the row's band and mean curve."""
    from matplotlib.collections import LineCollection

    kind, baseline, central = kinds[label], refs["baseline"], refs["central"]
    others = [np.column_stack([curve[0], curve[1].mean(0)]) for (other, _), curve in curves.items()
              if other != label and curve is not None and kinds[other] == kind and other != baseline]
    if others:  # one artist for all of them: a table of 45 rows draws ~2,000 grey lines
        ax.add_collection(LineCollection(others, colors="0.8", linewidths=0.7, zorder=1))
    seeds = 0
    for col, colour in zip(columns, colours):
        curve = curves[(label, col.id)]
        if kind == "global" and baseline not in (None, label) and curves.get((baseline, col.id)) is not None:
            ref = curves[(baseline, col.id)]
            ax.plot(ref[0], ref[1].mean(0), color=colour, linewidth=0.9, linestyle="--", zorder=2)
        if kind == "global" and central is not None and curves.get((central, col.id)) is not None:
            ax.axhline(curves[(central, col.id)][1].mean(0)[-1], color=colour, linewidth=0.8, linestyle=":",
                       zorder=2)
        if curve is None:
            continue
        xs, ys = curve
        seeds = max(seeds, len(ys))
        ax.fill_between(xs, ys.min(0), ys.max(0), color=colour, alpha=0.18, linewidth=0, zorder=2)
        ax.plot(xs, ys.mean(0), color=colour, linewidth=1.6, zorder=3)
    suffix = {"global": "", "central": ", reference", "per-client": ", per-client"}[kind]
    ax.set_title(f"{label} (n={seeds}{suffix})", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


# The margins around the grid of panels and the gaps between panels, in inches, as matplotlib's
# tight_layout computed them for these font sizes (the same for 1x1 up to 8x6 panels; left has room for
# a "100" tick label). A panel with round labels above the last row has no panel under it. Fixed, so
# placing the panels costs nothing (tight_layout drew the whole figure once more: 3 s of 7 for 45 panels).
MARGINS_IN = {"left": 0.6, "right": 0.15, "bottom": 0.5, "top": 1.11}
GAP_IN = {"w": 0.2, "h": 0.37}


def widen_for(fig, header: list) -> None:
    """Widen a narrow figure (one or two panels) until the legend and the title above the panels fit."""
    renderer = fig.canvas.get_renderer()
    needed = max(artist.get_window_extent(renderer).width for artist in header) / fig.dpi + 0.2
    if needed > fig.get_figwidth():
        fig.set_figwidth(needed)


def place_panels(fig, nrows: int, ncols: int) -> None:
    """Place the grid with fixed margins: the suptitle and legend above, tick and axis labels around."""
    width, height = fig.get_size_inches()
    panel_w = (width - MARGINS_IN["left"] - MARGINS_IN["right"] - (ncols - 1) * GAP_IN["w"]) / ncols
    panel_h = (height - MARGINS_IN["bottom"] - MARGINS_IN["top"] - (nrows - 1) * GAP_IN["h"]) / nrows
    fig.subplots_adjust(left=MARGINS_IN["left"] / width, right=1 - MARGINS_IN["right"] / width,
                        bottom=MARGINS_IN["bottom"] / height, top=1 - MARGINS_IN["top"] / height,
                        wspace=GAP_IN["w"] / panel_w, hspace=GAP_IN["h"] / panel_h)


def label_axes(axes, drawn: int, ncols: int, metric: str) -> None:
    """Hide the unused panels; the metric on the left column, integer rounds under each column's lowest panel."""
    from matplotlib.ticker import MaxNLocator

    for ax in list(axes.flat)[drawn:]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel(f"test {metric} (%)", fontsize=7)
    for i, ax in enumerate(list(axes.flat)[:drawn]):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers: no 2.5 tick
        if i + ncols >= drawn:  # the lowest panel of its column: the round axis is labelled
            ax.xaxis.set_tick_params(labelbottom=True)
            ax.set_xlabel("round", fontsize=7)


def curves_legend(fig, columns: list, colours: list[str], baseline: str | None, central: str | None):
    """One legend over the panels: the columns' colours, the reference lines and the grey rows."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=c, linewidth=1.6) for c in colours]
    names = [col.label.replace("=", " = ") for col in columns]
    if baseline is not None:
        handles.append(Line2D([], [], color="0.3", linewidth=0.9, linestyle="--"))
        names.append(f"{baseline} (reference)")
    if central is not None:
        handles.append(Line2D([], [], color="0.3", linewidth=0.8, linestyle=":"))
        names.append(f"{central}, final")
    handles.append(Line2D([], [], color="0.8", linewidth=0.7))
    names.append("other rows of the kind")
    return fig.legend(handles, names, loc="upper center", ncol=len(names), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1.0))


def plot_partitions(spec: TableSpec, runs: list, records: dict[int, dict], out_dir: Path, name: str,
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
