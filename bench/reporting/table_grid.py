"""The Markdown grid of a rendered table: its header, one row per table row, the cells' text (ours, the
paired difference to the baseline, each paper's number with its Δ and p) and the footnotes of protocol
and setup differences.

A table wider than ``MAX_COLUMNS`` columns (table2 at paper scale: 5 partitions x 2 metrics x ours, Δ,
paper, Δ, p) is printed as one block per table column (β, partition), each with every row, so that it
reads in a terminal and on GitHub; the CSV and JSON hold the whole table in one piece.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from bench.reporting.departures import id_key, row_mark
from bench.reporting.paper_compare import PAPER_NAMES
from bench.tables.columns import Column

MAX_COLUMNS = 13  # Method + at most 12 value columns in one Markdown table


def fmt(cell: dict, each: str = "seed") -> str:
    """A cell's mean ± std; ``each``: what the table repeats over (seed, or fold in a fold table)."""
    if cell["mean"] is None:
        return f"missing (0/{cell['expected']} {each}s)"
    text = f"{cell['mean']:.2f}" + ("" if cell["std"] is None else f" ± {cell['std']:.2f}")
    if len(cell["values"]) < cell["expected"]:
        text += f" ({len(cell['values'])}/{cell['expected']} {each}s)"
    if cell.get("warnings"):
        text += " ⚠"
    if cell.get("marks"):
        text += f" ({'; '.join(cell['marks'])})"
    return text


def fmt_paper(cmp: dict, footnote: int | None = None) -> list[str]:
    """The paper, delta and p-value columns of one cell (one paper); a protocol or setup difference
    names what differs ("protocol differs: round", "setup differs: rounds 20 vs 200", "not comparable:
    ...") and points to its footnote."""
    if cmp["protocol_differs"] is not None:
        mark = f" [{footnote}]" if footnote is not None else ""
        return [f"{cmp['protocol_differs_in']}{mark}", "—", "—"]
    if cmp["paper_mean"] is None:
        return ["n/a", "n/a", "n/a"]
    paper = f"{cmp['paper_mean']:.2f}" + (f" ± {cmp['paper_std']:.2f}" if cmp["paper_std"] is not None else "")
    if cmp.get("protocol_inferred"):
        paper += " †"
    delta = "missing" if cmp["delta"] is None else f"{cmp['delta']:+.2f}"
    p = "n/a" if cmp["p_value"] is None else f"{cmp['p_value']:.3f}"
    return [paper, delta, p]


def fmt_paired(cell: dict) -> str:
    """The paired-difference column of one cell: "+6.60 [-3.09, 16.29]", "*" when p < ALPHA."""
    diff = cell.get("paired")
    if diff is None:
        return {"baseline": "(reference)", "missing": "missing"}.get(cell.get("paired_note") or "", "—")
    if diff["ci95"] is None:
        return f"{diff['mean']:+.2f} (1 seed)"
    low, high = diff["ci95"]
    return f"{diff['mean']:+.2f} [{low:+.2f}, {high:+.2f}]" + (" *" if diff["significant"] else "")


def shown_paper_groups(cells: dict, labels: list[str], col: Column, metric: str, groups: list[str],
                       papers: list[str]) -> list[str | None]:
    """The paper column groups of (column, metric) that print something other than n/a for some row;
    [None] stands for the plain "paper" group of a table with no paper cell at all."""
    candidates: list[str | None] = list(groups) or [None]
    out = []
    for p in candidates:
        for label in labels:
            cell = cells[(label, col.id, metric)]
            cmp = cell["papers"][p] if p else cell
            if cmp["protocol_differs"] is not None or cmp["paper_mean"] is not None:
                out.append(p)
                break
    return out


@dataclass
class Grid:
    """The table as text: ``header`` and ``rows`` (Method first), and per value column the table column
    it belongs to (``owner``, to cut a wide table into blocks); ``footnotes`` numbers each difference."""

    header: list[str] = field(default_factory=lambda: ["Method"])
    owner: list[Column | None] = field(default_factory=lambda: [None])
    rows: list[list[str]] = field(default_factory=list)
    footnotes: dict[str, int] = field(default_factory=dict)
    layout: list[tuple[Column, str, list[str | None]]] = field(default_factory=list)
    each: str = "seed"  # what the table repeats over (tables.repeat_word): "fold" in a fold table


def grid_header(grid: Grid, cells: dict, labels: list[str], columns: list[Column], metrics: list[str],
                baseline: str | None, groups: list[str], papers: list[str], metric_labels: dict[str, str]) -> None:
    """Fill the header and the layout: per (column, metric) ours, Δ baseline and each paper group shown."""
    for col in columns:
        for m in metrics:
            lab = f"{col.label} {metric_labels.get(m, m)}"
            shown_groups = shown_paper_groups(cells, labels, col, m, groups, papers)
            grid.layout.append((col, m, shown_groups))
            names = [f"{lab} ours"] + ([f"{lab} Δ {baseline} [95% CI]"] if baseline is not None else [])
            for p in shown_groups:
                if p is None:
                    names += [f"{lab} paper", f"{lab} Δ", f"{lab} p"]
                else:
                    tag = f" {PAPER_NAMES.get(p, p)}" if len(groups) > 1 else ""
                    names += [f"{lab} {PAPER_NAMES.get(p, p)}", f"{lab} Δ{tag}", f"{lab} p{tag}"]
            grid.header += names
            grid.owner += [col] * len(names)


def grid_rows(grid: Grid, cells: dict, labels: list[str], baseline: str | None) -> None:
    """One text row per table row, its label marked with the ids of the departures that can move it (its
    cells' ``departures``); a protocol or setup difference gets a numbered footnote."""
    for label in labels:
        ids = {i for (lab, _, _), cell in cells.items() if lab == label for i in cell.get("departures") or []}
        row = [row_mark(label, sorted(ids, key=id_key))]
        for col, m, shown_groups in grid.layout:
            cell = cells[(label, col.id, m)]
            text = fmt(cell, grid.each)
            row.append(f"**{text}**" if cell["best"] else text)
            if baseline is not None:
                row.append(fmt_paired(cell))
            for p in shown_groups:
                cmp = cell["papers"][p] if p else cell
                note = None
                if cmp["protocol_differs"]:
                    key = f"{label} vs {cmp['paper_source']}: {cmp['protocol_differs']}"
                    note = grid.footnotes.setdefault(key, len(grid.footnotes) + 1)
                row += fmt_paper(cmp, note)
        grid.rows.append(row)


def markdown_blocks(grid: Grid) -> list[str]:
    """The grid as Markdown: one table, or, wider than MAX_COLUMNS, one per table column under its label."""
    blocks: list[tuple[str | None, list[int]]]
    if len(grid.header) <= MAX_COLUMNS:
        blocks = [(None, list(range(1, len(grid.header))))]
    else:
        owners = list({id(c): c for c in grid.owner[1:]}.values())  # in order, each once
        blocks = [(col.label, [i for i, c in enumerate(grid.owner) if c is col]) for col in owners]
    out: list[str] = []
    for title, index in blocks:
        keep = [0, *index]
        if title is not None:
            out += ([""] if out else []) + [f"### {title}", ""]
        out += ["| " + " | ".join(grid.header[i] for i in keep) + " |", "|" + "---|" * len(keep)]
        out += ["| " + " | ".join(row[i] for i in keep) + " |" for row in grid.rows]
    return out
