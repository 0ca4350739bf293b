"""`fedbench data get` (issue 39, item 4) against a local HTTP server on 127.0.0.1 that serves small archives
written in each fetchable dataset's official layout (tests/official_layouts.py) and honours HTTP Range: a full
download loaded by the real data module, an interrupted download resumed, a wrong checksum, a truncated
archive, a failed request; after every failure nothing is half-unpacked. The URL and checksums are the
command's own --mirror / --checksums (a mirror and its sha256sum file), nothing is monkeypatched."""
from __future__ import annotations

import fcntl
import hashlib
import http.server
import os
import re
import tarfile
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO
from official_layouts import (
    CINIC_DIRS,
    write_cifar10,
    write_cifar100,
    write_class_tree,
    write_fashion_mnist,
    write_kvasir,
    write_medmnist,
)
from tqdm import tqdm

from bench.cli import main
from bench.commands.data_command import availability, table_datasets
from bench.commands.data_sources import SOURCES
from bench.commands.download import DOWNLOADS, TOFU_FILE, UNPACK_PREFIX
from datamodules.base import DATASETS
from datamodules.data_home import locate


class Server:
    """Files of ``root`` over HTTP on 127.0.0.1, with Range requests (206 / 416). ``cut[name] = n`` makes the
    next answer for ``name`` announce its full length but send only ``n`` bytes, then close the connection.
    ``log``: (file, Range header, bytes sent) per request."""

    def __init__(self, root: Path) -> None:
        self.root, self.cut, self.log = root, {}, []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.answer(self)

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # shutdown() waits for the serving loop's next poll: 0.5 s by default, paid by every test's teardown
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/mirror"

    def answer(self, h: http.server.BaseHTTPRequestHandler) -> None:
        name = h.path.split("?")[0].removeprefix("/mirror/")
        path, rng = self.root / name, h.headers.get("Range")
        if not path.is_file():
            self.log.append((name, rng, 0))
            h.send_error(404)
            return
        data = path.read_bytes()
        start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1)) if rng else 0
        if start >= len(data) > 0:
            self.log.append((name, rng, 0))
            h.send_response(416)
            h.send_header("Content-Range", f"bytes */{len(data)}")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        body = data[start:]
        h.send_response(206 if rng else 200)
        if rng:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        sent = body[: self.cut.pop(name, len(body))]
        h.wfile.write(sent)
        self.log.append((name, rng, len(sent)))

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(tmp_path):
    (tmp_path / "served").mkdir()
    srv = Server(tmp_path / "served")
    yield srv
    srv.close()


# ---- archives in each dataset's official layout, and what the loader must then read --------------------------
def zip_tree(src: Path, archive: Path) -> None:
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(src.rglob("*")):
            zf.write(path, path.relative_to(src).as_posix())


def tar_tree(src: Path, archive: Path) -> None:
    with tarfile.open(archive, "w:gz") as tf:
        for path in sorted(src.iterdir()):
            tf.add(path, path.name)


def official(name: str, work: Path, out: Path, per_class: int = 10) -> int:
    """Write dataset ``name``'s official download(s) into ``out``; returns the number of samples it holds."""
    src = work / f"src-{name}-{per_class}"
    if name == "kvasir":  # kvasir-dataset-v2.zip: kvasir-dataset-v2/<8 classes>/*.jpg, with macOS debris
        write_kvasir(src / "kvasir-dataset-v2", per_class)
        zip_tree(src, out / "kvasir-dataset-v2.zip")
        return 8 * per_class
    if name == "cifar10":  # cifar-10-python.tar.gz: cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}
        write_cifar10(src / "cifar-10-batches-py", per_batch=10)
        tar_tree(src, out / "cifar-10-python.tar.gz")
        return 5 * 10 + 10
    if name == "cifar100":  # cifar-100-python.tar.gz: cifar-100-python/{train,test,meta}
        write_cifar100(src / "cifar-100-python", np.arange(500) % 100, np.arange(100))
        tar_tree(src, out / "cifar-100-python.tar.gz")
        return 600
    if name == "cinic10":  # CINIC-10.tar.gz: train/, valid/, test/ at its top level (no wrapping folder)
        for split in ("train", "valid", "test"):
            write_class_tree(src / split, CINIC_DIRS, per_class, ext="png", sizes=((32, 32),))
        tar_tree(src, out / "CINIC-10.tar.gz")
        return 3 * 10 * per_class
    if name == "fashion-mnist":  # four gzipped IDX files, each its own download
        write_fashion_mnist(out, 60, 20)
        return 80
    flag = {"ham10000": "dermamnist", "pbc": "bloodmnist"}[name]  # MedMNIST+: <flag>_128.npz
    classes = len(DATASETS.get(name).class_names)
    write_medmnist(out / f"{flag}_128.npz", 128, {"train": 3 * classes, "val": classes, "test": classes}, classes)
    return 5 * classes


def sha256sums(folder: Path, wrong: str | None = None) -> Path:
    """A sha256sum file of every file in ``folder`` (``wrong``: that file's value replaced by another)."""
    lines = []
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        lines.append(f"{'0' * 64 if path.name == wrong else digest}  {path.name}")
    out = folder.parent / "SHA256SUMS"
    out.write_text("\n".join(lines) + "\n")
    return out


def get(home: Path, name: str, server: Server, *extra: str) -> int:
    return main(["data", "get", name, "--data-home", str(home), "--mirror", server.url, "--progress", "false", *extra])


def leftovers(home: Path) -> list[str]:
    """What a failed command left in the data home besides a resumable .part: nothing, if all is well."""
    out = [p.name for p in home.iterdir() if p.name.startswith(UNPACK_PREFIX)] if home.exists() else []
    return out + [str(p) for p in (home / DOWNLOADS).glob("*") if not p.name.endswith(".part")]


def load(name: str, tmp_path: Path) -> int:
    dm = DATASETS.get(name)(cache_dir=str(tmp_path / "cache"), image_size=8)
    dm.setup()
    splits = [s for s in (dm.train, dm.val, dm.test) if s is not None]
    labels = set().union(*(set(s.labels.tolist()) for s in splits))
    assert labels == set(range(len(dm.class_names))), name  # every class decoded
    return sum(len(s.labels) for s in splits)


FETCHABLE = sorted(n for n, s in SOURCES.items() if s.fetchable)


def test_the_fetchable_datasets_are_the_public_archives():
    assert FETCHABLE == ["cifar10", "cifar100", "cinic10", "fashion-mnist", "ham10000", "kvasir", "pbc"]
    manual = sorted(n for n, s in SOURCES.items() if not s.fetchable)
    assert manual == ["brain-tumor", "fed-isic2019", "femnist", "oct-c8", "real-skin", "rsna-ich", "skin-cancer"]


def test_each_source_unpacks_to_the_name_its_loader_looks_for(tmp_path):
    """A source's target is found by its data module under the data home, and every dataset looked for
    under the data home has a source (present, fetchable or manual, never unknown)."""
    for name in DATASETS.names():
        cls = DATASETS.get(name)
        assert (name in SOURCES) == bool(cls.home_entries), name
        if name in SOURCES:
            target = tmp_path / name / SOURCES[name].target
            target.parent.mkdir()
            target.mkdir() if SOURCES[name].layout != "file" else target.write_bytes(b"")
            assert locate(tmp_path / name, cls.home_entries) == (target if target.is_dir() else target.parent), name


@pytest.mark.parametrize("name", FETCHABLE)
def test_full_download_is_read_by_the_real_data_module(name, tmp_path, server, monkeypatch, capsys):
    home = tmp_path / "home"
    monkeypatch.setenv("FEDBENCH_DATA", str(home))
    count = official(name, tmp_path, server.root)
    default = DATASETS.get(name).default_root  # Debian's Fashion-MNIST may be installed: --force downloads anyway
    assert availability(name, home) == ("present" if default and Path(default).expanduser().exists() else "fetchable")
    assert get(home, name, server, "--checksums", str(sha256sums(server.root)), "--force") == 0
    assert f"{name}: ready at {home / SOURCES[name].target}" in capsys.readouterr().out
    assert load(name, tmp_path) == count
    assert sorted(p.name for p in home.iterdir()) == [SOURCES[name].target]  # no archive, part or temp folder
    assert availability(name, home) == "present"
    requests = len(server.log)
    assert get(home, name, server) == 0  # present: nothing downloaded again
    assert len(server.log) == requests and f"{name}: present at" in capsys.readouterr().out


def test_an_interrupted_download_resumes_with_a_range_request(tmp_path, server, monkeypatch, capsys):
    home = tmp_path / "home"
    monkeypatch.setenv("FEDBENCH_DATA", str(home))
    count = official("cifar10", tmp_path, server.root)
    archive = server.root / "cifar-10-python.tar.gz"
    size, sums = archive.stat().st_size, sha256sums(server.root)
    server.cut[archive.name] = 1000
    assert get(home, "cifar10", server, "--checksums", str(sums)) == 2
    err = capsys.readouterr().err
    assert f"stopped at 1,000 of {size:,} bytes" in err and "run the same command again to resume" in err
    part = home / DOWNLOADS / f"{archive.name}.part"
    assert part.stat().st_size == 1000 and part.read_bytes() == archive.read_bytes()[:1000]
    assert not (home / "cifar-10-batches-py").exists() and leftovers(home) == []
    assert get(home, "cifar10", server, "--checksums", str(sums), "--progress", "true") == 0
    assert server.log[-1] == (archive.name, "bytes=1000-", size - 1000)  # only the rest was sent
    bar = capsys.readouterr().err
    start, total = tqdm.format_sizeof(1000, divisor=1024), tqdm.format_sizeof(size, divisor=1024)
    assert f"{archive.name}: " in bar and f"{start}/{total}" in bar, bar  # the bar starts where the part ended
    assert load("cifar10", tmp_path) == count
    assert not (home / DOWNLOADS).exists()


def test_a_server_that_ignores_the_range_sends_the_whole_file_again(tmp_path, server, monkeypatch):
    """A 200 to a range request replaces the part instead of being appended to it."""
    home = tmp_path / "home"
    monkeypatch.setenv("FEDBENCH_DATA", str(home))
    count = official("cinic10", tmp_path, server.root)
    sums = sha256sums(server.root)
    server.cut["CINIC-10.tar.gz"] = 500
    assert get(home, "cinic10", server, "--checksums", str(sums)) == 2
    original = Server.answer

    def no_range(self, h):
        del h.headers["Range"]
        original(self, h)

    server.answer = no_range.__get__(server)
    assert get(home, "cinic10", server, "--checksums", str(sums)) == 0
    assert load("cinic10", tmp_path) == count


def test_a_wrong_checksum_is_one_error_and_leaves_nothing(tmp_path, server, monkeypatch, capsys):
    home = tmp_path / "home"
    monkeypatch.setenv("FEDBENCH_DATA", str(home))
    official("kvasir", tmp_path, server.root)
    actual = hashlib.sha256((server.root / "kvasir-dataset-v2.zip").read_bytes()).hexdigest()
    assert get(home, "kvasir", server, "--checksums", str(sha256sums(server.root, wrong="kvasir-dataset-v2.zip"))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"SHA-256 {actual} instead of the recorded {'0' * 64}" in err[0]
    assert sorted(p.name for p in home.iterdir()) == []  # no dataset, no part, no temp folder, no TOFU record


@pytest.mark.parametrize("name", ["kvasir", "cinic10"])
def test_a_truncated_archive_is_refused_and_nothing_is_half_unpacked(name, tmp_path, server, monkeypatch, capsys):
    """No checksum recorded (Kvasir and CINIC-10 publish none): the archive itself is found damaged; the
    partly extracted files go with the temporary folder and no SHA-256 is recorded for it."""
    home = tmp_path / "home"
    monkeypatch.setenv("FEDBENCH_DATA", str(home))
    official(name, tmp_path, server.root)
    archive = next(server.root.iterdir())
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size * 2 // 3])
    assert get(home, name, server) == 2
    err = capsys.readouterr().err
    assert "cannot be unpacked" in err and "damaged or truncated" in err, err
    assert sorted(p.name for p in home.iterdir()) == []


def test_a_truncated_archive_fails_its_recorded_checksum(tmp_path, server, monkeypatch, capsys):
    home = tmp_path / "home"
    monkeypatch.setenv("FEDBENCH_DATA", str(home))
    official("cifar100", tmp_path, server.root)
    sums = sha256sums(server.root)
    archive = server.root / "cifar-100-python.tar.gz"
    archive.write_bytes(archive.read_bytes()[:-100])
    assert get(home, "cifar100", server, "--checksums", str(sums)) == 2
    assert "is not the recorded file" in capsys.readouterr().err
    assert sorted(p.name for p in home.iterdir()) == []


def test_the_first_download_records_its_sha256_and_later_ones_are_checked(tmp_path, server, monkeypatch, capsys):
    """Trust on first use for a file with no published SHA-256 (Kvasir-v2)."""
    home = tmp_path / "home"
    monkeypatch.setenv("FEDBENCH_DATA", str(home))
    official("kvasir", tmp_path, server.root)
    first = hashlib.sha256((server.root / "kvasir-dataset-v2.zip").read_bytes()).hexdigest()
    assert get(home, "kvasir", server) == 0
    assert (f"kvasir: kvasir-dataset-v2.zip has no published SHA-256: recorded {first} in {home / TOFU_FILE}"
            in capsys.readouterr().out)
    record = (home / TOFU_FILE).read_text()
    assert f'"sha256": "{first}"' in record and server.url in record
    (home / "kvasir-dataset-v2").rename(tmp_path / "moved-away")
    official("kvasir", tmp_path, server.root, per_class=11)  # the server's file changed
    assert get(home, "kvasir", server) == 2
    assert f"instead of {first}, recorded in {home / TOFU_FILE} at its first download" in capsys.readouterr().err
    assert sorted(p.name for p in home.iterdir()) == [TOFU_FILE]


def test_a_failed_request_is_one_error(tmp_path, server, monkeypatch, capsys):
    home = tmp_path / "home"
    monkeypatch.setenv("FEDBENCH_DATA", str(home))
    assert get(home, "pbc", server) == 2  # the mirror does not have the file
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "HTTP 404" in err[0] and "bloodmnist_128.npz" in err[0]
    assert leftovers(home) == [] and not locate(home, ("bloodmnist*.npz",))


def test_a_folder_in_the_way_is_never_replaced(tmp_path, server, capsys):
    """--force downloads a dataset the loader finds elsewhere, but never over a folder of the data home."""
    home = tmp_path / "home"
    official("cifar10", tmp_path, server.root)
    (home / "cifar-10-batches-py").mkdir(parents=True)
    (home / "cifar-10-batches-py" / "mine.txt").write_text("keep")
    assert get(home, "cifar10", server, "--checksums", str(sha256sums(server.root))) == 0
    assert "cifar10: present at" in capsys.readouterr().out
    assert get(home, "cifar10", server, "--checksums", str(sha256sums(server.root)), "--force") == 2
    assert "already exists: fedbench never replaces or deletes it" in capsys.readouterr().err
    assert (home / "cifar-10-batches-py" / "mine.txt").read_text() == "keep" and server.log == []
    assert sorted(p.name for p in home.iterdir()) == ["cifar-10-batches-py"]


def test_a_manual_dataset_prints_its_steps(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    monkeypatch.setenv("FEDBENCH_DATA", str(home))
    assert main(["data", "get", "oct-c8", "--data-home", str(home)]) == 2
    out, err = capsys.readouterr()
    assert f'kaggle datasets download -d obulisainaren/retinal-oct-c8 -p "{home}/OCT-C8" --unzip' in out
    assert "~/.kaggle/kaggle.json" in out and "oct-c8 must be fetched by hand" in err
    assert main(["data", "get", "fed-isic2019", "--data-home", str(home)]) == 2
    assert f'download_isic.py --output-folder "{home}/fed_isic2019"' in capsys.readouterr().out
    assert not home.exists() or list(home.iterdir()) == []


def test_unknown_names_and_no_names_are_one_error(tmp_path, server, capsys):
    official("pbc", tmp_path, server.root)
    assert main(["data", "get", "pbc", "kvasr", "--data-home", str(tmp_path / "home"), "--mirror", server.url]) == 2
    assert "Did you mean 'kvasir'" in capsys.readouterr().err and server.log == []
    assert get(tmp_path / "home", "pbc", server, "--checksums", str(tmp_path / "none")) == 2
    assert "Cannot read the checksums file" in capsys.readouterr().err and server.log == []
    assert main(["data", "get", "--data-home", str(tmp_path)]) == 2
    assert "name at least one dataset" in capsys.readouterr().err


def test_table_configs_name_the_datasets_they_read():
    tables = REPO / "configs" / "tables"
    assert table_datasets(str(tables / "table2_kvasir.yaml")) == ["kvasir"]
    assert table_datasets(str(tables / "fstcbdg_cinic10.yaml")) == ["cinic10"]
    assert table_datasets(str(tables / "fednpr_ich.yaml")) == ["rsna-ich"]
    assert set(table_datasets(str(tables / "facmic_table2.yaml"))) == {"brain-tumor", "skin-cancer", "real-skin"}


def test_the_table_targets_fetch_the_data_first(tmp_path, server, monkeypatch):
    makefile = (REPO / "Makefile").read_text()
    for target in ("table2", "table-ablation", "table-fednpr", "table-fednpr-ablation", "table-facmic", "table-fstcbdg"):
        rule = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1).splitlines()
        assert rule[0].strip().startswith("$(call fetch-data,configs/tables/"), target
        assert "fedbench table" in rule[1], target
    home = tmp_path / "home"
    monkeypatch.setenv("FEDBENCH_DATA", str(home))
    official("kvasir", tmp_path, server.root)
    argv = ["data", "get", "--table", str(REPO / "configs/tables/table2_kvasir.yaml"), "--mirror", server.url,
            "--progress", "false"]
    assert main(argv) == 0 and (home / "kvasir-dataset-v2" / "polyps").is_dir()


def test_the_docs_list_every_source_with_its_recorded_checksums():
    """docs/data.md's table is the sources table: each dataset with how it is got, where it goes, and every
    checksum recorded for it."""
    docs = (REPO / "docs" / "data.md").read_text()
    for name, source in SOURCES.items():
        how = "fetchable" if source.fetchable else "manual"
        row = next((line for line in docs.splitlines() if line.startswith(f"| `{name}` | {how} |")), None)
        assert row is not None and f"`{source.target}" in row, name
        for f in source.files:
            for value in (f.sha256, f.md5):
                assert value is None or value in row, (name, value)
    assert "fedbench data get" in (REPO / "README.md").read_text()


def test_a_second_data_get_waits_for_the_first(tmp_path, server, monkeypatch, capsys):
    """One `fedbench data get` at a time per data home (no two writers of one .part): a second one says it
    waits, then downloads once the first has finished."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("FEDBENCH_DATA", str(home))
    count = official("cinic10", tmp_path, server.root)
    fd = os.open(home, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the first command, still running
    threading.Timer(1.0, os.close, (fd,)).start()
    assert get(home, "cinic10", server) == 0
    assert f"waiting for another `fedbench data get` in {home}" in capsys.readouterr().err
    assert load("cinic10", tmp_path) == count


def test_the_data_sources_are_not_part_of_the_records_code_version():
    """Downloading is reporting-layer code: editing a URL or checksum never makes a run record stale."""
    from bench.core.code_version import Tree, closure

    tree = Tree(REPO)  # every file any run's code version covers: the engine and each registered part
    files = set(tree.engine_files).union(*(closure([path], tree.graph, tree.root)
                                           for names in tree.registered.values() for path in names.values()))
    hashed = {p.relative_to(REPO).as_posix() for p in files}
    assert "datamodules/kvasir.py" in hashed
    assert not {"bench/commands/download.py", "bench/commands/data_sources.py",
                "bench/commands/data_command.py"} & hashed


def test_data_get_for_a_present_dataset_imports_no_training_stack(tmp_path):
    """The command module and the presence check of a source's target load neither torch nor Lightning (the
    table targets run it before every table)."""
    import subprocess
    import sys

    (tmp_path / "kvasir-dataset-v2").mkdir()
    code = ("import sys; from pathlib import Path; from bench.commands.data_command import present_at; "
            f"print(present_at('kvasir', Path({str(tmp_path)!r})), 'torch' in sys.modules, 'lightning' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout.split()
    assert out == [str(tmp_path / "kvasir-dataset-v2"), "False", "False"]
