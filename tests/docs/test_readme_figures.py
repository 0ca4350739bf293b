"""Every figure the README and its docs/ pages quote about the project itself is recomputed here from what
produces it (issue 39, item 5: 121 vs 125 packages, a record name format no longer used), so that it cannot go
stale unnoticed."""
from __future__ import annotations

import re

import yaml
from conftest import REPO

from bench.scheduling.table_runner import distinct_runs, load_table_config, plan_runs

WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}


def text(page: str) -> str:
    return " ".join((REPO / page).read_text().split())  # one space between words: figures across line breaks


def plan(table: str):
    spec = load_table_config(f"configs/tables/{table}.yaml")
    return spec, distinct_runs(plan_runs(spec, "results/runs", check_records=False))


def test_package_count_and_torch_version_are_the_lock_s():
    lock = [line for line in (REPO / "requirements.lock").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    torch = next(line.split("==")[1] for line in lock if line.startswith("torch=="))
    count, version = re.search(r"dependency tree \((\d+) packages, torch (\S+) with", text("docs/install.md")).groups()
    assert (int(count), version) == (len(lock), torch)


def test_the_readme_s_counts_are_the_configs():
    readme = text("README.md")
    papers = re.search(r"comparison tables of (\w+) papers \(([^)]*)\)", readme)
    assert WORDS[papers.group(1)] == len(papers.group(2).split(", ")) == len(list((REPO / "results/paper").glob("*.json")))
    spec, runs = plan("table2_fashion-mnist")
    rows, betas, seeds = map(int, re.search(r"(\d+) rows x (\d+) label skews x (\d+) seeds", readme).groups())
    assert (rows, betas, seeds) == (len(spec.labels), len(spec.betas), len(spec.seeds))
    results = text("docs/results.md")
    assert f"{len(runs)} runs of {rows} rows x {betas} betas x {seeds} seeds" in results
    quick = yaml.safe_load((REPO / "configs/experiments/quick.yaml").read_text())
    assert f"It trains {quick['partition']['num_clients']} clients for {quick['fed']['rounds']} rounds" in readme


def test_the_record_names_shown_are_the_ones_written():
    """docs/tables.md's record-name format matches every run of the kvasir table, and its examples are real."""
    spec, runs = plan("table2_kvasir")
    names = {r.cfg.run_name() for r in runs}
    tables = text("docs/tables.md")
    assert "`<method>[-<8 hex of its method.args>][@<protocol>]_kvasir_dir<beta>_c10_s<seed>`" in tables
    pattern = re.compile(r"[a-z0-9-]+(-[0-9a-f]{8})?(@[a-z_]+)?_kvasir_dir(0\.05|0\.1)_c10_s[0-2]")
    assert all(pattern.fullmatch(name) for name in names)
    examples = re.search(r"the run name being `[^`]*`, e\.g\. (.*?) \(`_<8 hex>`", tables).group(1)
    shown = re.findall(r"`([^`]+)`", examples)
    assert len(shown) == 3 and set(shown) <= names
    rows = len(spec.labels)
    rounds = {r.cfg.fed.rounds for r in runs}
    assert f"({rows} rows x {len(spec.betas)} betas x {len(spec.seeds)} seeds, {rounds.pop()} rounds each" in tables
    assert not rounds


def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_readme_and_docs_resolves():
    """The reference moved to docs/: every relative link (file and #heading) of the README and docs/ pages exists."""
    pages = ["README.md", *(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        base = (REPO / page).parent
        for target in re.findall(r"\]\(([^)\s]+)\)", (REPO / page).read_text()):
            if "://" in target:
                continue
            path, _, fragment = target.partition("#")
            file = (base / path).resolve() if path else REPO / page
            headings = [anchor(line.lstrip("#")) for line in file.read_text().splitlines()
                        if line.startswith("#")] if file.suffix == ".md" and file.exists() else []
            if not file.exists() or (fragment and fragment not in headings):
                broken.append(f"{page}: {target}")
    assert not broken


def test_the_reduced_table_path_shown_is_the_one_written():
    """docs/tables.md's example of a reduced table is what `--set fed.rounds=2 --seeds 0` on table2_kvasir writes."""
    from bench.tables.table_overrides import TableOverrides

    spec = load_table_config("configs/tables/table2_kvasir.yaml")
    ov = TableOverrides.parse(spec, ["fed.rounds=2"], "0", None)
    path = f"{ov.tables_dir('results/tables')}/{ov.table_name('table2_kvasir')}.md"
    assert path == "results/tables/reduced/table2_kvasir__set-fed.rounds=2_seeds-0.md"
    assert 'ARGS="--set fed.rounds=2 --seeds 0"` (written as `' + path in text("docs/tables.md")
    assert 'ARGS="--set fed.rounds=2 --seeds 0"` (a reduced table, written under `results/tables/reduced/`' in text("README.md")
