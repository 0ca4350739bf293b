"""Issue 30: the curves plot reads at a glance: whole-number round ticks, FedAvg as the reference, Central as a line, per-client rows apart."""
from __future__ import annotations

import matplotlib.figure
from test_tables import SPEC, fake_record

from bench.core.atomic_io import write_json
from bench.records import record_path
from bench.reporting.table_runner import plan_runs
from bench.reporting.tables import render_table


def record_figures(monkeypatch) -> list:
    """The matplotlib Figures created from now on (the plots build theirs inside)."""
    figures = []

    class Recording(matplotlib.figure.Figure):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            figures.append(self)

    monkeypatch.setattr(matplotlib.figure, "Figure", Recording)
    return figures


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
    grey = [ln for ln in panels["FedRep (per-client)"].get_lines() if ln.get_color() == "0.8"]
    assert grey == []  # no global-model row behind a per-client one
    central_line = next(ln for ln in panels["Ours only"].get_lines() if ln.get_linestyle() == ":")
    assert central_line.get_ydata()[0] == 90.0  # Central's last round (fake_record: acc at the final round)
