"""Where each facet of a paper table's protocol comes from: stated in the paper, read from its public code,
or chosen by us (the shape is documented in bench/reporting/paper_numbers.py).

A published cell is inferred (†) when any facet it depends on is not ``stated``; ``inferred_facets`` names
them. Pure standard library.
"""
from __future__ import annotations

from typing import Any

from bench.core.errors import FedbenchError

# every facet a protocol record can have, in the order they are named
FACETS = ("eval", "round", "model", "clients", "rounds", "local_epochs", "sample_ratio", "epochs", "partition",
          "hyperparameters")
SETUP_FACETS = ("clients", "rounds", "local_epochs", "sample_ratio", "epochs", "partition")
KINDS = {
    "stated": "stated in the paper (where: the section, table or sentence; quote: the paper's words)",
    "code": "read from the public code (where: the repository and file)",
    "ours": "chosen by us (where: why)",
}
DEFAULT = "default"  # the key of a per-dataset / per-metric source's fallback


def quote_fragments(src: dict) -> list[str]:
    """A ``stated`` source's quote from the paper: one string, or a list of verbatim fragments (where the
    paper's sentence is interrupted, e.g. by an equation); [] for a source without one."""
    quote = src.get("quote")
    return [] if quote is None else [quote] if isinstance(quote, str) else list(quote)


def _check_source(src: Any, where: str) -> None:
    if not isinstance(src, dict) or not {"kind", "where"} <= set(src) <= {"kind", "where", "quote"}:
        raise FedbenchError(f"{where}: a facet source is {{\"kind\": ..., \"where\": ...}} (and a 'quote' when "
                            f"stated), got {src!r}.")
    if src["kind"] not in KINDS:
        raise FedbenchError(f"{where}: unknown source kind {src['kind']!r}; choose one of {', '.join(KINDS)}.")
    if not isinstance(src["where"], str) or not src["where"].strip():
        raise FedbenchError(f"{where}: the source says nothing about where it comes from ('where' is empty).")
    _check_quote(src, where)


def _check_quote(src: dict, where: str) -> None:
    """A ``stated`` source quotes the paper (``quote``: a non-empty string or list of them); another kind
    quotes nothing (what comes from code names its repository and file in ``where``)."""
    if src["kind"] != "stated":
        if "quote" in src:
            raise FedbenchError(f"{where}: a {src['kind']!r} source has no 'quote' (only what the paper states "
                                "is quoted from it).")
        return
    quote = src.get("quote")
    fragments = [quote] if isinstance(quote, str) else quote
    if not isinstance(fragments, list) or not fragments or not all(isinstance(f, str) and f.strip()
                                                                      for f in fragments):
        raise FedbenchError(f"{where}: a 'stated' source must quote the paper: 'quote' is the sentence (or a list "
                            f"of its verbatim fragments) that states it, got {quote!r}.")


def check_sources(sources: Any, where: str, selectors: set[str]) -> None:
    """Validate one ``sources`` mapping: known facets, each a source or a per-dataset / per-metric mapping of
    sources (keys among ``selectors`` or ``default``, which it must have)."""
    if not isinstance(sources, dict):
        raise FedbenchError(f"{where}: 'sources' must map facets to sources, got {sources!r}.")
    for facet, src in sources.items():
        at = f"{where}, sources.{facet}"
        if facet not in FACETS:
            raise FedbenchError(f"{at}: unknown facet {facet!r}; choose among {', '.join(FACETS)}.")
        if isinstance(src, dict) and "kind" not in src:
            unknown = sorted(set(src) - selectors - {DEFAULT})
            if unknown or DEFAULT not in src:
                raise FedbenchError(f"{at}: a per-dataset / per-metric source needs a {DEFAULT!r} entry and keys "
                                    f"among the table's datasets and metrics ({', '.join(sorted(selectors))}); "
                                    f"got {', '.join(sorted(src))}.")
            for key, one in src.items():
                _check_source(one, f"{at}.{key}")
        else:
            _check_source(src, at)


def resolve_sources(sources: dict, dataset: str | None, metric: str | None) -> dict[str, dict]:
    """Each facet's source for one cell: a per-metric entry first, then a per-dataset one, then the default."""
    out = {}
    for facet, src in sources.items():
        if "kind" not in src:
            src = src.get(metric) or src.get(dataset) or src[DEFAULT]
        out[facet] = src
    return out


def applicable_facets(proto: dict) -> list[str]:
    """The facets a cell with merged protocol ``proto`` depends on: what is evaluated, the round, the model
    (where the record names one), each setup value it records, and the hyperparameters."""
    setup = proto.get("setup") or {}
    return [f for f in FACETS if f in ("eval", "round", "hyperparameters") or (f == "model" and "model" in proto)
            or (f in SETUP_FACETS and f in setup)]


def missing_sources(proto: dict, sources: dict) -> list[str]:
    return [f for f in applicable_facets(proto) if f not in sources]


def inferred_facets(cell: dict) -> list[str]:
    """The facets of a published cell's protocol that are not stated (read from code or chosen by us), in
    FACETS order. ``cell`` is a published cell (bench.reporting.paper_numbers: its protocol's ``sources``)
    or a table cell's comparison with one (bench.reporting.paper_compare.compare: its ``paper_sources``,
    facet -> kind)."""
    if "paper_sources" in cell:
        kinds = cell["paper_sources"] or {}
    else:
        proto = cell.get("protocol") or {}
        sources = proto.get("sources") or {}
        kinds = {f: sources[f]["kind"] for f in applicable_facets(proto) if f in sources}
    return [f for f in FACETS if f in kinds and kinds[f] != "stated"]


def source_kinds(cell: dict) -> dict[str, str]:
    """facet -> kind for every facet a published cell depends on that has a source."""
    proto = cell.get("protocol") or {}
    sources = proto.get("sources") or {}
    return {f: sources[f]["kind"] for f in applicable_facets(proto) if f in sources}
