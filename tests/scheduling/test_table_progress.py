"""Issue 30: a table run in one process shows the current run's rounds, nested under the table's bar."""
from __future__ import annotations

from test_table_checks import GOOD, table

from bench.cli import main


def test_table_shows_each_runs_rounds_under_its_bar(tmp_path, capsys):
    assert main(table(tmp_path, GOOD)) == 0
    err = capsys.readouterr().err.replace("\r", "\n")
    assert "checks digits:" in err  # the table's bar over runs
    for method in ("fedavg", "fedprox"):  # and each run's round bar, to its last round
        assert f"{method} rounds: 100%" in err and "2/2" in err
