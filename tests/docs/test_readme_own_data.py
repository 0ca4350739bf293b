"""The README as a user reads it: "Your own data" runs as written on a generated class-folder dataset (its
budget shrunk to seconds), and the first screen's excerpt is the committed table2_fashion-mnist.md."""
from __future__ import annotations

import json
import re

import pytest
import yaml
from conftest import REPO, doc_section
from official_layouts import write_class_tree

from bench.cli import main
from bench.reporting.uncertainty import paired_difference
from bench.tables.spec import deep_merge

# what the test changes in the README's config: a budget of seconds (tiny images, small CNN, 2 rounds on 3
# clients, 2 seeds) and caches under tmp_path; data, rows, methods, prompts and columns stay as written
BUDGET = {"base": {"data": {"image_size": 8}, "method": {"backbone": "simple-cnn"},
                   "partition": {"num_clients": 3, "args": {"min_size": 4}},
                   "fed": {"rounds": 2, "batch_size": 8}, "threads": 1},
          "seeds": [0, 1]}


def readme_blocks(section: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", doc_section(section), re.DOTALL)


def test_readme_own_data_runs_as_written(tmp_path, monkeypatch, capsys):
    table_yaml, prompts_yaml = readme_blocks("Your own data", "yaml")
    assert table_yaml.startswith("# my_table.yaml") and prompts_yaml.startswith("# my_prompts.yaml")
    assert len([line for line in table_yaml.splitlines() if not line.startswith("#")]) == 10  # a ten-line config
    spec, prompts = yaml.safe_load(table_yaml), yaml.safe_load(prompts_yaml)
    monkeypatch.chdir(tmp_path)  # the README's relative paths: my_images/, my_prompts.yaml
    (tmp_path / "my_prompts.yaml").write_text(prompts_yaml)
    classes = sorted(prompts["concepts"])
    write_class_tree(tmp_path / "my_images", classes, 20, ext="png")
    monkeypatch.setattr("lightning_modules.fedcb.DEFAULT_TEXT_CACHE", str(tmp_path / "text"))
    monkeypatch.setattr("lightning_modules.clip_feature_base.DEFAULT_FEATURE_CACHE", str(tmp_path / "features"))
    spec = deep_merge(spec, {**BUDGET, "base": deep_merge(BUDGET["base"], {"data": {"cache_dir": str(tmp_path / "cache")}})})
    (tmp_path / "my_table.yaml").write_text(yaml.safe_dump(spec))
    assert main(["table", "--config", "my_table.yaml", "--output-dir", "runs", "--tables-dir", "tables"]) == 0
    capsys.readouterr()

    name = f"{spec['table']}_{spec['dataset']}"
    table = json.loads((tmp_path / "tables" / f"{name}.json").read_text())
    cells = {(c["method"], c["beta"], c["metric"]): c for c in table["cells"]}
    labels = [r["label"] for r in spec["rows"]]
    assert {k[0] for k in cells} == set(labels) and all(c["mean"] is not None for c in cells.values())
    records = [json.loads(p.read_text()) for p in (tmp_path / "runs" / name).glob("*.json")]
    assert len(records) == len(labels) * len(spec["betas"]) * len(spec["seeds"])
    # the prompt-reading rows read the file: concepts in label (sorted folder) order
    want = [prompts["concepts"][c] for c in classes]
    for rec in records:
        if rec["method"] in ("fedcb", "fedbm", "facmic"):
            assert rec["prompts"]["concepts"] == want and rec["prompts"]["concepts_from"] == "file 'my_prompts.yaml'"
    templates = {rec["method"]: rec["prompts"]["templates"] for rec in records if "prompts" in rec}
    assert templates["fedcb"] == prompts["templates"] and templates["facmic"] == prompts["templates"][:1]
    # the paired column is the per-seed difference of the records, by hand
    for label, beta in ((lab, b) for lab in labels[1:] for b in spec["betas"]):
        row, base = cells[(label, beta, "accuracy")], cells[("FedAvg", beta, "accuracy")]
        diff = paired_difference(row["values"], row["seeds"], base["values"], base["seeds"])
        assert row["paired"]["diffs"] == pytest.approx([a - b for a, b in zip(row["values"], base["values"])])
        assert row["paired"]["mean"] == pytest.approx(diff.mean) and row["paired"]["seeds"] == [0, 1]
    md = (tmp_path / "tables" / f"{name}.md").read_text()
    assert "| Method | β=0.1 Acc ours | β=0.1 Acc Δ FedAvg [95% CI] |" in md and " paper" not in md.split("| Method")[1]


def test_readme_first_screen_is_the_committed_table():
    """The README's first screen: the quick run, the two commands and the committed curves; the excerpt of the
    committed table in docs/results.md (which the README links) is that table."""
    first = (REPO / "README.md").read_text().split("\n## ", 2)[1]
    assert "make quick" in first and "make table2" in first and "make test" in first
    assert "![test accuracy per round, one panel per method](results/tables/table2_fashion-mnist_curves.png)" in first
    assert "[docs/results.md](docs/results.md)" in first
    assert (REPO / "results" / "tables" / "table2_fashion-mnist_curves.png").exists()
    first = doc_section("The default comparison: table2 on Fashion-MNIST")
    assert "![test accuracy per round, one panel per method](../results/tables/table2_fashion-mnist_curves.png)" in first
    table = (REPO / "results" / "tables" / "table2_fashion-mnist.md").read_text()
    rows = {line.split(" | ")[0][2:].split(" <sup>")[0]: line.strip("| \n").split(" | ")  # label less its departure ids
            for line in table.splitlines() if line.startswith("| ")}
    excerpt = [line.strip("| ").split(" | ") for line in first.splitlines()
               if line.startswith("| ") and not line.startswith("| Method")]
    assert len(excerpt) >= 5
    for label, acc5, d5, acc1, d1 in excerpt:  # β=0.05 Acc, its Δ, β=0.1 Acc, its Δ of the full table
        full = rows[label]
        assert [acc5, d5, acc1, d1] == [full[1], full[2], full[5], full[6]], label
