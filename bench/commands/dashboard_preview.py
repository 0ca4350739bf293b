"""A PNG of the dashboard's panels drawn from a table's run records, offline (`fedbench dashboard --preview`):
what the W&B workspace shows once the runs are logged, from the same data (each record's per-round scalars
as bench/tracking/wandb_logger.py logs them, and its summary at the table's round rule).

One row of panels per metric: its curve over rounds per β (a line per table row, mean ± std over seeds)
and the round-rule summary per row (bars per β); a last row with round seconds, bytes up and train loss.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bench.core.atomic_io import atomic_write
from bench.core.errors import FedbenchError

if TYPE_CHECKING:
    from bench.tables.table_spec import TableSpec

COST = ["time/round_seconds", "comm/bytes_up", "train/loss"]


@dataclass
class LoggedRun:
    """One run as W&B holds it: its row, β, per-round scalars and summary."""

    row: str
    beta: float | None
    rows: list[dict]
    summary: dict


def logged_runs(spec: TableSpec, runs: list) -> list[LoggedRun]:
    """Every planned run that has a record, as its W&B run would hold it (runs without one are left out)."""
    from bench.assembly.records import find_record, load_record
    from bench.scheduling.table_runner import wandb_identity
    from bench.tracking.wandb_logger import replayed_rows, rule_summary

    out = []
    for r in runs:
        path = find_record(r.cfg)
        if path is None:
            continue
        rec = load_record(path)
        rule = wandb_identity(r, spec, None)["round_rule"]
        out.append(LoggedRun(r.label, r.beta, replayed_rows(rec), rule_summary(rec, rule)))
    if not out:
        raise FedbenchError(f"Table {spec.name}: no run has a record yet, so there is nothing "
                            "to draw (run the table, or pass the --output-dir its records are in).")
    return out


def in_column(run: LoggedRun, beta: float | None) -> bool:
    """Whether ``run`` shows in the β column (a partition-independent row, β None, shows in every one)."""
    return run.beta is None or run.beta == beta


def mean_std_curve(runs: list[LoggedRun], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(rounds, mean, std) of ``key`` over the runs, at the rounds every run logged it."""
    curves = [{h["round"]: h[key] for h in run.rows if h.get(key) is not None} for run in runs]
    rounds = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    if not rounds:
        return None
    values = np.array([[c[x] for x in rounds] for c in curves], dtype=float)
    return np.array(rounds), values.mean(0), values.std(0)


def draw_curves(ax, runs: list[LoggedRun], labels: list[str], key: str, colors, title: str) -> None:
    for label, color in zip(labels, colors):
        curve = mean_std_curve([r for r in runs if r.row == label], key)
        if curve is None:
            continue
        x, mean, std = curve
        ax.plot(x, mean, color=color, lw=1.2, label=label)
        ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.15, lw=0)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("round", fontsize=8)
    ax.tick_params(labelsize=7)


def draw_bars(ax, runs: list[LoggedRun], labels: list[str], betas: list, key: str) -> None:
    """Each row's summary of ``key`` (the value at the round rule), mean ± std over seeds, a bar per β."""
    height = 0.8 / max(len(betas), 1)
    for j, beta in enumerate(betas):
        values = [[r.summary[key] for r in runs if r.row == label and in_column(r, beta) and key in r.summary]
                  for label in labels]
        y = np.arange(len(labels)) + j * height
        ax.barh(y, [np.mean(v) if v else np.nan for v in values], height, xerr=[np.std(v) if v else 0 for v in values],
                label="all" if beta is None else f"β={beta:g}", error_kw={"lw": 0.6})
    ax.set_yticks(np.arange(len(labels)) + height * (len(betas) - 1) / 2, labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_title(f"{key} at the round rule", fontsize=9)
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=6)


def draw_preview(name: str, metrics: list[str], runs: list[LoggedRun], path: str | Path) -> Path:
    """The panels as one PNG at ``path``."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels = list(dict.fromkeys(r.row for r in runs))
    betas = list(dict.fromkeys(r.beta for r in runs if r.beta is not None)) or [None]
    cols = len(betas) + 1
    fig = Figure(figsize=(4.2 * cols, 3.2 * (len(metrics) + 1) + 0.8))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(metrics) + 1, cols, squeeze=False)
    colors = [matplotlib.colormaps["tab20"](i % 20) for i in range(len(labels))]
    for i, key in enumerate(metrics):
        for j, beta in enumerate(betas):
            where = "" if beta is None else f" · β={beta:g}"
            draw_curves(axes[i][j], [r for r in runs if in_column(r, beta)], labels, key, colors, f"{key}{where}")
        draw_bars(axes[i][-1], runs, labels, betas, key)
    for j, ax in enumerate(axes[-1]):
        if j < len(COST):
            draw_curves(ax, runs, labels, COST[j], colors, f"{COST[j]} (all β)")
        else:
            ax.set_axis_off()
    handles, texts = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, texts, loc="lower center", ncol=min(len(texts), 6), fontsize=7, frameon=False)
    fig.suptitle(f"fedbench dashboard preview: {name} (lines: mean ± std over seeds, by config.row)", fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=90))
    return path
