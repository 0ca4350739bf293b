"""Issue 40, item 5: methods never import torch.distributed. What a method needs of the ranks (is this
rank 0; rank 0 first through a block, then the others) comes from bench/core/ranks.py, set by the engine
for the run, with the run's own barrier (bench/engine/liveness.py: under --timeout, a missing rank named)."""
from __future__ import annotations

import ast

import pytest
from conftest import REPO

from bench.core.ranks import ONE_RANK, Ranks, current_ranks, run_scope, set_ranks


def distributed_imports(path) -> list[str]:
    tree = ast.parse(path.read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    names += [f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "torch"
              for a in n.names]
    return [m for m in names if m == "torch.distributed" or m.startswith("torch.distributed.")]


def test_no_method_or_data_module_imports_torch_distributed():
    found = {str(p.relative_to(REPO)): distributed_imports(p) for pkg in ("lightning_modules", "datamodules")
             for p in sorted((REPO / pkg).rglob("*.py"))}
    assert {k: v for k, v in found.items() if v} == {}
    assert distributed_imports(REPO / "bench" / "engine" / "liveness.py")  # the check sees `import torch.distributed as dist`


def order_of(rank: int, world: int, log: list) -> None:
    ranks = Ranks(rank, world, lambda what: log.append((rank, "barrier", what)))
    with ranks.rank_zero_first("the cache"):
        log.append((rank, "work"))


def test_rank_zero_works_before_the_barrier_and_the_others_after_it():
    log: list = []
    order_of(0, 2, log)
    order_of(1, 2, log)
    assert log == [(0, "work"), (0, "barrier", "the cache"), (1, "barrier", "the cache"), (1, "work")]
    log.clear()
    order_of(0, 1, log)  # one rank: no barrier
    assert log == [(0, "work")]
    with pytest.raises(ValueError, match="barrier"):
        Ranks(1, 2)


def test_a_runs_ranks_end_with_its_scope():
    assert current_ranks() is ONE_RANK
    two = Ranks(1, 2, lambda what: None)
    with run_scope():
        set_ranks(two)
        assert current_ranks() is two and not current_ranks().is_main
    assert current_ranks() is ONE_RANK  # the next run or test in this process sees one rank


@pytest.mark.slow  # one run: about 15 s
def test_a_run_in_process_sees_its_own_ranks_and_leaves_one_rank_behind(tiny_cfg, monkeypatch):
    from bench.assembly import experiment

    seen, build = [], experiment.build_module
    monkeypatch.setattr(experiment, "build_module", lambda cfg, dm: seen.append(current_ranks()) or build(cfg, dm))
    experiment.run_experiment(tiny_cfg(**{"fed.rounds": 1}))
    assert len(seen) == 1 and seen[0] is not ONE_RANK and (seen[0].rank, seen[0].world_size) == (0, 1)
    assert current_ranks() is ONE_RANK
