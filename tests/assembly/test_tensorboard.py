"""A user who prefers TensorBoard gets the same per-round keys with one flag (issue 32, item 3): a run with
--tensorboard true writes TensorBoard event files (tensorboardX, in the locked environment) holding the
same scalars, round by round, as its CSV log."""
from __future__ import annotations

import csv
import math
import struct

from bench.cli import main


def read_events(path) -> dict[tuple[str, int], float]:
    """(tag, step) -> value of a TensorBoard event file (TFRecord framing: length, crc, event, crc)."""
    from tensorboardX.proto.event_pb2 import Event

    out, data = {}, path.read_bytes()
    at = 0
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at:at + 8])
        event = Event.FromString(data[at + 12:at + 12 + length])
        at += 12 + length + 4
        for value in event.summary.value:
            out[(value.tag, event.step)] = value.simple_value
    return out


def read_csv(path) -> dict[tuple[str, int], float]:
    out = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            step = int(float(row["step"]))
            out.update({(k, step): float(v) for k, v in row.items() if k != "step" and v != ""})
    return out


def test_tensorboard_gets_the_csv_scalars_round_by_round(tmp_path, capsys):
    runs = tmp_path / "runs"
    argv = ["run", "--data.name", "digits", "--data.cache_dir", str(tmp_path / "cache"), "--method.backbone",
            "simple-cnn", "--fed.rounds", "2", "--partition.num_clients", "3", "--output_dir", str(runs),
            "--checkpoint_dir", str(tmp_path / "ckpt"), "--threads", "1", "--progress", "false", "--devices", "1",
            "--experiment", "tb", "--tensorboard", "true"]
    assert main(argv) == 0, capsys.readouterr().err
    (events,) = (runs / "tb" / "tensorboard").rglob("events.out.tfevents.*")
    (metrics,) = (runs / "tb" / "csv").rglob("metrics.csv")
    tb, logged = read_events(events), read_csv(metrics)
    assert {step for _, step in logged} == {0, 1}
    for key in ("train/loss", "lr", "time/round_seconds", "comm/bytes_up", "test/accuracy", "clients_trained"):
        assert {(key, 0), (key, 1)} <= logged.keys(), key
    assert tb.keys() == logged.keys()
    for key, value in logged.items():  # TensorBoard keeps float32
        assert math.isclose(tb[key], value, rel_tol=1e-6, abs_tol=1e-6), (key, tb[key], value)
