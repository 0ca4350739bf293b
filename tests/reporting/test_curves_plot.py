"""Issue 30: the curves plot reads at a glance: whole-number round ticks, FedAvg as the reference, Central as a line, per-client rows apart."""
from __future__ import annotations

import matplotlib.figure
import pytest
from test_tables import SPEC, fake_record

from bench.assembly.records import record_path
from bench.core.atomic_io import write_json
from bench.reporting.tables import render_table
from bench.scheduling.table_runner import plan_runs

pytestmark = pytest.mark.slow  # end-to-end (>= 6 s): make test-fast leaves this file out


def record_figures(monkeypatch) -> list:
    """The matplotlib Figures created from now on (the plots build theirs inside)."""
    figures = []

    class Recording(matplotlib.figure.Figure):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            figures.append(self)

    monkeypatch.setattr(matplotlib.figure, "Figure", Recording)
    return figures


def grey_curves(ax) -> list:
    """The grey background curves of a panel (one LineCollection of the other rows), as (x, y) arrays."""
    from matplotlib.collections import LineCollection

    return [seg for c in ax.collections if isinstance(c, LineCollection) for seg in c.get_segments()]


def test_round_ticks_are_whole_numbers(tmp_path, monkeypatch):
    figures = record_figures(monkeypatch)
    runs = plan_runs(SPEC, str(tmp_path / "runs"))
    for run in runs:
        if run.label == "FedAvg":
            write_json(record_path(run.cfg.output_dir, run.cfg.experiment, run.cfg.run_name()), fake_record(run, 60.0))
    render_table(SPEC, runs, str(tmp_path / "tables"))
    curves = [ax for fig in figures for ax in fig.axes if ax.get_visible() and ax.get_xlabel() == "round"]
    assert curves
    for ax in curves:
        lo, hi = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_curves_draw_fedavg_as_reference_central_as_a_line_and_per_client_rows_apart(tmp_path, monkeypatch):
    """Issue 30: on a global-model panel the baseline (FedAvg) is dashed and Central's final accuracy a dotted
    line, the grey background holds only rows of the same kind; per-client rows come last, without either."""
    figures = record_figures(monkeypatch)
    runs = plan_runs(SPEC, str(tmp_path / "runs"))
    acc = {"FedAvg": 60.0, "Central": 90.0, "Ours only": 70.0, "FedRep (per-client)": 80.0}
    for run in runs:
        protocol = "per_client" if run.label.startswith("FedRep") else "global"
        write_json(record_path(run.cfg.output_dir, run.cfg.experiment, run.cfg.run_name()),
                   fake_record(run, acc[run.label], protocol))
    render_table(SPEC, runs, str(tmp_path / "tables"))
    (fig,) = [f for f in figures if any(ax.get_xlabel() == "round" for ax in f.axes)]
    panels = {ax.get_title().rsplit(" (n=", 1)[0]: ax for ax in fig.axes if ax.get_visible()}
    assert list(panels) == ["FedAvg", "Ours only", "Central", "FedRep (per-client)"]
    styles = {name: [ln.get_linestyle() for ln in ax.get_lines()] for name, ax in panels.items()}
    assert "--" in styles["Ours only"] and ":" in styles["Ours only"]  # FedAvg reference, Central's line
    assert "--" not in styles["FedAvg"] and ":" in styles["FedAvg"]
    assert "--" not in styles["FedRep (per-client)"] and ":" not in styles["FedRep (per-client)"]
    assert grey_curves(panels["FedRep (per-client)"]) == []  # no global-model row behind a per-client one
    # behind FedAvg: the other global-model row (Ours only, 70 at its last round) in each column, not Central
    behind = grey_curves(panels["FedAvg"])
    assert len(behind) == len(SPEC.betas) and all(curve[-1][1] == 70.0 for curve in behind)
    central_line = next(ln for ln in panels["Ours only"].get_lines() if ln.get_linestyle() == ":")
    assert central_line.get_ydata()[0] == 90.0  # Central's last round (fake_record: acc at the final round)


def fake_table(nrows: int, rounds: int = 20):
    """Runs and records of ``nrows`` rows (registered methods in turn) in one column, accuracy up to 100."""
    import types

    from lightning_modules.base import METHODS

    column = types.SimpleNamespace(id="b0", label="β=0.5", derived=False, file_tag="beta0.5")
    runs, records = [], {}
    for i in range(nrows):
        name = METHODS.names()[i % len(METHODS.names())]
        run = types.SimpleNamespace(label=f"{name}-{i}", columns=[column.id], seed=0,
                                    cfg=types.SimpleNamespace(method=types.SimpleNamespace(name=name)))
        runs.append(run)
        records[id(run)] = {"protocol": None, "history": [
            {"round": k, "metrics": {"test/accuracy": 100.0 * (k + 1) / rounds}} for k in range(rounds)]}
    return runs, records, [column]


def test_panels_fit_the_figure_without_overlapping(tmp_path, monkeypatch):
    """The fixed margins (plots.place_panels) keep every panel with its title and tick and axis labels
    inside the figure, below the legend and title, and apart from its neighbours: 45 rows (the last
    row part-filled, so upper rows carry round labels), 12 rows (full rows) and one row, whose figure
    is widened until the legend and title fit (plots.widen_for)."""
    from itertools import combinations

    from bench.reporting.plots import plot_curves
    from bench.tables.table_spec import TableSpec

    for nrows in (45, 12, 1):
        figures = record_figures(monkeypatch)
        runs, records, columns = fake_table(nrows)
        plot_curves(TableSpec("t", "d", (0,), (), {}), runs, records, tmp_path / f"c{nrows}.png", columns,
                    baseline=runs[0].label)
        (fig,) = figures
        renderer = fig.canvas.get_renderer()
        boxes = [ax.get_tightbbox(renderer) for ax in fig.axes if ax.get_visible()]
        assert len(boxes) == nrows
        header = [fig._suptitle.get_window_extent(renderer), fig.legends[0].get_window_extent(renderer)]
        assert all(0 <= box.x0 and box.x1 <= fig.bbox.width for box in header), (nrows, header)  # not cut off
        top = min(box.y0 for box in header)
        for box in boxes:
            assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= fig.bbox.width and box.y1 <= top, (nrows, box)
        for a, b in combinations(boxes, 2):
            assert not a.overlaps(b), (nrows, a, b)
