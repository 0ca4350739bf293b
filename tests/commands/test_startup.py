"""Commands answer at once (issue 41): help, argument errors, `list` and `coverage` never import the training
stack; `run` and `table` say what they are about to do before importing it; the catalog they read equals the
real classes; a normal exit skips the interpreter's final garbage collection yet keeps what it wrote.

Load-independent checks only: which modules a command imported (``sys.modules``, in a subprocess), the order
of a line and an import, and CPU-time ratios (bench/perf/perf_startup.py). The wall-clock limits of the
issue's table are `make bench-startup`'s, on a quiet machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO

from bench.commands import listing
from bench.tables import catalog
from bench.tables.catalog_data import CATALOG

pytestmark = pytest.mark.slow  # end-to-end (>= 6 s): make test-fast leaves this file out

HEAVY = ("torch", "lightning", "torchvision", "torchmetrics", "transformers", "open_clip", "numpy", "scipy",
         "matplotlib", "wandb", "sklearn")
QUICK = "configs/experiments/quick.yaml"
TABLE = "configs/tables/table2_fashion-mnist.yaml"
# (argv, exit status, a piece of its stdout or stderr that shows it did its job)
COMMANDS = [
    (["--help"], 0, "fedbench list"),
    (["run", "--help"], 0, "--fed.rounds"),
    (["table", "--help"], 0, "--render-only"),
    (["regression", "--help"], 0, "--update"),
    (["coverage", "--help"], 0, "--uncovered-only"),
    (["dashboard", "--help"], 0, "--config"),
    (["bench", "--help"], 0, "--threads"),
    (["list", "--help"], 0, "--data-home"),
    (["list"], 0, "Methods (43; --method.name NAME)"),
    (["coverage", "--paper", "fedbm"], 0, "fedbm"),
    (["run", "--fed.roundz", "3"], 2, "--fed.rounds"),
    (["run", "--fed.rounds", "many"], 2, "fed.rounds"),
    (["run", "--method.name", "fedavgg"], 2, "Unknown method 'fedavgg'. Did you mean 'fedavg'"),
    (["run", "--data.name", "kvasirr"], 2, "Unknown dataset 'kvasirr'. Did you mean 'kvasir'"),
    (["run", "--partition.scheme", "dirichlett"], 2, "Unknown partition scheme 'dirichlett'"),
    (["table", "--config", "configs/tables/nope.yaml"], 2, "not found"),
    (["table", "--config", TABLE, "--jobz", "2"], 2, "--jobs"),
    (["nope"], 2, "unknown command"),
]

RUN_COMMANDS = textwrap.dedent("""
    import contextlib, io, json, sys
    from bench.cli import main
    out = []
    for argv in json.loads(sys.argv[1]):
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main(argv)
            except SystemExit as stop:
                code = stop.code
        out.append([code, stdout.getvalue() + stderr.getvalue()])
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in json.loads(sys.argv[2]))
    print(json.dumps({"results": out, "heavy": heavy}))
""")


def python(code: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_help_errors_list_and_coverage_import_no_training_stack():
    proc = python(RUN_COMMANDS, json.dumps([argv for argv, _, _ in COMMANDS]), json.dumps(HEAVY))
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    for (argv, status, shows), (code, text) in zip(COMMANDS, seen["results"], strict=True):
        assert code == status and shows in text, (argv, code, text[-2000:])
    assert seen["heavy"] == [], f"imported by help, errors, list or coverage: {seen['heavy'][:10]}"


def test_an_unknown_name_is_the_registry_error_word_for_word():
    from lightning_modules.base import METHODS

    proc = python(RUN_COMMANDS, json.dumps([["run", "--method.name", "fedavgg"]]), json.dumps(HEAVY))
    code, text = json.loads(proc.stdout.splitlines()[-1])["results"][0]
    try:
        METHODS.get("fedavgg")
    except KeyError as err:
        expected = f"fedbench: error: {err}"
    assert code == 2 and text.strip() == expected


STOP_AT_TORCH = textwrap.dedent("""
    import sys
    class StopAtTorch:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "lightning"):
                print(f"IMPORTING {name}", flush=True)
                raise SystemExit(0)
    sys.meta_path.insert(0, StopAtTorch())
    from bench.cli import main
    main(sys.argv[1:])
""")


def test_run_and_table_say_what_they_do_before_importing_torch(tmp_path):
    run = python(STOP_AT_TORCH, "run", "--config", QUICK, "--output-dir", str(tmp_path))
    lines = run.stdout.splitlines()
    assert lines[0] == (f"fedbench run: fedavg_digits_dir0.5_c4_s0 (3 rounds, 4 clients, devices auto); "
                        f"record under {tmp_path}"), run.stdout + run.stderr
    assert lines[1].startswith("IMPORTING ") and list(tmp_path.iterdir()) == []
    from bench.scheduling.table_runner import distinct_runs, load_table_config, plan_runs

    planned = len(distinct_runs(plan_runs(load_table_config(TABLE))))
    table = python(STOP_AT_TORCH, "table", "--config", TABLE, "--output-dir", str(tmp_path))
    lines = table.stdout.splitlines()
    assert lines[0] == (f"table2 fashion-mnist: {planned} runs planned from {TABLE}; checking every run before any "
                        "starts"), table.stdout + table.stderr
    assert lines[1].startswith("IMPORTING ")


def test_the_catalog_is_what_the_real_classes_say():
    built = catalog.build()  # imports every method, dataset and scheme
    assert built == CATALOG, ("bench/tables/catalog_data.py is out of date: run "
                              "`python -m bench.tables.catalog --write` (make catalog)")
    assert catalog.load() is CATALOG  # the sources are the ones it was written from: no import needed
    home = Path("/nonexistent-data-home")
    assert listing.listing(home, built) == listing.listing(home, CATALOG)
    fedprox = CATALOG["methods"]["fedprox"]
    assert fedprox["options"]["mu"] == 0.001 and fedprox["protocol"] == "global" and not fedprox["runs_centrally"]
    assert CATALOG["methods"]["central"]["runs_centrally"] and CATALOG["datasets"]["kvasir"]["classes"] == 8


def test_an_edited_source_makes_the_catalog_be_read_from_the_classes(tmp_path):
    for package in catalog.SOURCES:
        for path in (REPO / package).rglob("*.py"):
            target = tmp_path / path.relative_to(REPO)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    assert catalog.source_digest(tmp_path) == CATALOG["digest"]
    edited = tmp_path / "lightning_modules" / "fedprox.py"
    edited.write_text(edited.read_text().replace("FedProx (Li et al., 2020)", "FedProx (Li et al., 2018)"))
    assert catalog.source_digest(tmp_path) != CATALOG["digest"]


EXIT_SCRIPT = textwrap.dedent("""
    import os, sys
    import bench.cli as cli

    class Cycle:
        def __del__(self):
            os.write(2, b"collected at exit\\n")

    def fake_main():
        c = Cycle(); c.me = c  # garbage only the cyclic collector can free
        del c
        with open(sys.argv[1], "w") as fh:
            fh.write("record\\n")
        sys.stdout.write("the last line, not flushed")
        return int(sys.argv[2])

    cli.main = fake_main
    cli.console_main()
""")


def test_a_normal_exit_skips_the_final_collection_and_keeps_its_output(tmp_path):
    import gc

    gc.collect()
    for status in (0, 2):
        out = tmp_path / f"record{status}.txt"
        proc = python(f"import gc; gc.disable()\n{EXIT_SCRIPT}", str(out), str(status))
        assert proc.returncode == status
        assert proc.stdout == "the last line, not flushed"
        assert out.read_text() == "record\n"
        assert "collected at exit" not in proc.stderr, "the interpreter's final collection ran"


# `python -m bench.cli` with each collector pass written to stderr: its generation, whether torch's import had
# begun, and how many objects were frozen (bench/core/import_gc.py freezes once the stack is imported)
GC_PASSES = textwrap.dedent("""
    import gc, runpy, sys
    def note(phase, info):
        if phase == "start":
            torch = "torch" if "torch" in sys.modules else "-"
            sys.stderr.write(f"gc pass: {info['generation']} {torch} {gc.get_freeze_count()}\\n")
    gc.callbacks.append(note)
    runpy.run_module("bench.cli", run_name="__main__", alter_sys=True)
""")


def test_a_real_run_exits_without_the_collection_with_its_record_and_logs_whole(tmp_path):
    """The gc.freeze exit of a real 1-round run: its record, CSV log and TensorBoard events are complete (the
    loggers were finalized and the files closed before the exit). Its collector made no pass while it imported
    torch, Lightning and the stack (bench/core/import_gc.py). The run imports neither torchvision nor
    transformers, nor scipy, regex or matplotlib's pyplot: Lightning's import of torchmetrics skips its image,
    text and audio extras and its plotting (bench/core/compat.py skip_unused_imports), which a simple-CNN
    run never uses (the partition plot's own matplotlib import uses no pyplot).

    The digits are decoded beforehand into a cache of the test's own: a first decode imports sklearn, and
    sklearn imports scipy (legitimately, once per cache); whether the shared cache was warm depended on which
    tests ran before, so the import check failed on a fresh clone only (CI, 2026-11-29)."""
    from datamodules.digits import Digits

    cache = tmp_path / "cache"
    Digits(cache_dir=str(cache)).setup()  # the run's data (quick.yaml: digits at their own 8 px), decoded once
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", GC_PASSES, "run", "--config", QUICK, "--fed.rounds", "1",
                           "--devices", "1", "--tensorboard", "--progress", "false", "--output-dir", str(tmp_path),
                           "--data.cache_dir", str(cache)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, *_, last = proc.stdout.splitlines()
    assert first.startswith("fedbench run: fedavg_digits_dir0.5_c4_s0 (1 round, 4 clients, devices 1)")
    record = json.loads((tmp_path / "quick" / "fedavg_digits_dir0.5_c4_s0.json").read_text())
    assert last == f"record: {tmp_path / 'quick' / 'fedavg_digits_dir0.5_c4_s0.json'} (new)"
    accuracy = record["final"]["test/accuracy"]
    assert len(record["history"]) == 1 and 10 < accuracy <= 100
    csv = (tmp_path / "quick" / "csv" / "fedavg_digits_dir0.5_c4_s0" / "version_0" / "metrics.csv").read_text()
    header, row = csv.splitlines()
    assert float(row.split(",")[header.split(",").index("test/accuracy")]) == accuracy
    events = next((tmp_path / "quick" / "tensorboard").rglob("events.out.tfevents.*")).read_bytes()
    assert all(tag.encode() in events for tag in ("val/accuracy", "test/accuracy", "train/loss"))
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert {"torch", "lightning", "torchmetrics.functional"} <= imported  # the profile is the run's own imports
    skipped = {"torchvision", "transformers", "scipy", "regex", "matplotlib.pyplot"}
    assert not imported & skipped, sorted(imported & skipped)
    assert "sklearn" not in imported  # the warm cache was used: the check above is about the run's own imports
    # the collector made no pass while the stack imported (bench/core/import_gc.py; before, 6 full passes,
    # 0.69 s): none between torch's import starting and the freeze after the stack's
    passes = [line.split()[2:] for line in proc.stderr.splitlines() if line.startswith("gc pass:")]
    assert passes, "the probe saw no collector pass at all"  # the young passes before torch, at least
    assert not [p for p in passes if p[1] == "torch" and p[2] == "0"], passes


def test_startup_cpu_is_a_fraction_of_importing_torch():
    """bench/perf/perf_startup.py's cheap mode: each command's CPU time (user+sys) against one
    `import torch` in the same conditions; over its ratio, the command exits 1."""
    proc = subprocess.run([sys.executable, "-m", "bench.perf.perf_startup", "--cheap", "--json"], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=900,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(proc.stdout)["commands"]
    assert {r["command"] for r in rows} >= {"fedbench --help", "fedbench run --help", "fedbench list",
                                           "fedbench coverage", "a typo in a run option"}
    for r in rows:
        assert r["cpu_ratio"] <= r["max_cpu_ratio"], r
