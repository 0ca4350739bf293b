"""The code version's parse cache (bench/core/code_version.py source_facts): a process reads what an earlier one
parsed, by content, and gets the same parts; a damaged entry is parsed again and an unwritable cache costs only
the parse. On a small tree of its own (an engine, a method, a data module, a partition scheme)."""
from __future__ import annotations

import pytest

from bench.core import code_version as cv

FILES = {
    "bench/__init__.py": "",
    "bench/assembly/__init__.py": "",
    "bench/assembly/experiment.py": "from bench.core import helpers\nimport torch\n\ndef run():\n    return helpers.two()\n",
    "bench/core/__init__.py": "",
    "bench/core/helpers.py": '"""Helpers."""\n\ndef two():\n    from ..core import more  # noqa\n    return 2\n',
    "bench/core/more.py": "X = 1\n",
    "lightning_modules/__init__.py": "",
    "lightning_modules/mine.py": 'from bench.core.helpers import two\n\n@METHODS.register("mine")\nclass Mine:\n    pass\n',
    "datamodules/__init__.py": "",
    "datamodules/digits.py": 'DATASETS.register("digits")(object)\n',
    "datamodules/partitions/__init__.py": "",
    "datamodules/partitions/dirichlet.py": '@PARTITION_SCHEMES.register("dirichlet")\ndef split():\n    pass\n',
}
RUN = {"method": {"name": "mine"}, "data": {"name": "digits"}, "partition": {"scheme": "dirichlet"}}


@pytest.fixture
def root(tmp_path):
    for rel, text in FILES.items():
        (tmp_path / "tree" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tree" / rel).write_text(text)
    return tmp_path / "tree"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty parse cache, and no facts remembered by this process."""
    monkeypatch.setattr(cv, "PARSE_CACHE", tmp_path / "cache")
    cv.source_facts.cache_clear()
    yield tmp_path / "cache"
    cv.source_facts.cache_clear()


def parts_of(root):
    tree = cv.Tree(root)
    return tree.parts(), {p.relative_to(root).as_posix(): sorted(d.relative_to(root).as_posix() for d in deps)
                          for p, deps in tree.graph.items()}, tree.version(RUN)


def test_a_later_process_reads_the_parse_and_gets_the_same_parts(root, cache, monkeypatch):
    cold = parts_of(root)
    assert cold[1]["bench/core/helpers.py"] == ["bench/__init__.py", "bench/core/__init__.py", "bench/core/more.py"]
    assert cold[1]["lightning_modules/mine.py"] == ["bench/__init__.py", "bench/core/__init__.py",
                                                     "bench/core/helpers.py"]
    assert sorted(cold[0]["method"]) == ["mine"] and cold[2] is not None
    distinct = {(root / rel).read_bytes() for rel in FILES}
    assert len(list(cache.glob("*.json"))) == len(distinct)  # one entry per distinct content
    cv.source_facts.cache_clear()  # a new process: only the disk remembers

    def no_parse(source):
        raise AssertionError("parsed although cached")

    monkeypatch.setattr(cv, "parse_facts", no_parse)
    assert parts_of(root) == cold


def test_an_edit_is_parsed_again_and_moves_only_its_parts(root, cache):
    before = parts_of(root)
    (root / "lightning_modules/mine.py").write_text(FILES["lightning_modules/mine.py"] + "Y = 3\n")
    after = parts_of(root)
    assert after[0]["engine"] == before[0]["engine"] and after[0]["method"]["mine"] != before[0]["method"]["mine"]
    (root / "lightning_modules/mine.py").write_text(FILES["lightning_modules/mine.py"] + "# a comment\n")
    assert parts_of(root) == before  # a comment moves nothing, cached or not


def test_a_damaged_or_foreign_entry_is_parsed_again(root, cache):
    cold = parts_of(root)
    entries = sorted(cache.glob("*.json"))
    entries[0].write_text("{not json")
    entries[1].write_text('{"sha256": "0000", "imports": [], "registers": [], "digest": "x"}')
    cv.source_facts.cache_clear()
    assert parts_of(root) == cold


def test_a_cache_that_is_a_file_costs_only_the_parse(root, cache):
    cache.write_text("not a folder")  # the folder cannot be made, whoever runs this
    cold = parts_of(root)
    cache.unlink()
    cv.source_facts.cache_clear()
    assert parts_of(root) == cold
