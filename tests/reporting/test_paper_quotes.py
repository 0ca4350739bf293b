"""A facet a paper states quotes it (issue 37.3): every ``stated`` source of results/paper/*.json carries a
``quote`` that occurs in the paper's text. The papers live outside the repository (../shared/papers or
$FEDBENCH_PAPERS); tests/data/paper_quotes.json keeps, verbatim, the passages around each quote, so the check
also runs where the papers are not. Where they are, every passage must still be a verbatim part of its paper."""
from __future__ import annotations

import json
import re

import pytest
from conftest import REPO
from test_paper_numbers import PAPER_FILES, papers_dir

from bench.reporting.paper_numbers import PAPERS
from bench.reporting.paper_sources import quote_fragments

EXCERPTS = json.loads((REPO / "tests" / "data" / "paper_quotes.json").read_text(encoding="utf-8"))["excerpts"]
QUOTES = {"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"'}


def norm(text: str) -> str:
    """Whitespace collapsed and typographic quotes made plain, as a quote is compared with the paper."""
    for a, b in QUOTES.items():
        text = text.replace(a, b)
    return re.sub(r"\s+", " ", text).strip()


def sources_of(node, out: list[dict]) -> list[dict]:
    """Every facet source ({"kind", "where", ...}) in a results/paper document."""
    if isinstance(node, dict):
        if "kind" in node and "where" in node:
            out.append(node)
        else:
            for v in node.values():
                sources_of(v, out)
    elif isinstance(node, list):
        for v in node:
            sources_of(v, out)
    return out


def stated_fragments(paper: str) -> set[str]:
    doc = json.loads((REPO / "results" / "paper" / f"{paper}.json").read_text(encoding="utf-8"))
    return {f for s in sources_of(doc, []) if s["kind"] == "stated" for f in quote_fragments(s)}


@pytest.mark.parametrize("paper", PAPERS)
def test_every_stated_source_quotes_its_paper(paper):
    doc = json.loads((REPO / "results" / "paper" / f"{paper}.json").read_text(encoding="utf-8"))
    stated = [s for s in sources_of(doc, []) if s["kind"] == "stated"]
    assert stated and all(quote_fragments(s) for s in stated)
    passages = norm(" ¶ ".join(EXCERPTS[paper]))
    missing = [f for f in stated_fragments(paper) if norm(f) not in passages]
    assert missing == [], f"quotes of {paper} not in its excerpts"


@pytest.mark.parametrize("paper", PAPERS)
def test_the_excerpts_are_verbatim_parts_of_the_papers(paper):
    assert EXCERPTS[paper] and all(stated_fragments(paper))
    pdir = papers_dir()
    if pdir is not None:  # on a checkout beside ../shared/papers (or with $FEDBENCH_PAPERS)
        text = (pdir / PAPER_FILES[paper]).read_text(encoding="utf-8")
        assert [e for e in EXCERPTS[paper] if e not in text] == []
        assert [f for f in stated_fragments(paper) if norm(f) not in norm(text)] == []


def test_a_quote_the_paper_does_not_hold_is_caught():
    passages = norm(" ¶ ".join(EXCERPTS["fedbm"]))
    assert norm("The number of clients is set to 12 for OCT-C8") in passages
    assert norm("The number of clients is set to 20 for OCT-C8") not in passages
