"""`gpu_bench --mix K` (issue 42, item 6): what `table --jobs K` does, measured. K runs at once on one device,
the i-th of row i, each printing its rounds as they end (``--stream``); all K are stopped together once each
has ``--rounds`` - 1 rounds inside the window where every run was in its rounds, each row is costed from those
rounds (bench.perf.gpu_bench.run_cost), and the table is projected as its runs started on K slots in ``table
--jobs``' own order (and, beside it, longest first by the measured costs).
``--reproject FILE`` projects a saved setting again from its rounds (docs/gpu/*.jsonl)."""
from __future__ import annotations

import json
import signal
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.perf.gpu_bench import (
    child_run,
    distinct_table_runs,
    jobs_order,
    run_cost,
    schedule_rounds,
    table_runs,
)
from bench.scheduling.table_plan import makespan


def loaded_rounds(runs: list[dict], stop: float) -> list[list[dict]]:
    """Per streamed run, its rounds after the first that ran while every run was in its rounds: started
    after the last run's round 0 ended and ended by ``stop`` (when the runs were stopped together)."""
    start = max(r["rounds"][0]["end"] for r in runs)
    return [[h for h in r["rounds"][1:] if h["end"] - h["round_seconds"] >= start and h["end"] <= stop]
            for r in runs]


class RoundStream:
    """``--stream``'s observer: a JSON line when the rounds start (training images, batch) and one per round
    (its durations, samples and end time), so the parent can stop K runs together mid-schedule."""

    def federation_built(self, federation) -> None:
        self.fed = federation
        print(json.dumps({"train": len(federation.data.labels), "test": len(federation.test.labels),
                          "batch": federation.plan.batch_size, "protocol": federation.protocol}), flush=True)

    def round_done(self, round_idx: int) -> None:
        h = self.fed.history[-1]
        print(json.dumps({"round": round_idx, "round_seconds": h["round_seconds"], "train_seconds": h["train_seconds"],
                          "eval_seconds": h.get("eval_seconds", 0.0), "samples_trained": h["samples_trained"],
                          "end": time.time()}), flush=True)


def streamed(args, rows: list[str], mode: str, k: int) -> tuple[list[dict], float]:
    """K streamed runs at once, the i-th of row i (rows cycled; ``child_run``), stopped together
    once each has ``--rounds`` - 1 rounds after the window's start (``loaded_rounds``); their streams (up to the
    stop) and the stop time. A run that fails stops the others, and its stderr is the error."""
    import contextlib
    import threading

    def read(proc, run: dict) -> None:
        for line in proc.stdout:
            if line.startswith("{"):
                item = json.loads(line)
                run["rounds"].append(item) if "round" in item else run.update(item)

    with contextlib.ExitStack() as stack:
        runs, procs, logs = [], [], []
        for i in range(k):
            row = rows[i % len(rows)]
            cmd, env = child_run(args, row, mode, k, stream=True)
            logs.append(stack.enter_context(tempfile.TemporaryFile("w+")))
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=logs[-1], text=True, env=env))
            runs.append({"row": row, "rounds": []})
        readers: list[threading.Thread] = []
        stack.callback(stop_then_join, procs, readers)
        for proc, run in zip(procs, runs):
            readers.append(threading.Thread(target=read, args=(proc, run), daemon=True))
            readers[-1].start()
        while True:
            time.sleep(0.2)
            for proc, run, log in zip(procs, runs, logs):
                if proc.poll() is not None and len(run["rounds"]) < run.get("table_rounds", 1 << 30):
                    log.seek(0)
                    raise SystemExit(f"gpu-bench: {run['row']} under {mode} failed:\n{log.read()[-1500:]}")
            if all(r["rounds"] for r in runs):
                start = max(r["rounds"][0]["end"] for r in runs)
                if all(sum(h["end"] - h["round_seconds"] >= start for h in r["rounds"][1:]) >= args.rounds - 1
                       or len(r["rounds"]) >= r["table_rounds"] for r in runs):
                    stop = time.time()
                    break
    for r in runs:  # what ended while the runs were being stopped ran under less load
        r["rounds"] = [h for h in r["rounds"] if h["end"] <= stop]
    return runs, stop


def stop_then_join(procs: list[subprocess.Popen], readers: list) -> None:
    """The end of ``streamed``: the runs still going stopped first (``stop_all``), then their stream readers
    joined, each ended by its run's end of output (joined first, each would wait its 5 s for a run still
    going: K x 5 s of a GPU's time after every mix)."""
    stop_all(procs)
    for reader in readers:
        reader.join(timeout=5)


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Ctrl-C to each run still going, so that its exit handlers remove what its libraries left in the temp
    folder; killed after 10 s."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def mix_setting(args, counts: Counter, rows: list[str], mode: str) -> dict:
    """``--mix K``: K runs at once, the i-th of row i (rows cycled); each row's cost from its rounds inside the
    window where all K ran (``loaded_rounds``), and the table projected by ``mix_projection``. A row of the
    table that did not run is costed at the mean of those that did (inferred)."""
    runs, stop = streamed(args, rows, mode, args.mix)
    return {**mix_projection(counts, runs, stop, mode, args.mix, jobs_order()), "sets": args.set}


def mix_projection(counts: Counter, runs: list[dict], stop: float, mode: str, k: int,
                   order: list[str] | None = None) -> dict:
    """A mix setting from K streamed runs stopped together at ``stop`` (``mix_setting``; ``--reproject``). The
    table's hours: its runs started in ``order`` (row labels; `table --jobs`'s own order) on K slots, and
    (``ideal_hours``) longest first by the measured costs."""
    per_row: dict[str, list[dict]] = {}
    for run, inside in zip(runs, loaded_rounds(runs, stop)):
        inside = inside or run["rounds"][1:] or run["rounds"]  # a run at its schedule's end before the window
        record = {"config": {"fed": {"batch_size": run["batch"]}}, "history": inside, "protocol": run["protocol"],
                  "splits": {"train": run["train"], "test": run["test"]}}
        per_row.setdefault(run["row"], []).append(run_cost(record, run["table_rounds"], tuple(run["full"]), inside))
    row_seconds = {row: sum(c["run_seconds"] for c in cs) / len(cs) for row, cs in per_row.items()}
    mean = sum(row_seconds.values()) / len(row_seconds)
    inferred = sorted(label for label in counts if label not in row_seconds)
    costs = [row_seconds.get(label, mean) for label, n in counts.items() for _ in range(n)]
    ideal = makespan(costs, k)
    seconds = makespan([row_seconds.get(label, mean) for label in order], k, in_order=True) if order else ideal
    steps = [c["ms_per_step"] for cs in per_row.values() for c in cs]
    return {"mode": mode, "jobs": k, "mix": True, "ms_per_step": [round(v, 2) for v in steps],
            "aggregate_steps_per_s": sum(1e3 / v for v in steps), "speedup": None, "table_hours": seconds / 3600,
            "ideal_hours": ideal / 3600, "inferred_rows": len(inferred),
            "rounds_used": {row: [c["rounds_used"] for c in cs] for row, cs in per_row.items()},
            "row_seconds": {row: round(v, 1) for row, v in row_seconds.items()},
            "serial_hours": sum(n * row_seconds.get(label, mean) for label, n in counts.items()) / 3600,
            "streams": runs, "stopped": stop}  # the raw rounds, to recompute from


def reproject(path: str, counts: Counter) -> list[dict]:
    """``--reproject FILE``: the mix settings of a --json file projected again from their saved streams (no
    device needed). Each stream's rounds to go are taken from the table's config (``schedule_rounds``: the streams
    of docs/gpu/2026-11-28-*.jsonl counted a central run's rounds before they were multiplied by its local epochs),
    and a stream saved without its protocol gets its row's (the method's and the table's)."""
    from lightning_modules.base import METHODS

    runs = distinct_table_runs()  # planned once: the configs and table --jobs' order come from it
    _, configs = table_runs(runs)
    order = jobs_order(runs)
    settings = []
    for line in Path(path).read_text().splitlines():
        saved = json.loads(line)
        if not saved.get("mix"):
            continue
        for run in saved["streams"]:
            cfg = configs[run["row"]]
            run["table_rounds"] = schedule_rounds(cfg)
            if "protocol" not in run:
                cls = METHODS.get(cfg.method.name)
                run["protocol"] = cfg.scored_protocol(cls.protocol, cls.runs_centrally)
        settings.append(mix_projection(counts, saved["streams"], saved["stopped"], saved["mode"], saved["jobs"], order))
    return settings
