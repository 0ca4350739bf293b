"""A wide table reads in a terminal and on GitHub (issue 30): table2 at paper scale has 5 partitions x 2
metrics x (ours, Δ FedAvg, paper, Δ, p) = 51 value columns. Wider than MAX_COLUMNS, the Markdown is one
block per table column, each with every row; a narrow table stays one table (the committed offline
tables are unchanged)."""
from __future__ import annotations

from bench.reporting.table_grid import MAX_COLUMNS, Grid, grid_header, grid_rows, markdown_blocks
from bench.tables.columns import Column


def cell(mean: float) -> dict:
    paper = {"protocol_differs": None, "paper_mean": 60.0, "paper_std": 1.0, "delta": mean - 60.0, "p_value": 0.5,
             "paper_source": "FedBM Table II"}
    return {"mean": mean, "std": 1.0, "values": [mean] * 3, "expected": 3, "best": False, "paired": None,
            "paired_note": "baseline", "papers": {"fedbm": paper}, **paper}


def table(n_columns: int) -> tuple[Grid, list[Column]]:
    columns = [Column(f"c{i}", f"dirichlet-{i}", f"β={i}") for i in range(n_columns)]
    labels = ["FedAvg", "FedBM"]
    cells = {(lab, c.id, m): cell(50.0 + i) for i, lab in enumerate(labels) for c in columns for m in ("accuracy", "f1")}
    grid = Grid()
    grid_header(grid, cells, labels, columns, ["accuracy", "f1"], "FedAvg", ["fedbm"], ["fedbm"], {"accuracy": "Acc"})
    grid_rows(grid, cells, labels, "FedAvg")
    return grid, columns


def tables_in(md: list[str]) -> list[list[str]]:
    out, current = [], None
    for line in md:
        if line.startswith("|"):
            if current is None:
                current = []
                out.append(current)
            current.append(line)
        else:
            current = None
    return out


def test_a_wide_table_is_one_block_per_column_with_every_row():
    grid, columns = table(5)
    assert len(grid.header) == 1 + 5 * 2 * 5  # Method + 5 columns x 2 metrics x (ours, Δ, paper, Δ, p)
    md = markdown_blocks(grid)
    blocks = tables_in(md)
    assert [line for line in md if line.startswith("### ")] == [f"### {c.label}" for c in columns]
    assert len(blocks) == 5
    for col, block in zip(columns, blocks):
        header = block[0].strip("|").split(" | ")
        assert header[0].strip() == "Method" and len(header) == 11 <= MAX_COLUMNS
        assert all(h.startswith(col.label) for h in header[1:])
        assert [row.split(" | ")[0].strip("| ") for row in block[2:]] == ["FedAvg", "FedBM"]
    # every value cell of the wide grid appears exactly once over the blocks
    cells = [c for b in blocks for row in b[2:] for c in row.strip("|").split(" | ")[1:]]
    assert len(cells) == 2 * (len(grid.header) - 1)
    assert "| 51.00 ± 1.00 | (reference) | 60.00 ± 1.00 | -8.00 | 0.500 |" not in md  # FedAvg is row 0: 50.00
    assert any("| FedBM | 51.00 ± 1.00 | (reference) | 60.00 ± 1.00 | -9.00 | 0.500 |" in line
               for line in md)


def test_a_narrow_table_stays_one_table():
    grid, _ = table(1)
    md = markdown_blocks(grid)
    assert len(tables_in(md)) == 1 and not any(line.startswith("###") for line in md)
    assert md[0] == "| " + " | ".join(grid.header) + " |"
