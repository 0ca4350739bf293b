"""Issue 27, part 3: one clear error for every bad file, naming it. A truncated or non-object run record
(a table run reruns it with a warning; --render-only stops naming the file), a table YAML with a syntax
error or a code-running tag (file, line and column; nothing runs)."""
from __future__ import annotations

import json

import pytest
from test_table_checks import GOOD, table

from bench.assembly.records import RecordError, load_record
from bench.cli import main
from bench.core.errors import FedbenchError

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out


@pytest.mark.parametrize("content, says", [('{"run_name": "x", "config": {', "is unreadable"),
                                            ("[1, 2]", "holds a JSON list, not a record")])
def test_a_broken_record_is_named_with_what_to_do(tmp_path, content, says):
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(RecordError) as err:
        load_record(path)
    assert str(path) in str(err.value) and says in str(err.value)
    assert "Delete it, or rerun its table with --force" in str(err.value)


def test_a_truncated_record_is_rerun_by_a_table_and_refused_by_render_only(tmp_path, capsys):
    argv = table(tmp_path, GOOD[:1])
    assert main(argv) == 0
    (path,) = [p for p in (tmp_path / "runs").rglob("fedavg_*.json") if not p.is_symlink()]
    good = path.read_text()
    path.write_text(good[: len(good) // 2])  # cut short, as by a full disk
    capsys.readouterr()
    assert main([*argv, "--render-only"]) == 2
    err = capsys.readouterr().err
    assert f"Run record {path} is unreadable" in err and "Traceback" not in err and err.count("fedbench: error") == 1
    assert main(argv) == 0  # a table run treats it as unfinished: reruns it, says so once
    err = capsys.readouterr().err
    assert err.count(f"Run record {path} is unreadable") == 1 and "It is rerun now." in err
    assert json.loads(path.read_text())["config"] == json.loads(good)["config"]


@pytest.mark.parametrize("text, where, says", [
    ("table: t\nrows:\n  - label: A\n    method: {name: fedavg\n", "line 5, column 1", "expected ',' or '}'"),
    ('table: !!python/object/apply:os.system ["touch {marker}"]\n', "line 1, column 8",
     "YAML tags such as !!python/... are not allowed"),
])
def test_a_bad_table_yaml_names_file_line_and_column(tmp_path, capsys, text, where, says):
    marker = tmp_path / "ran"
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace("{marker}", str(marker)))
    assert main(["table", "--config", str(path), "--output-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert f"fedbench: error: {path}, {where}: not valid YAML: " in err and says in err
    assert "Traceback" not in err and not marker.exists()  # the tag was refused, never run


def test_read_yaml_errors_are_fedbench_errors(tmp_path):
    from bench.tables.spec import read_yaml

    path = tmp_path / "x.yaml"
    path.write_text("a: [1\n")
    with pytest.raises(FedbenchError, match=r"x\.yaml, line 2, column 1: not valid YAML"):
        read_yaml(path)


def test_a_decode_cache_with_out_of_range_labels_is_rebuilt_with_a_notice(tmp_path):
    """A cache file whose key and fingerprint match but whose labels name a 4th class of a 3-class
    dataset: named in one warning and decoded again (it used to raise a raw ValueError every run)."""
    import torch
    from test_decode_cache import class_folders, loaded

    from bench.core.errors import FedbenchWarning

    root, cache = class_folders(tmp_path / "data"), tmp_path / "cache"
    first = loaded(root, cache)
    (cache_file,) = cache.iterdir()
    raw = torch.load(cache_file, weights_only=True)
    raw["splits"]["train"]["labels"] = raw["splits"]["train"]["labels"] + 3
    torch.save(raw, cache_file)
    with pytest.warns(FedbenchWarning) as caught:
        again = loaded(root, cache)
    (notice,) = [str(w.message) for w in caught if w.category is FedbenchWarning]
    assert str(cache_file) in notice and "labels outside 0..2" in notice
    assert torch.equal(again.train.labels, first.train.labels)
    assert int(torch.load(cache_file, weights_only=True)["splits"]["train"]["labels"].max()) == 2


def test_too_small_a_sample_cap_names_the_cap_and_one_that_works(tmp_path, capsys):
    """--data.max_train_samples 5 for 4 clients used to say "train split empty"-like partition text; now it
    names the cap as the cause and a cap that works, which then runs."""
    from conftest import digits_run_argv

    argv = [*digits_run_argv(tmp_path), "--accelerator", "cpu", "--partition.args.min_size", "20"]
    assert main([*argv, "--data.max_train_samples", "5"]) == 2
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("fedbench: error:")]
    assert "data.max_train_samples 5 keeps" in line and "too few for this partition" in line
    works = int(line.split("--data.max_train_samples ")[1].split()[0])
    assert works >= 4 * 20 and "Traceback" not in err
    assert main([*argv, "--data.max_train_samples", str(works), "--fed.rounds", "1"]) == 0


@pytest.mark.ddp
def test_a_data_error_on_two_ranks_is_printed_once_before_any_rank_starts(tmp_path):
    import sys

    from conftest import REPO, digits_run_argv, rank_marking_env, run_with_cpu

    argv = [*digits_run_argv(tmp_path), "--devices", "2", "--accelerator", "cpu", "--data.max_train_samples", "5"]
    env, marks = rank_marking_env(tmp_path)
    done, _ = run_with_cpu([sys.executable, "-m", "bench.cli", *argv], cwd=REPO, timeout=1800, env=env)
    assert done.returncode == 2
    assert done.stderr.count("fedbench: error:") == 1 and "data.max_train_samples 5 keeps" in done.stderr
    assert "gloo" not in done.stderr.lower() and "Traceback" not in done.stderr
    assert list(marks.iterdir()) == []  # no second rank was started (it used to be checked by a 30 s clock)


@pytest.mark.ddp
def test_an_unknown_backbone_on_two_ranks_is_one_error_before_any_rank_or_data(tmp_path):
    """It used to be caught after the ranks started (~15 s in), once per rank."""
    import sys

    from conftest import REPO, digits_run_argv, rank_marking_env, run_with_cpu

    argv = [*digits_run_argv(tmp_path), "--devices", "2", "--accelerator", "cpu", "--method.backbone", "resnet999"]
    env, marks = rank_marking_env(tmp_path)
    done, _ = run_with_cpu([sys.executable, "-m", "bench.cli", *argv], cwd=REPO, timeout=1800, env=env)
    assert done.returncode == 2
    assert list(marks.iterdir()) == []  # no rank was started (was: a 30 s wall-clock limit)
    assert done.stderr.count("fedbench: error: Unknown backbone 'resnet999'") == 1
    assert not (tmp_path / "cache").exists()  # refused before any data was read


def test_quoted_causes_are_never_cut_mid_word():
    from bench.core.errors import first_line

    long = "Timed out waiting 3000ms for recv operation to complete " * 8
    cut = first_line(RuntimeError(long + "\nsecond line"), 200)
    assert len(cut) <= 200 and cut.endswith(" …")
    assert cut[:-2].split()[-1] in long.split()  # the last kept word is whole
    assert first_line(ValueError("")) == "ValueError" and first_line("one\ntwo") == "one"
    assert first_line("/x" * 200, 30) == "/x" * 14 + " …"  # one long token: cut where it must be
