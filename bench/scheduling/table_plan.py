"""`fedbench table --dry-run` (and ``--print_config``): the table's plan without running anything: each run
(row, column, seed or fold), whether a record of it is up to date here (else why it would run), and an
estimated time from the wall time of the records found. Nothing is run, launched or written.

The estimate of a run that would run is its own earlier record's wall time (a record made under another
config or code), else the median of the records of its method (name, options, protocol) in the table's record
folders here (every seed and column, not only the ones chosen with --seeds / --rows), else the median of every
record there; without any record of the table the time is unknown and the plan says so.
"""
from __future__ import annotations

import heapq
import json
import statistics
import warnings
from dataclasses import dataclass

from bench.assembly.records import RecordError, bare_record_path, find_record, load_record, run_record_path


@dataclass
class PlanLine:
    run: object  # a table_runner.PlannedRun
    status: str  # "up to date" or why it would run ("no record", "config changed", "--force", ...)
    seconds: float | None  # wall time of its record (up to date or stale), None without one

    @property
    def runs(self) -> bool:
        return self.status != "up to date"


def past_seconds(cfg) -> float | None:
    """Wall seconds of the latest record of the run's name (its own, or one made under other options)."""
    for path in (find_record(cfg), bare_record_path(cfg)):
        if path is not None and path.exists():
            try:
                seconds = load_record(path).get("wall_seconds")
            except RecordError:
                continue
            if isinstance(seconds, int | float):
                return float(seconds)
    return None


def plan_lines(runs: list, force: bool) -> list[PlanLine]:
    """Each distinct run with its record status (as ``execute`` would decide it) and its past wall time."""
    from bench.scheduling.table_runner import record_status

    lines = []
    for r in runs:
        with warnings.catch_warnings():  # an unreadable record: its status says so (nothing is rerun here)
            warnings.simplefilter("ignore")
            status = "--force" if force else record_status(r.cfg)[1]
        lines.append(PlanLine(r, status, past_seconds(r.cfg)))
    return lines


def method_key(config: dict) -> str:
    """What makes records of one row comparable in time: the method, its options and its protocol."""
    method = config.get("method") or {}
    return json.dumps([method.get("name"), method.get("args"), (config.get("fed") or {}).get("protocol")],
                      sort_keys=True, default=str)


def recorded_seconds(runs: list) -> dict[str, list[float]]:
    """Wall seconds of every record in the runs' record folders, by ``method_key`` of its config."""
    out: dict[str, list[float]] = {}
    seen = set()
    for folder in dict.fromkeys(run_record_path(r.cfg).parent for r in runs):
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            if path.resolve() in seen:  # <run name>.json may link to a record of the folder
                continue
            seen.add(path.resolve())
            try:
                rec = load_record(path)
            except (RecordError, OSError):
                continue
            if isinstance(rec.get("wall_seconds"), int | float) and isinstance(rec.get("config"), dict):
                out.setdefault(method_key(rec["config"]), []).append(float(rec["wall_seconds"]))
    return out


def estimate(lines: list[PlanLine], recorded: dict[str, list[float]]) -> tuple[list[float], int]:
    """(estimated seconds of each run that would run and has a basis, how many have no basis for one)."""
    every = [s for seconds in recorded.values() for s in seconds]
    known, unknown = [], 0
    for line in (x for x in lines if x.runs):
        same = recorded.get(method_key(line.run.cfg.to_dict()))
        basis = line.seconds if line.seconds is not None else (
            statistics.median(same) if same else statistics.median(every) if every else None)
        if basis is None:
            unknown += 1
        else:
            known.append(basis)
    return known, unknown


def makespan(seconds: list[float], jobs: int, in_order: bool = False) -> float:
    """The wall time of runs taking ``seconds`` on ``jobs`` workers that each take the longest run left
    (as `table --jobs` schedules them), every run at its own speed: never less than the longest run.
    ``in_order``: the workers take the runs in the given order instead (`table --jobs`' own order is by its
    estimate of a run's work, which measured seconds need not follow: bench/perf/gpu_mix.py)."""
    workers = [0.0] * max(1, min(jobs, len(seconds)))
    for s in (seconds if in_order else sorted(seconds, reverse=True)):
        heapq.heapreplace(workers, workers[0] + s)
    return max(workers)


def duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def estimate_line(lines: list[PlanLine], jobs: int) -> str:
    todo = sum(line.runs for line in lines)
    if not todo:
        return "estimated time: none (every run has an up-to-date record; the table is only rendered)"
    recorded = recorded_seconds([line.run for line in lines])
    known, unknown = estimate(lines, recorded)
    seconds = sum(known)
    if unknown == todo:
        return ("estimated time: unknown (no record of this table's runs here to time them by; each record keeps "
                "its wall time, so the plan estimates once one run has one)")
    text = f"estimated time: {duration(seconds)} for {todo - unknown} of the {todo} runs one after another"
    text += f" ({unknown} without any record of the table to time them by)" if unknown else ""
    if jobs > 1:
        text += (f"; with --jobs {jobs} at least {duration(makespan(known, jobs))} (the longest runs first, each "
                 "as fast as alone: more when the jobs share cores)")
    timed = sum(map(len, recorded.values()))
    return text + f" (from the wall time of {timed} record{'s' if timed != 1 else ''} of this table here)"


def plan_text(runs: list, title: str, force: bool, jobs: int, render_only: bool) -> str:
    """The plan as printed: a header, one line per run, the estimate, and what was not done."""
    lines = plan_lines(runs, force)
    todo = [line for line in lines if line.runs]
    label_width = max(len(line.run.label) for line in lines)
    column_width = max(len(line.run.columns[0]) for line in lines)
    out = [f"{title}: {len(lines)} runs, {len(lines) - len(todo)} up to date, "
           + (f"{len(todo)} without an up-to-date record (the table renders them as missing)" if render_only
              else f"{len(todo)} to run")]
    for line in lines:
        r = line.run
        repeat = f"seed {r.seed}" if r.fold is None else f"fold {r.fold}"
        status = line.status if render_only or not line.runs else f"run: {line.status}"
        out.append(f"  {r.label.ljust(label_width)}  {r.columns[0].ljust(column_width)}  {repeat:8}  {status}")
    if not render_only:
        out.append(estimate_line(lines, jobs))
    out.append("dry run: nothing was run or written (run the same command without --dry-run / --print_config).")
    return "\n".join(out)
