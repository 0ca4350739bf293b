"""`fedbench table --jobs K` on GPUs without a GPU (issue 42, item 1; bench/scheduling/table_jobs.py): K workers
spread round-robin over G faked GPUs, the runs started longest first, the GPU memory refusal before the pool
starts and the wait before a run (torch.cuda's memory queries faked), and the CUDA MPS note. That K workers
give the records of one process is tests/scheduling/test_table_jobs.py's (end to end, slow)."""
from __future__ import annotations

import multiprocessing
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from bench.assembly.config import RunConfig
from bench.core.errors import FedbenchError
from bench.scheduling import table_jobs, table_runner
from bench.scheduling.table_runner import PlannedRun

GIB = 1024 ** 3
TABLE = "configs/tables/table2_fashion-mnist.yaml"


def test_more_workers_than_gpus_share_them_round_robin():
    """K=5 workers on G=2 GPUs: worker i gets GPU i mod 2 as its CUDA_VISIBLE_DEVICES, 3 on the first, 2 on the
    second; K <= G gives each its own; on a CPU (no GPU) or with one job nothing is set."""
    plan = table_jobs.job_gpus(5, ["4", "7"])
    assert plan == ["4", "7", "4", "7", "4"] and Counter(plan) == {"4": 3, "7": 2}
    slot = multiprocessing.Value("i", 0)  # as the pool's workers share it, each claiming one as it starts
    assert [table_jobs.claim_gpu(plan, slot) for _ in range(5)] == ["4", "7", "4", "7", "4"]
    assert table_jobs.job_gpus(2, ["0", "1", "2"]) == ["0", "1"]
    assert table_jobs.job_gpus(8, ["0"]) == ["0"] * 8
    assert table_jobs.job_gpus(3, []) == [] and table_jobs.job_gpus(1, ["3"]) == []
    assert table_jobs.claim_gpu([], slot) is None
    with pytest.raises(FedbenchError, match="--jobs must be >= 1, got 0"):
        table_jobs.job_gpus(0, ["0"])


def planned(label: str, method: str, rounds: int = 2, local_epochs: int = 1, batch: int = 8, **args) -> PlannedRun:
    cfg = RunConfig()
    cfg.partition.num_clients, cfg.fed.sample_ratio = 4, 0.5  # 2 of 4 clients a round: half the samples
    cfg.fed.rounds, cfg.fed.local_epochs, cfg.fed.batch_size = rounds, local_epochs, batch
    cfg.method.name, cfg.method.args = method, args
    return PlannedRun(label, 0.5, 0, cfg, ["beta0.5"])


def test_runs_start_longest_first_ties_in_plan_order():
    runs = [planned("FedAvg", "fedavg"), planned("FedProx", "fedprox"), planned("Central", "central"),
            planned("MOON", "moon"), planned("FedBM g24", "fedbm", g_batch=24), planned("FedBM", "fedbm"),
            planned("FedAvg long", "fedavg", rounds=4, local_epochs=2)]
    # rounds x local epochs x share of the samples a round trains x method weight
    costs = {r.label: table_jobs.run_cost(r.cfg) for r in runs}
    assert costs == pytest.approx({"FedAvg": 1.0, "FedProx": 1.0, "Central": 2.0, "MOON": 5 / 3,
                                   "FedBM g24": 4.0,  # batch 8 + 24 synthetic samples per step
                                   "FedBM": 3.0,  # FedBM's default g_batch, 16
                                   "FedAvg long": 4.0})
    order = [r.label for r in table_jobs.longest_first(runs)]
    assert order == ["FedBM g24", "FedAvg long", "FedBM", "Central", "MOON", "FedAvg", "FedProx"]
    assert [r.label for r in runs] == ["FedAvg", "FedProx", "Central", "MOON", "FedBM g24", "FedBM",
                                       "FedAvg long"]  # the plan itself is left as it was


def test_more_workers_per_gpu_than_its_memory_holds_is_refused(monkeypatch):
    """Before the pool starts: K workers per GPU x --job-memory above the GPU's total memory is one error
    naming the GPU and what to lower; within it, or on a CPU, nothing is refused."""
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(total_memory=[24 * GIB, 80 * GIB][i]))
    table_jobs.check_jobs(6, 4.0, ["0"])  # 6 x 4 GiB = 24 GiB: fits
    table_jobs.check_jobs(11, 4.0, ["0", "1"])  # 6 and 5 workers: 24 and 20 GiB
    with pytest.raises(FedbenchError, match=r"--jobs 7 puts 7 workers on GPU 0 \(24\.0 GiB\): 7 x 4 GiB "
                                            r"\(--job-memory\) does not fit\. Lower --jobs to 6 or fewer, or "
                                            r"--job-memory to 3\.4 or less"):
        table_jobs.check_jobs(7, 4.0, ["0"])
    with pytest.raises(FedbenchError, match=r"--jobs 13 puts 7 workers on GPU 3 \(24\.0 GiB\)"):
        table_jobs.check_jobs(13, 4.0, ["3", "5"])  # CUDA_VISIBLE_DEVICES=3,5: GPU 3 is torch's device 0
    table_jobs.check_jobs(64, 4.0, [])  # CPU: no memory check
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(FedbenchError, match="--job-memory must be a positive number of GiB"):
            table_jobs.check_jobs(2, bad, [])


def test_a_worker_waits_for_gpu_memory_then_names_the_run(monkeypatch):
    free = iter([1 * GIB, 3 * GIB, 5 * GIB])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (next(free), 80 * GIB))
    slept = []
    assert table_jobs.wait_for_memory(4.0, "run-a", sleep=slept.append) == 5 * GIB
    assert slept == [table_jobs.MEMORY_POLL_S] * 2  # looked three times, slept between
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (int(1.5 * GIB), 80 * GIB))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    slept.clear()
    with pytest.raises(FedbenchError, match=r"run run-b did not start: its GPU \(CUDA_VISIBLE_DEVICES=7\) had "
                                            r"1\.50 GiB free of 80\.0 after waiting 600 s; it needs 4 GiB"):
        table_jobs.wait_for_memory(4.0, "run-b", sleep=slept.append)
    assert sum(slept) == table_jobs.MEMORY_WAIT_S == 600.0  # bounded: 120 polls of 5 s, then the error


def test_cuda_mps_is_reported_when_its_daemon_runs(tmp_path, monkeypatch, capsys):
    """MPS is on when its control pipe exists in $CUDA_MPS_PIPE_DIRECTORY (else /tmp/nvidia-mps); the first
    line of a --jobs table says so, and the workers' placement line says on or off."""
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert not table_jobs.mps_on()
    assert table_jobs.placement_line(3, 5, ["0", "1", "0"]) == (
        "3 jobs on 2 GPU(s) (GPU 0: 2, GPU 1: 1), 5 thread(s) each, longest runs first; CUDA MPS: off")
    (tmp_path / "control").touch()
    assert table_jobs.mps_on() and table_jobs.placement_line(2, 8, ["0", "0"]).endswith("CUDA MPS: on")
    assert not table_jobs.mps_on({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "elsewhere")})
    with pytest.raises(FedbenchError, match="--job-memory must be"):  # stops after the first line
        table_runner.main(["--config", TABLE, "--jobs", "2", "--job-memory", "0", "--output-dir",
                           str(tmp_path / "runs"), "--tables-dir", str(tmp_path / "tables")])
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("table2 fashion-mnist: ") and first.endswith("; CUDA MPS: on")


def test_jobs_auto_is_one_run_per_core_on_gpus_within_their_memory_and_one_on_a_cpu():
    """--jobs auto: the setting measured best on the H200 (one run per host core: the runs are host-bound,
    docs/gpu.md), capped by what the GPUs' memory holds at --job-memory per run (the same rule check_jobs
    refuses by, round-robin placement) and by the runs to do; on a CPU one run (its ranks take the cores)."""
    assert table_jobs.auto_jobs(16, [], 4.0, 111) == (1, "on the CPU one run at a time, its ranks on the cores")
    assert table_jobs.auto_jobs(16, ["0"], 4.0, 111, totals=[139 * GIB]) == (
        16, "one run per core on 1 GPU(s), at most 16 cores")
    assert table_jobs.auto_jobs(16, ["0"], 4.0, 111, totals=[16 * GIB]) == (
        4, "one run per core on 1 GPU(s), at most 4 x 4 GiB (--job-memory) in the GPUs' memory")
    jobs, _ = table_jobs.auto_jobs(16, ["0", "1"], 4.0, 111, totals=[24 * GIB, 80 * GIB])
    assert jobs == 12  # 6 per GPU: the smaller one's share
    table_jobs.check_jobs(jobs, 4.0, ["0", "1"], totals=[24 * GIB, 80 * GIB])  # what auto picks is never refused
    with pytest.raises(FedbenchError, match="does not fit"):
        table_jobs.check_jobs(jobs + 1, 4.0, ["0", "1"], totals=[24 * GIB, 80 * GIB])
    assert table_jobs.auto_jobs(16, ["0"], 4.0, 3, totals=[139 * GIB]) == (3, "one run per core on 1 GPU(s), at most 3 runs")
    assert table_jobs.auto_jobs(16, ["0"], 200.0, 111, totals=[139 * GIB])[0] == 1  # none fits: one, check_jobs says why


@pytest.mark.parametrize("given, says", [("many", "got 'many'"), ("0", "got '0'"), ("2.5", "got '2.5'")])
def test_jobs_takes_a_whole_number_or_auto(given, says):
    assert (table_runner.parse_jobs(None), table_runner.parse_jobs("3"), table_runner.parse_jobs("auto")) == (1, 3, "auto")
    with pytest.raises(FedbenchError, match=f"--jobs takes a whole number >= 1 \\(runs at once\\) or auto, {says}"):
        table_runner.parse_jobs(given)


def test_jobs_auto_on_a_cpu_plans_one_run_at_a_time_and_says_so(tmp_path, monkeypatch, capsys):
    from bench.assembly import workers

    monkeypatch.setattr(workers, "visible_gpus", lambda accelerator: [])  # a CPU machine, also where a GPU is seen
    assert table_runner.main(["--config", TABLE, "--jobs", "auto", "--dry-run", "--output-dir", str(tmp_path / "runs"),
                              "--tables-dir", str(tmp_path / "tables")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "--jobs auto: 1 (on the CPU one run at a time, its ranks on the cores)"
    assert out[1].startswith("table2 fashion-mnist: 129 runs") and not (tmp_path / "runs").exists()
