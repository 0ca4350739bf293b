"""Issue 30: the curves' round axis has whole-number ticks (three rounds used to be ticked 0, 0.25, ...)."""
from __future__ import annotations

import matplotlib.figure
from test_tables import SPEC, fake_record

from bench.core.atomic_io import write_json
from bench.records import record_path
from bench.reporting.table_runner import plan_runs
from bench.reporting.tables import render_table


def test_round_ticks_are_whole_numbers(tmp_path, monkeypatch):
    figures = []

    class Recording(matplotlib.figure.Figure):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            figures.append(self)

    monkeypatch.setattr(matplotlib.figure, "Figure", Recording)
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
