"""Shared test setup: offline hubs, small thread counts, and helpers to run experiments."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The Ctrl-C tests need their child processes to start with SIGINT handled as Python does by default. A suite
# started in the background of a shell without job control (`make test &` in a script, nohup) inherits SIGINT
# *ignored*, and an ignored signal stays ignored across fork and exec, so every child would ignore Ctrl-C
# (the command then rightly leaves it ignored: bench/core/lifetime.py). Handled here, children get the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from bench.core.compat import skip_unused_imports
from bench.core.import_gc import stack_import

skip_unused_imports()  # tests import Lightning and timm as fedbench's processes do (bench/cli.py main)

import pytest

# torch is imported where a helper needs it, not here: pytest-xdist's controller imports this file before it
# starts the workers and runs no test, so a module-level torch import held every worker back 1.7 s.

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
# The test folders mirror the packages (tests/engine for bench/engine, tests/methods for lightning_modules ...).
# A test module may reuse another's fixtures across folders (``from test_tables import fake_record``): every
# folder is importable as pytest's rootdir-relative "prepend" mode makes each file's own folder. Test file
# names stay unique across the folders (pytest refuses two modules of one name in this mode).
sys.path[1:1] = [str(d) for d in sorted(TESTS.iterdir()) if d.is_dir() and any(d.glob("test_*.py"))]


@pytest.fixture
def tiny_cfg(tmp_path):
    """A RunConfig for fast runs on sklearn digits with the small CNN (it has BatchNorm, so buffer
    aggregation is exercised), writing under tmp_path (tests/rank_pairs.py base_cfg, which the shared
    two-rank launch builds its cases from)."""
    from rank_pairs import base_cfg

    def make(**overrides):
        return base_cfg(tmp_path, **overrides)

    return make


_CAPTURING: list[dict] = []  # the boxes of the active `captured` fixtures (run_in_process fills the last)


@pytest.fixture
def captured():
    """Run experiments in process (run_in_process) and keep the Federation (client states, module, history) and
    the module's initial state: the run's own hook (RunObserver.federation_built), not a patched engine."""
    box: dict = {}
    _CAPTURING.append(box)
    yield box
    _CAPTURING.remove(box)


def capture_into(box: dict):
    """A RunObserver keeping the run's Federation and its module's state before the first round in ``box``."""
    from bench.assembly.run_outputs import RunObserver

    class Capture(RunObserver):
        def federation_built(self, federation) -> None:
            box["fed"] = federation
            box["initial_state"] = {k: v.detach().clone() for k, v in federation.module.state_dict().items()}

    return Capture()


def run_in_process(cfg, observer=None):
    """Run one experiment on a single in-process Fabric rank (``observer``: a RunObserver hearing it; with the
    ``captured`` fixture active and no observer given, the one filling its box); return (record, final state)."""
    if observer is None and _CAPTURING:
        observer = capture_into(_CAPTURING[-1])
    from bench.assembly.experiment import make_fabric, run_experiment

    fabric = make_fabric(cfg)
    fabric.launch()
    record = run_experiment(cfg, fabric, observer)
    return record, load_final_state(cfg)


def stop_after(round_idx: int, pause_after_first: float = 0.0):
    """A RunObserver that stops the run (``Killed``) once round ``round_idx`` is done and checkpointed: the
    run's own hook (RunObserver.round_done), not a patched engine. ``pause_after_first``: seconds spent after
    round 0, inside the run (its wall time then shows in the next checkpoint)."""
    import time

    from bench.assembly.run_outputs import RunObserver

    class StopAfter(RunObserver):
        def round_done(self, r: int) -> None:
            if r == 0 and pause_after_first:
                time.sleep(pause_after_first)
            if r == round_idx:
                raise Killed

    return StopAfter()


def load_final_state(cfg):
    import torch

    from bench.assembly.records import record_path

    return torch.load(record_path(cfg.output_dir, cfg.experiment, cfg.run_name()).with_suffix(".pt"))


def cli_args(cfg) -> list[str]:
    """The `fedbench run` flags that reproduce cfg."""
    import dataclasses
    import json

    from bench.assembly.config import OPTION_GROUPS, TOP_LEVEL_KEYS

    args = []
    for group in OPTION_GROUPS:
        for key, value in dataclasses.asdict(getattr(cfg, group)).items():
            if value is None:
                continue
            args += [f"--{group}.{key}", json.dumps(value) if isinstance(value, (dict, list, bool)) else str(value)]
    for key in TOP_LEVEL_KEYS:
        value = getattr(cfg, key)
        if value is not None:
            args += [f"--{key}", json.dumps(value) if isinstance(value, bool) else str(value)]
    return args


def digits_run_argv(tmp_path: Path) -> list[str]:
    """`fedbench run` argv for a 2-round digits run on 4 clients, everything written under tmp_path
    (the bad-input tests add the option under test)."""
    return ["run", "--data.name", "digits", "--data.cache_dir", str(tmp_path / "cache"),
            "--method.backbone", "simple-cnn", "--fed.rounds", "2", "--partition.num_clients", "4",
            "--output_dir", str(tmp_path / "runs"), "--checkpoint_dir", str(tmp_path / "ckpt"),
            "--threads", "1", "--progress", "false"]


def run_subprocess(cfg, timeout: int = 1800) -> subprocess.CompletedProcess:
    """Run `fedbench run` in a fresh process (needed for --devices 2: Fabric relaunches the script). The
    timeout is a safety net, not a speed check: a 2-rank digits run (~12 s quiet) outlived 300 s under a load
    average of 15, which is why the suite's subprocess timeouts are 1800 s."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "bench.cli", "run", *cli_args(cfg)], check=False, cwd=REPO,
                          env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"fedbench run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


# A rank's own Python children (torch.compile's inductor starts `python -c` workers when its kernel cache is
# cold) inherit LOCAL_RANK too: the rank hides the marks folder from them, so only the ranks are counted
RANK_HOOK = """import os
if os.environ.get("LOCAL_RANK", "0") != "0" and os.environ.get("FEDBENCH_TEST_RANK_MARKS"):
    open(os.path.join(os.environ.pop("FEDBENCH_TEST_RANK_MARKS"), f"rank{os.environ['LOCAL_RANK']}-{os.getpid()}"), "w").close()
"""


def rank_marking_env(tmp_path: Path) -> tuple[dict, Path]:
    """(env, marks): a child started with env leaves a file in marks for every process that starts with
    LOCAL_RANK > 0 in its environment (a rank Fabric's launcher started; rank 0 gets LOCAL_RANK only after it
    started), through a sitecustomize on PYTHONPATH. Proves "no second rank was started" without a clock."""
    hook, marks = tmp_path / "rank_hook", tmp_path / "rank_marks"
    hook.mkdir()
    marks.mkdir()
    (hook / "sitecustomize.py").write_text(RANK_HOOK)
    return {**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{REPO}", "FEDBENCH_TEST_RANK_MARKS": str(marks)}, marks


def run_with_cpu(argv: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, float]:
    """subprocess.run(argv, **kwargs) and the CPU seconds (user + sys) it and its waited-for descendants used:
    unlike wall time, it does not grow with the load other processes put on the machine."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, check=False, capture_output=True, text=True, **kwargs)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return done, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def shared_tmp(tmp_path_factory) -> Path:
    """A folder this whole `make test` shares: both pytest-xdist workers' (one session each) see the same."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


class TwoRankRuns:
    """Every case of tests/rank_pairs.py run on 2 ranks (one shared launch) and its 1-rank side on demand."""

    def __init__(self, root: Path, records: dict[str, Path]):
        self.root, self.records = root, records

    def two(self, name: str) -> tuple[dict, dict]:
        """(record, final state) of case ``name`` on 2 ranks."""
        import torch

        from bench.assembly.records import load_record

        path = self.records[name]
        return load_record(path), torch.load(path.with_suffix(".pt"))

    def one_cfg(self, name: str, out: Path):
        """Case ``name`` on 1 rank, its outputs under ``out`` (its data shared with the 2-rank run)."""
        from rank_pairs import case_cfg

        return case_cfg(name, self.root, devices=1, out=out)


@pytest.fixture(scope="session")
def two_rank_runs(tmp_path_factory) -> TwoRankRuns:
    """The 2-rank side of every 1-vs-2-rank check, launched once per `make test` (the first worker to get
    here launches under a file lock; the other waits, then reads the records)."""
    import fcntl
    import json

    from rank_pairs import launch_two_ranks

    root = shared_tmp(tmp_path_factory) / "rank_pairs"
    root.mkdir(exist_ok=True)
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done, failed = root / "records.json", root / "failed.txt"
        if failed.exists():  # the other worker's launch failed: its error, not a second launch
            pytest.fail(failed.read_text(), pytrace=False)
        if not done.exists():
            try:
                records = launch_two_ranks(root)
            except BaseException as err:
                failed.write_text(f"the shared 2-rank launch failed: {err}")
                raise
            done.write_text(json.dumps({k: str(v) for k, v in records.items()}))
        records = {k: Path(v) for k, v in json.loads(done.read_text()).items()}
    return TwoRankRuns(root, records)


def max_state_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) if a[k].numel() else 0.0 for k in a)


class Killed(Exception):
    """Raised by stop_after's observer to simulate a run killed after a checkpoint."""


def kill_after(tiny_cfg, round_idx: int, **cfg) -> None:
    """Run ``tiny_cfg(**cfg)`` in this process, killed (``Killed``) right after it checkpoints ``round_idx``."""
    with pytest.raises(Killed):
        run_in_process(tiny_cfg(**cfg), stop_after(round_idx))


def kill_and_resume(tiny_cfg, base: dict, kill_after_round: int = 1):
    """Run ``base`` uninterrupted, then killed right after checkpointing round ``kill_after_round``
    and resumed; assert both end with identical state and history. Returns (resumed record, cfg)."""
    from bench.assembly.run_plan import checkpoint_plan
    from bench.engine.checkpoint import Checkpointer

    full_rec, full_state = run_in_process(tiny_cfg(**base, experiment="full"))
    kill_after(tiny_cfg, kill_after_round, **base, experiment="killed")
    cfg = tiny_cfg(**base, experiment="killed", resume=True)
    assert Checkpointer(checkpoint_plan(cfg), None).latest().name == f"round_{kill_after_round:05d}"
    resumed_rec, resumed_state = run_in_process(cfg)
    assert max_state_diff(full_state, resumed_state) == 0.0
    assert [h["metrics"] for h in resumed_rec["history"]] == [h["metrics"] for h in full_rec["history"]]
    return resumed_rec, cfg


# Test files of the end-to-end kind (each took >= 6 s, setup + calls, in a full `make test` with its
# --durations=0 report) mark themselves: `pytestmark = pytest.mark.slow` at the top of the file.
# `make test-fast` leaves them out: the rest (unit tests of the core, methods on tiny tensors, rendering)
# is the fast inner loop. A new test file is fast until it marks itself.
SLOW_FILE = re.compile(r"^pytestmark = .*\bpytest\.mark\.slow\b", re.MULTILINE)


def pytest_ignore_collect(collection_path: Path, config):
    """Under `-m "not slow ..."` (make test-fast) a file marked slow is not even imported: its tests would
    all be deselected, and importing the end-to-end files (and what they import) is a good part of the
    fast loop's time. None: pytest decides as usual."""
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if not re.search(r"\bnot slow\b", config.getoption("markexpr", "") or ""):
        return None
    return True if SLOW_FILE.search(collection_path.read_text()) else None


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session):
    """Collection imports every test module and with them torch and Lightning: the collector is off while it
    does, then what is alive is frozen, as in fedbench's own processes (bench/core/import_gc.py)."""
    with stack_import():
        yield


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Every pytest process (xdist's controller and each worker) ends without the interpreter's collection of
    its whole heap (torch's, Lightning's, every imported test module's objects), as fedbench's own commands do
    (bench/cli.py): the controller waited 3.1 s for its workers to exit and took 1.0 s more itself
    at the end of `make test-fast`; frozen, 0.4 s and 0.2 s. Nothing is left to clean up here: fixtures and
    temporary folders have finished, and files are closed as the process ends."""
    import gc

    gc.freeze()


DOC_PAGES = ("README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")))


def doc_section(heading: str) -> str:
    """The text under ``## <heading>`` in the README or the docs/ page that has it, to the next ``## ``."""
    for page in DOC_PAGES:
        text = (REPO / page).read_text()
        if f"\n## {heading}\n" in text:
            return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    raise AssertionError(f"no page of the README or docs/ has a section '## {heading}'")


def readme_module(heading: str, tmp_path: Path, name: str):
    """The first ```python block under ``## <heading>`` (README or docs/), saved as ``<name>.py`` and imported
    (what a reader who copies it into a file of their own gets)."""
    import importlib.util
    import re

    section = doc_section(heading)
    path = tmp_path / f"{name}.py"
    path.write_text(re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
