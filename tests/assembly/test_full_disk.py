"""A full disk loses no result (issue 38, item 5): the record comes before optional outputs, a failed cache
write runs uncached, a failed checkpoint leaves the previous one and no temporary folder, and records are
claimed without hard links where the file system has none.

A full disk is simulated: the write raises what a full disk raises. On a 1 MB tmpfs, ``torch.save`` into a
file object raised ``RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598``
with the ``OSError: [Errno 28] No space left on device`` of the failed write as its context, and a plain
write raised the OSError itself; ``fill_disk`` raises exactly these. (Mounting a tmpfs needs privileges a
test cannot count on.)"""
from __future__ import annotations

import errno
import json
import os
import re

import pytest
import torch
from conftest import run_in_process

from bench.assembly.records import find_record
from bench.assembly.run_plan import checkpoint_plan
from bench.core import atomic_io
from bench.core.errors import FedbenchError, FedbenchWarning

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

REAL_SAVE = torch.save


def target(f) -> str:
    """The path of the file ``torch.save`` writes (atomic_write passes an os.fdopen file: its name is the fd)."""
    return os.readlink(f"/proc/self/fd/{f.fileno()}") if hasattr(f, "fileno") else str(f)


def no_space() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


def fill_disk(monkeypatch, full: str) -> None:
    """``torch.save`` into a file whose path contains ``full`` fails as on a full disk: some bytes reach the
    file, then torch's writer raises its RuntimeError over the OSError."""

    def save(obj, f, *args, **kwargs):
        if full not in target(f):
            return REAL_SAVE(obj, f, *args, **kwargs)
        f.write(b"PK\x03\x04" + b"\0" * 500)
        try:
            raise no_space()
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598") from None

    monkeypatch.setattr(torch, "save", save)


def test_no_room_for_the_heatmap_or_the_csv_log_keeps_the_record(tiny_cfg, monkeypatch, capsys):
    """The partition heatmap was written before the record and its OSError escaped: no record, no scores.
    (The CSV log's failures, at its periodic save or its last one, ended the run the same way.)"""
    import lightning.fabric.loggers

    import bench.assembly.experiment

    def full(*args, **kwargs):
        raise no_space()

    monkeypatch.setattr(bench.assembly.experiment, "plot_partition", full)
    monkeypatch.setattr(lightning.fabric.loggers.CSVLogger, "finalize", full)
    monkeypatch.setattr(lightning.fabric.loggers.CSVLogger, "log_metrics", full)  # (it saves every 100 steps)
    cfg = tiny_cfg(experiment="full_disk")
    record, _ = run_in_process(cfg)
    err = capsys.readouterr().err
    assert json.loads(find_record(cfg).read_text())["best"] == json.loads(json.dumps(record["best"]))
    assert record["best"]["test/accuracy"] > 50
    heatmap = re.search(r"fedbench: warning: the partition heatmap (\S+) was not written \(\[Errno 28\] No space left "
                        r"on device\); the run's record is written all the same\.", err)
    assert heatmap and heatmap.group(1).endswith(".png") and "/partitions/" in heatmap.group(1), err
    for r in range(cfg.fed.rounds):
        assert (f"fedbench: warning: the loggers' copy of round {r} was not written ([Errno 28] No space left on "
                "device); the run's record is written all the same.") in err
    assert re.search(r"fedbench: warning: the CSVLogger log under \S+ was not written \(\[Errno 28\] No space left "
                     r"on device\); the run's record is written all the same\.", err), err


def run_without_state_check(cfg) -> dict:
    from bench.assembly.experiment import make_fabric, run_experiment

    fabric = make_fabric(cfg)
    fabric.launch()
    return run_experiment(cfg, fabric)


def test_no_room_for_the_final_state_keeps_the_record(tiny_cfg, monkeypatch):
    fill_disk(monkeypatch, "/runs/")
    cfg = tiny_cfg(experiment="no_state")
    with pytest.warns(FedbenchWarning, match=r"the final state was not written to \S+\.pt: no space left on \S+runs/"
                                             r"no_state \(\d+(\.\d{1,3})? MB free, about \d+(\.\d{1,3})? MB needed\)\. The run's "
                                             r"record is complete\."):
        run_without_state_check(cfg)
    path = find_record(cfg)
    assert json.loads(path.read_text())["run_name"] == cfg.run_name()
    assert sorted(p.name for p in path.parent.iterdir() if p.is_file()) == [path.name]  # no .pt, no temp file


def test_no_room_for_the_decode_cache_runs_uncached(tiny_cfg, monkeypatch, tmp_path):
    """torch's RuntimeError was not caught (only OSError was): the run died."""
    fill_disk(monkeypatch, "/cache/")
    cfg = tiny_cfg(experiment="uncached", **{"fed.rounds": 1})
    with pytest.warns(FedbenchWarning) as caught:
        record, _ = run_in_process(cfg)
    messages = [str(w.message) for w in caught if "decode cache" in str(w.message)]
    assert len(messages) == 1
    assert re.fullmatch(r"cannot write the decode cache \S+/cache/\w+\.pt \(no space left on \S+/cache "
                        r"\(\d+(\.\d{1,3})? MB free, about \d+(\.\d{1,3})? MB needed\)\); running uncached: the dataset will "
                        r"be decoded again next time\. Free space on it, or set --data\.cache_dir to another "
                        r"folder\.", messages[0]), messages[0]
    needed = float(re.search(r"about (\S+) MB needed", messages[0]).group(1))
    assert 0.1 <= needed < 0.5  # sklearn digits: 1797 8x8 images, a byte a pixel, int64 labels: 0.13 MB
    assert list((tmp_path / "cache").iterdir()) == []  # no cache file, no temporary file
    assert len(record["history"]) == 1 and find_record(cfg) is not None


def test_no_room_for_a_checkpoint_keeps_the_previous_one_and_no_temp_folder(tiny_cfg, monkeypatch):
    base = {"fed.rounds": 4, "checkpoint_every": 1, "experiment": "ckpt_full"}
    fill_disk(monkeypatch, "round_00002.tmp")
    with pytest.raises(FedbenchError) as raised:
        run_in_process(tiny_cfg(**base))
    folder = checkpoint_plan(tiny_cfg(**base)).folder
    assert re.fullmatch(
        rf"Checkpoint round_00002 was not written: no space left on {re.escape(str(folder))}/round_00002\.tmp "
        rf"\(\d+(\.\d{{1,3}})? MB free, about \d+(\.\d{{1,3}})? MB needed\)\. The previous checkpoint "
        rf"{re.escape(str(folder))}/round_00001 is intact: free space, then continue the run with --resume true\.",
        str(raised.value)), str(raised.value)
    assert sorted(p.name for p in folder.iterdir()) == ["round_00000", "round_00001"]
    assert torch.load(folder / "round_00001" / "global.pt", weights_only=True)["round"] == 1
    # space freed: the run continues from the intact checkpoint
    monkeypatch.setattr(torch, "save", REAL_SAVE)
    record, _ = run_in_process(tiny_cfg(**base, resume=True))
    assert record["resumed"]["from_round"] == 1 and [h["round"] for h in record["history"]] == [0, 1, 2, 3]


def test_an_interrupted_checkpoint_write_leaves_no_temp_folder(tiny_cfg, monkeypatch):
    """Any other OSError of a part (here: the folder made read-only under the run) is the same one error."""
    base = {"fed.rounds": 2, "checkpoint_every": 1, "experiment": "ckpt_eio"}

    def failing(obj, f, *args, **kwargs):
        if "round_00001.tmp" in target(f):
            raise OSError(errno.EIO, "Input/output error")
        return REAL_SAVE(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", failing)
    with pytest.raises(FedbenchError, match=r"Checkpoint round_00001 was not written: \[Errno 5\] Input/output error\."):
        run_in_process(tiny_cfg(**base))
    folder = checkpoint_plan(tiny_cfg(**base)).folder
    assert sorted(p.name for p in folder.iterdir()) == ["round_00000"]


@pytest.mark.parametrize("code", [errno.EPERM, errno.ENOTSUP])
def test_records_are_claimed_on_a_file_system_without_hard_links(tiny_cfg, monkeypatch, tmp_path, code):
    """claim_json made the record with os.link: on FAT (EPERM) or a mount without links (ENOTSUP) the run
    failed at the very end."""

    def no_links(src, dst, *args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "link", no_links)
    target = tmp_path / "claims" / "a.json"
    assert atomic_io.claim_json(target, {"x": 1}) is True
    assert atomic_io.claim_json(target, {"x": 2}) is False  # the name is taken: never overwritten
    assert json.loads(target.read_text()) == {"x": 1} and os.listdir(target.parent) == ["a.json"]

    cfg = tiny_cfg(experiment="nolinks", **{"fed.rounds": 1})
    other = tiny_cfg(experiment="nolinks", **{"fed.rounds": 1, "method.lr": 0.02})
    run_in_process(cfg)
    state = find_record(cfg).with_suffix(".pt").read_bytes()
    run_in_process(other)
    # the other config's final state goes beside its own record, never over the bare name's
    assert find_record(cfg).with_suffix(".pt").read_bytes() == state
    assert find_record(other).with_suffix(".pt").exists()
    assert find_record(cfg).name == f"{cfg.run_name()}.json"  # the bare name, claimed first
    assert find_record(other).name == f"{other.record_name()}.json"  # another config: its identity name
    assert json.loads(find_record(cfg).read_text())["config"]["method"]["lr"] == 0.05
    assert json.loads(find_record(other).read_text())["config"]["method"]["lr"] == 0.02
