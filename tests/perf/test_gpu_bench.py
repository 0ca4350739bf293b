"""`make gpu-bench`'s arithmetic (issue 42, item 6): a row's projected cost from its record's rounds, and the
table's projected time from the rows' costs and the speedup of K runs at once. Its CPU run is in
tests/perf/test_gpu_paths.py."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from bench.perf.gpu_bench import project, run_cost
from bench.perf.gpu_mix import loaded_rounds, mix_projection, reproject
from bench.scheduling.table_plan import makespan

DOCS = Path(__file__).resolve().parents[2] / "docs" / "gpu"


def rnd(train: float, evaluation: float, total: float, samples: int = 2240) -> dict:
    return {"train_seconds": train, "eval_seconds": evaluation, "round_seconds": total, "samples_trained": samples}


def test_a_rows_cost_comes_from_the_rounds_after_the_first_scaled_to_the_full_data():
    """Training scales with the training images (5,600 / 2,800), evaluation with the test images (1,600 / 400);
    the rest of the round (aggregation, the server step) is taken as measured."""
    record = {"config": {"fed": {"batch_size": 8}}, "splits": {"train": 2800, "test": 400},
              "history": [rnd(9.0, 1.0, 10.5, 3100), rnd(2.8, 0.1, 3.0, 2240), rnd(2.6, 0.1, 3.2, 1960)]}
    cost = run_cost(record, rounds=200, full=(5600, 1600))
    assert cost["ms_per_step"] == pytest.approx(1e3 * 5.4 / 525)  # (2.8 + 2.6) s over (2240 + 1960) / 8 steps
    # per round: 2.8 x 2 + 0.1 x 4 + 0.1 rest, then 2.6 x 2 + 0.1 x 4 + 0.5 rest (FedBM's generator, say)
    assert cost["run_seconds"] == pytest.approx(200 * (6.1 + 6.1) / 2) and cost["rounds_used"] == 2


def test_under_a_per_client_protocol_the_rest_of_the_round_scales_with_the_data():
    """Per-client rows evaluate each client (FedBABU also fine-tunes it) inside the round, outside both timings."""
    history = [rnd(2.0, 0.0, 2.0), rnd(2.0, 0.0, 5.0)]
    record = {"config": {"fed": {"batch_size": 8}}, "splits": {"train": 1400, "test": 400}, "history": history}
    assert run_cost(record, 10, (5600, 1600))["run_seconds"] == pytest.approx(10 * (2.0 * 4 + 3.0))
    per_client = {**record, "protocol": "per_client"}
    assert run_cost(per_client, 10, (5600, 1600))["run_seconds"] == pytest.approx(10 * (2.0 * 4 + 3.0 * 4))
    assert run_cost(per_client, 10, (5600, 1600), steady=history)["rounds_used"] == 2  # given rounds: all used


def test_the_longest_runs_first_on_k_slots_end_when_the_busiest_slot_ends():
    assert makespan([3, 5, 3, 4, 3], 2) == 10  # 5 | 4, then 3 on the 4 (7), 3 on the 5 (8), 3 on the 7 (10)
    assert makespan([3, 5, 3, 4, 3], 1) == 18 and makespan([3, 5, 3, 4, 3], 8) == 5


def stream(row: str, ends: list[float], seconds: float = 2.0, protocol: str = "global") -> dict:
    return {"row": row, "table_rounds": 200, "full": [5600, 1600], "train": 1400, "test": 400, "batch": 8,
            "protocol": protocol, "rounds": [{"round": i, "end": e, **rnd(seconds * 0.9, 0.0, seconds, 1400)}
                                             for i, e in enumerate(ends)]}


def test_a_mix_uses_only_the_rounds_run_while_every_run_was_in_its_rounds():
    """The window opens when the last run ends its round 0 (another still loading its data is no load) and
    closes when the runs were stopped together."""
    fast = stream("FedAvg", [10, 12, 14, 16, 18, 20])
    slow = stream("MOON", [13, 17, 21, 25], seconds=4.0)
    inside = loaded_rounds([fast, slow], stop=25.5)
    assert [h["round"] for h in inside[0]] == [3, 4, 5]  # round 2 started at 12, before MOON's round 0 ended (13)
    assert [h["round"] for h in inside[1]] == [1, 2, 3]
    setting = mix_projection(Counter({"FedAvg": 6, "MOON": 6, "Central": 3}), [fast, slow], 25.5, "tf32", 2)
    fedavg, moon = 200 * (1.8 * 4 + 0.2), 200 * (3.6 * 4 + 0.4)  # training x 4, the rest as measured
    assert setting["row_seconds"] == {"FedAvg": pytest.approx(fedavg, abs=0.05), "MOON": pytest.approx(moon, abs=0.05)}
    assert setting["inferred_rows"] == 1 and setting["rounds_used"] == {"FedAvg": [3], "MOON": [3]}
    mean = (fedavg + moon) / 2
    assert setting["table_hours"] == pytest.approx(makespan([moon] * 6 + [mean] * 3 + [fedavg] * 6, 2) / 3600)
    assert setting["serial_hours"] == pytest.approx((6 * fedavg + 6 * moon + 3 * mean) / 3600)
    assert setting["aggregate_steps_per_s"] == pytest.approx(1e3 / (1e3 * 1.8 / 175) + 1e3 / (1e3 * 3.6 / 175))


def test_the_h200_mix_of_2026_11_28_projects_as_docs_gpu_md_says():
    """docs/gpu.md's table2_kvasir hours for 16 of the table's rows at once (H200, CUDA MPS) come from the
    rounds saved in docs/gpu/*.jsonl by `gpu_bench --reproject`. The streams were saved before they carried
    their protocol and counted Central's 400 one-epoch rounds as 200: both come from the table here."""
    counts = Counter(
        {"Central": 3, "FedAvg": 6, "FedProx": 6, "FedDyn": 6, "Scaffold": 6, "MOON": 6, "FedRep (per-client)": 6,
         "FedRoD (per-client)": 6, "FedBABU (per-client)": 6, "FedNH": 6, "FedProto (per-client)": 6,
         "FedRep (FedETF eval)": 6, "FedRoD (generic head)": 6, "FedProto (client models)": 6, "FedETF": 6,
         "FedLC": 6, "FedRS": 6, "FedCB": 6, "FedBM": 6})
    tf32, = reproject(str(DOCS / "2026-11-28-mix16-tf32.jsonl"), counts)
    strict, = reproject(str(DOCS / "2026-11-28-mix16-strict.jsonl"), counts)
    assert (tf32["jobs"], tf32["inferred_rows"], strict["inferred_rows"]) == (16, 3, 3)
    assert round(tf32["table_hours"], 2) == 8.14 and round(strict["table_hours"], 2) == 11.82  # table --jobs' order
    assert round(tf32["ideal_hours"], 2) == 7.88 and round(strict["ideal_hours"], 2) == 11.56  # longest first
    assert round(tf32["serial_hours"], 1) == 124.4 and round(strict["serial_hours"], 1) == 181.2
    assert tf32["row_seconds"]["FedAvg"] == 3463.4 and tf32["row_seconds"]["FedBABU (per-client)"] == 5531.7
    assert tf32["row_seconds"]["Central"] == 5760.4  # 400 rounds of 1 epoch
    assert round(tf32["aggregate_steps_per_s"], 1) == 688.6 and round(strict["aggregate_steps_per_s"], 1) == 491.1


def test_a_central_run_goes_through_rounds_times_local_epochs_rounds_and_the_jobs_order_is_table_jobs():
    from bench.perf.gpu_bench import jobs_order, schedule_rounds, table_runs

    counts, configs = table_runs()
    assert schedule_rounds(configs["Central"]) == 400 and schedule_rounds(configs["FedAvg"]) == 200
    order = jobs_order()
    assert Counter(order) == counts and order[:6] == ["FedBM"] * 6  # (8 + 32) / 8 of FedAvg's work: first
    assert makespan([2, 2, 4], 2, in_order=True) == 6 and makespan([2, 2, 4], 2) == 4  # the long run last: 2 + 4


def test_the_table_projects_every_run_at_its_rows_cost_or_the_first_rows_and_divides_by_the_speedup():
    counts = Counter({"FedAvg": 6, "FedBM": 6, "MOON": 6, "Central": 3})
    seconds, inferred = project(counts, {"FedAvg": 1100.0, "FedBM": 1800.0}, "FedAvg", speedup=4.0)
    assert seconds == pytest.approx((6 * 1100 + 6 * 1800 + 6 * 1100 + 3 * 1100) / 4.0)
    assert inferred == ["Central", "MOON"]


def test_a_failed_mode_is_reported_and_the_others_still_measure_and_land_in_the_json(tmp_path, monkeypatch, capsys):
    """gpu-bench on a GPU machine runs for minutes under a device budget: each measured setting is appended to
    --json as it comes (a killed bench keeps what it measured), and a mode whose runs fail is reported in the
    table (exit 1) without losing the other modes'."""
    import json

    from bench.perf import gpu_bench

    def measure(args, row, mode, k):
        if mode == "fast":
            raise SystemExit(f"gpu-bench: {row} under {mode} failed:\nCUDA error")
        return [{"row": row, "mode": mode, "ms_per_step": 10.0 * (1 + 0.25 * (k > 1)), "run_seconds": 1000.0}] * k

    monkeypatch.setattr(gpu_bench, "measure", measure)
    monkeypatch.setattr(gpu_bench, "write_kvasir", lambda root, per_class: root)
    out = tmp_path / "bench.jsonl"
    assert gpu_bench.main(["--device", "cpu", "--modes", "fast,tf32", "--jobs", "1,4", "--json", str(out)]) == 1
    printed = capsys.readouterr()
    settings = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(s["mode"], s["jobs"]) for s in settings] == [("tf32", 1), ("tf32", 4)]
    assert settings[1]["aggregate_steps_per_s"] == pytest.approx(4 * 80.0) and settings[1]["speedup"] == pytest.approx(3.2)
    assert settings[1]["table_hours"] == pytest.approx(111 * 1000.0 / 3.2 / 3600)
    assert "fast     FAILED: gpu-bench: FedAvg under fast failed:" in printed.out
    assert "FedAvg under tf32, 4 at once: 320.0 steps/s" in printed.err


def test_a_mix_whose_run_fails_reports_its_error_and_stops_the_others_at_once(tmp_path, monkeypatch):
    """One of K streamed runs fails: the others (here one that would run a minute) are killed, and the
    failure's own stderr is the error."""
    import argparse
    import signal
    import subprocess
    import sys
    import threading
    import time

    from bench.perf import gpu_mix

    child = tmp_path / "child.sh"
    child.write_text("#!/bin/sh\ncase \"$*\" in *MOON*) echo '{\"row\": \"MOON\"}'; exec sleep 60;; "
                     "*) echo 'CUDA error: out of memory' >&2; exit 1;; esac\n")
    child.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(child))
    started_procs = []

    class Recorded(subprocess.Popen):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            started_procs.append(self)

    monkeypatch.setattr(subprocess, "Popen", Recorded)
    joined_while_running = []
    real_join = threading.Thread.join

    def join(thread, timeout=None):  # a reader joined while its run still goes would wait out its timeout
        joined_while_running.extend(p for p in started_procs if p.poll() is None)
        return real_join(thread, timeout)

    monkeypatch.setattr(threading.Thread, "join", join)
    args = argparse.Namespace(root=str(tmp_path), size=16, device="cpu", max_test=None, tiny=False, rounds=3, set=[])
    started = time.perf_counter()
    with pytest.raises(SystemExit, match="FedAvg under tf32 failed:\nCUDA error: out of memory"):
        gpu_mix.streamed(args, ["MOON", "FedAvg"], "tf32", 2)
    # the running one was ended by its Ctrl-C (not waited for, not killed after the grace)
    assert [p.returncode for p in started_procs] == [-signal.SIGINT, 1]
    assert joined_while_running == []  # the readers were joined after the runs were stopped
    assert time.perf_counter() - started < 8  # not the 60 s run, nor the 10 s wait for one that ignores Ctrl-C


@pytest.mark.parametrize("argv, says", [(["--modes", "tf32,bogus"], "no gpu_math mode ['bogus']"),
                                        (["--rows", "FedAvg,FedAvgg"], "no row ['FedAvgg']"),
                                        (["--mix", "-1"], "--mix takes K >= 1"),
                                        (["--set", "compil=true"], "--set compil: unknown option. Did you mean compile?"),
                                        (["--set", "method.args.mu=1"], "--set method.args.mu: the rows' own options"),
                                        (["--reproject", "/nonexistent.jsonl"], "cannot project /nonexistent.jsonl")])
def test_gpu_bench_refuses_bad_input_before_it_writes_or_runs_anything(argv, says, monkeypatch, capsys):
    from bench.perf import gpu_bench

    monkeypatch.setattr(gpu_bench, "write_kvasir", lambda *a: pytest.fail("wrote images"))
    assert gpu_bench.main(["--device", "cpu", *argv]) == 2
    assert says in capsys.readouterr().err


def test_gpu_bench_set_gives_every_measured_run_a_run_option_as_table_set_reads_it():
    """`--set compile=true` (what a GPU session measures next: the runs are host-bound) reaches each child run's
    config typed as `fedbench table --set` types it, and is passed on to the children's command lines."""
    import argparse

    from bench.assembly.config import RunConfig
    from bench.perf.gpu_bench import apply_option_sets, checked_option_sets, child_run

    cfg = RunConfig()
    apply_option_sets(cfg, checked_option_sets(["compile=true", "fed.rounds=3", "channels_last=yes"]))
    assert (cfg.compile, cfg.fed.rounds, cfg.channels_last) == (True, 3, True)
    args = argparse.Namespace(root="/data", size=16, device="cpu", max_test=None, tiny=False, rounds=3,
                              set=["compile=true", "fed.rounds=3"])
    for stream in (False, True):  # the alone/K children and the mix's alike
        cmd, _ = child_run(args, "FedAvg", "tf32", 2, stream=stream)
        sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
        assert sets == ["compile=true", "fed.rounds=3"] and ("--stream" in cmd) is stream
