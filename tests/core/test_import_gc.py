"""The collector paused while a process imports the training stack (bench/core/import_gc.py). That a real
`fedbench run` makes no collector pass while torch, Lightning and the stack import is checked on the run
itself in tests/commands/test_startup.py."""
from __future__ import annotations

import gc
import sys
import types

import pytest

from bench.core.import_gc import stack_import


@pytest.fixture
def torch_not_imported(monkeypatch):
    """This process as a fresh one sees it: torch not imported yet (it comes back after the test)."""
    monkeypatch.delitem(sys.modules, "torch", raising=False)


def test_the_first_import_runs_without_the_collector_then_what_is_alive_is_frozen(torch_not_imported):
    assert gc.isenabled()
    frozen_before = gc.get_freeze_count()
    with stack_import():
        assert not gc.isenabled()
        made = [[i] for i in range(1000)]  # objects the import would create: alive when it ends
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen_before + len(made)


def test_an_import_that_fails_turns_the_collector_back_on(torch_not_imported):
    with pytest.raises(ImportError), stack_import():
        raise ImportError("no module named torch")
    assert gc.isenabled()


def test_a_process_that_has_torch_already_is_left_as_it_is(monkeypatch):
    # as a caller of fedbench from Python, or a worker forked from the --jobs forkserver, has it
    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or types.ModuleType("torch"))
    frozen_before = gc.get_freeze_count()
    with stack_import():
        assert gc.isenabled()
    assert gc.get_freeze_count() == frozen_before


def test_a_collector_the_caller_turned_off_stays_off(torch_not_imported):
    gc.disable()
    try:
        frozen_before = gc.get_freeze_count()
        with stack_import():
            assert not gc.isenabled()
        assert not gc.isenabled()
        assert gc.get_freeze_count() == frozen_before
    finally:
        gc.enable()
