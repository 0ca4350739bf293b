"""`fedbench data get NAME`: download a public dataset into the data home, checked, resumable, unpacked atomically.

1. Each file of the dataset's source (bench/commands/data_sources.py) is downloaded to
   ``<home>/.fedbench-downloads/<file>.part`` with a progress bar. A download that stops early (the
   connection drops, fewer bytes than announced) keeps its ``.part`` and is one error saying to run the
   command again: the next run asks for the rest (HTTP ``Range``) and appends it; a server that ignores
   the range sends the whole file again, which then replaces the part.
2. The complete file is checked: its size (where published), its SHA-256 against the value recorded in the
   project or, failing that, in the data home (``.fedbench-checksums.json``, written at the first good
   download: trust on first use), and its MD5 against the authors' published value. A mismatch deletes
   the file and is one error naming both values.
3. Archives are unpacked into a temporary folder inside the data home (``.fedbench-unpack-*``); members
   with absolute paths or ``..`` are refused; the expected layout is checked, and only then is the
   dataset's folder renamed into place (one ``os.rename``: the dataset is either absent or complete). A
   damaged or truncated archive, or one without the expected layout, leaves nothing behind but the error.

``mirror`` (``--mirror URL`` or ``$FEDBENCH_DATA_MIRROR``) replaces every URL by ``<mirror>/<file name>``;
``checksums`` (``--checksums FILE``, ``sha256sum`` format) replaces the recorded checksums of the files it
names (a mirror's own files). Nothing here imports torch.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from bench.commands.data_sources import SOURCES, RemoteFile, Source
from bench.core.errors import FedbenchError

MIRROR_ENV = "FEDBENCH_DATA_MIRROR"
DOWNLOADS = ".fedbench-downloads"
UNPACK_PREFIX = ".fedbench-unpack-"
TOFU_FILE = ".fedbench-checksums.json"
CHUNK = 1 << 20
TIMEOUT_S = 60


class DownloadError(FedbenchError):
    """A download failed, stopped early, or its file is not the recorded one; the message says what to do."""


class DownloadStopped(DownloadError):
    """A transfer that began and stopped early: its part is kept for the next run to resume."""


class ManualDatasetError(FedbenchError):
    """The dataset cannot be fetched by fedbench (a registration, a licence, a build script)."""


def source_of(name: str) -> Source:
    if name not in SOURCES:
        raise FedbenchError(f"No download source for dataset {name!r}; datasets with one: {', '.join(sorted(SOURCES))}.")
    return SOURCES[name]


def manual_steps(source: Source, home: Path) -> str:
    """The numbered steps that put a manual dataset into the data home ``home``."""
    lines = [f"{i}. {step.replace('{home}', str(home))}" for i, step in enumerate(source.steps, 1)]
    return "\n".join([f"{source.dataset}: fetched by hand ({source.homepage}; licence: {source.licence}):", *lines])


def read_checksums(path: str | os.PathLike) -> dict[str, str]:
    """A ``sha256sum`` file: ``<64 hex>  <file name>`` per line -> {file name: sha256}."""
    out = {}
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise FedbenchError(f"Cannot read the checksums file {path}: {err}.") from err
    for n, line in enumerate(text.splitlines(), 1):
        match = re.fullmatch(r"([0-9a-fA-F]{64}) [ *](.+)", line.strip())
        if line.strip() and not match:
            raise FedbenchError(f"{path}:{n}: expected '<sha256>  <file name>' (sha256sum's format), got {line!r}.")
        if match:
            out[Path(match.group(2)).name] = match.group(1).lower()
    return out


def planned_files(source: Source, mirror: str | None, checksums: dict[str, str] | None) -> list[RemoteFile]:
    """The source's files with a mirror's URLs and checksums applied."""
    mirror = mirror or os.environ.get(MIRROR_ENV, "").strip() or None
    out = []
    for f in source.files:
        if mirror:
            f = replace(f, urls=(f"{mirror.rstrip('/')}/{f.name}",))
        if checksums and f.name in checksums:
            f = replace(f, sha256=checksums[f.name], md5=None, size=None, provenance="--checksums")
        out.append(f)
    return out


# ---- downloading --------------------------------------------------------------------------------------------
def progress_bar(name: str, total: int | None, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="B", unit_scale=True, unit_divisor=1024, desc=name,
                disable=not enabled, file=sys.stderr, leave=False)


def open_url(url: str, start: int):
    """The server's answer to a request for ``url`` from byte ``start``; None when the part is already whole
    (416 to a range request)."""
    headers = {"User-Agent": "fedbench-data-get"} | ({"Range": f"bytes={start}-"} if start else {})
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S)
    except urllib.error.HTTPError as err:
        if err.code == 416 and start:
            return None
        raise DownloadError(f"{url}: HTTP {err.code} {err.reason}") from err
    except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
        raise DownloadError(f"{url}: {getattr(err, 'reason', err)}") from err


def resume_offset(resp, start: int) -> int:
    """Where the body of ``resp`` starts in the file: ``start`` for a 206 from there, else 0."""
    if start and resp.status == 206:
        match = re.match(r"bytes (\d+)-", resp.headers.get("Content-Range", ""))
        if match and int(match.group(1)) == start:
            return start
        raise DownloadError(f"{resp.url}: the server answered the range request from byte {start} with "
                            f"{resp.headers.get('Content-Range')!r}; delete the .part file and run again.")
    return 0


def stream(url: str, part: Path, progress: bool) -> None:
    """Download ``url`` into ``part``, continuing a partial file; an early stop keeps ``part`` and raises."""
    start = part.stat().st_size if part.exists() else 0
    resp = open_url(url, start)
    if resp is None:
        return
    with resp:
        offset = resume_offset(resp, start)
        length = resp.headers.get("Content-Length")
        total = offset + int(length) if length and length.isdigit() else None
        got = offset
        with open(part, "ab" if offset else "wb") as out, progress_bar(part.name[:-5], total, offset, progress) as bar:
            try:
                while chunk := resp.read(CHUNK):
                    out.write(chunk)
                    got += len(chunk)
                    bar.update(len(chunk))
            except (OSError, http.client.HTTPException) as err:
                raise stopped(url, part, got, total, err) from err
    if total is not None and got < total:
        raise stopped(url, part, got, total, "the connection closed early")


def stopped(url: str, part: Path, got: int, total: int | None, why) -> DownloadStopped:
    of = f" of {total:,}" if total else ""
    return DownloadStopped(f"The download of {url} stopped at {got:,}{of} bytes ({why}). The part is kept in "
                         f"{part}: run the same command again to resume it.")


def download(f: RemoteFile, folder: Path, progress: bool) -> Path:
    """``folder/<name>.part`` downloaded to its end from the first URL that answers; returns the part."""
    folder.mkdir(parents=True, exist_ok=True)
    part = folder / f"{f.name}.part"
    failures = []
    for url in f.urls:
        try:
            stream(url, part, progress)
            return part
        except DownloadStopped:  # it got somewhere: the next run resumes
            raise
        except DownloadError as err:  # no answer from this URL: try the next
            failures.append(str(err))
    raise DownloadError(f"Could not download {f.name}: " + "; ".join(failures)
                        + ". Check the network (or pass --mirror URL) and run again.")


# ---- checking ------------------------------------------------------------------------------------------------
def digests(path: Path) -> tuple[str, str]:
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            sha.update(chunk)
            md5.update(chunk)
    return sha.hexdigest(), md5.hexdigest()


def tofu_record(home: Path) -> dict[str, dict]:
    try:
        return json.loads((home / TOFU_FILE).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        raise FedbenchError(f"Cannot read {home / TOFU_FILE} (the SHA-256 values recorded at first download): "
                            f"{err}. Repair or delete it.") from err


def verify(f: RemoteFile, path: Path, home: Path) -> str:
    """Check ``path`` against every checksum known for ``f``; returns its SHA-256. A mismatch deletes it."""
    size = path.stat().st_size
    sha, md5 = digests(path)
    first = tofu_record(home).get(f.name, {}).get("sha256")
    problems = []
    if f.size is not None and size != f.size:
        problems.append(f"{size:,} bytes instead of the published {f.size:,}")
    if f.sha256 and sha != f.sha256:
        problems.append(f"SHA-256 {sha} instead of the recorded {f.sha256} ({f.provenance})")
    elif not f.sha256 and first and sha != first:
        problems.append(f"SHA-256 {sha} instead of {first}, recorded in {home / TOFU_FILE} at its first download "
                        "(if the dataset was deliberately updated, delete that entry)")
    if f.md5 and md5 != f.md5:
        problems.append(f"MD5 {md5} instead of the published {f.md5} ({f.provenance})")
    if problems:
        path.unlink()
        raise DownloadError(f"The download of {f.name} is not the recorded file: {'; '.join(problems)}. It was "
                            "deleted; run again to download it afresh (a truncated or corrupted transfer, or a "
                            "changed file on the server).")
    return sha


def record_first_use(home: Path, files: list[RemoteFile], shas: dict[str, str], say: Callable[[str], None]) -> None:
    """Write the SHA-256 of each file that has none recorded in the project (atomically)."""
    record = tofu_record(home)
    new = {f.name: {"sha256": shas[f.name], "url": f.urls[0]} for f in files
           if not f.sha256 and f.name not in record}
    if not new:
        return
    for name, entry in new.items():
        say(f"{name} has no published SHA-256: recorded {entry['sha256']} in {home / TOFU_FILE} (later downloads "
            "into this data home must match it)")
    fd, tmp = tempfile.mkstemp(dir=home, prefix=f"{TOFU_FILE}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(record | new, fh, indent=1, sort_keys=True)
    os.replace(tmp, home / TOFU_FILE)


# ---- unpacking -----------------------------------------------------------------------------------------------
def safe_members(names: list[str], archive: Path) -> None:
    for name in names:
        parts = Path(name).parts
        if Path(name).is_absolute() or ".." in parts:
            raise DownloadError(f"{archive.name} holds a member outside its folder ({name!r}); refused.")


def extract(archive: Path, layout: str, into: Path) -> None:
    """Unpack ``archive`` into ``into``; a damaged or truncated archive is a DownloadError."""
    try:
        if layout == "zip":
            with zipfile.ZipFile(archive) as zf:
                safe_members(zf.namelist(), archive)
                zf.extractall(into)  # a member failing its CRC check raises BadZipFile
        else:
            with tarfile.open(archive) as tf:
                safe_members(tf.getnames(), archive)
                tf.extractall(into, filter="data")
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, ValueError) as err:
        raise DownloadError(f"{archive.name} cannot be unpacked ({type(err).__name__}: {err}): the archive is "
                            "damaged or truncated. It was deleted; run again to download it afresh.") from err


def staged(source: Source, files: dict[str, Path], tmp: Path) -> Path:
    """Lay the downloaded ``files`` out in ``tmp`` as ``<home>/<target>`` must look; returns that path."""
    if source.layout == "file":
        staged_path = tmp / source.target
        shutil.move(files[source.files[0].name], staged_path)
        return staged_path
    if source.layout == "folder":
        staged_path = tmp / source.target
        staged_path.mkdir()
        for name, path in files.items():
            shutil.move(path, staged_path / name)
        return staged_path
    archive = next(iter(files.values()))
    extract(archive, source.layout, tmp / "x")
    root = tmp / "x" / source.archive_root if source.archive_root else tmp / "x"
    if not root.is_dir():
        found = sorted(p.name for p in (tmp / "x").iterdir())
        raise DownloadError(f"{archive.name} does not hold the folder {source.archive_root}/ the loader reads "
                            f"(its top level: {found[:8]}).")
    return root


def install(source: Source, files: dict[str, Path], home: Path) -> Path:
    """Unpack/move ``files`` into ``home/<target>`` through a temporary folder; nothing is left on failure."""
    dest = home / source.target
    if dest.exists():
        raise FedbenchError(f"{dest} already exists: fedbench never replaces or deletes it; move it away and run again.")
    tmp = Path(tempfile.mkdtemp(dir=home, prefix=UNPACK_PREFIX))
    try:
        ready = staged(source, files, tmp)
        missing = [e for e in source.expect if not (ready / e).exists()]
        if missing:
            raise DownloadError(f"The download of {source.dataset!r} lacks {missing[:4]} (expected under "
                                f"{source.target}/): not the dataset's official layout.")
        os.rename(ready, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


@contextlib.contextmanager
def home_lock(home: Path):
    """Hold an exclusive lock on the data home (flock on its folder) for a `fedbench data get`; a second one
    waits, saying so, then finds the dataset present."""
    home.mkdir(parents=True, exist_ok=True)
    fd = os.open(home, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another `fedbench data get` in {home} to finish ...", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without flock (some NFS mounts): go on unlocked
            pass
        yield
    finally:
        os.close(fd)  # releases the lock


# ---- the command ---------------------------------------------------------------------------------------------
def verified_download(f: RemoteFile, folder: Path, home: Path, progress: bool, say: Callable[[str], None]) -> str:
    """Download ``f`` into ``folder/<name>.part`` (resuming) and check it; returns its SHA-256."""
    say(f"downloading {f.urls[0]}")
    return verify(f, download(f, folder, progress), home)


def fetch(name: str, home: Path, mirror: str | None = None, checksums: dict[str, str] | None = None,
          progress: bool = True, say: Callable[[str], None] = print) -> Path:
    """Download, check and unpack dataset ``name`` into ``home``; returns where it now is."""
    source = source_of(name)
    if not source.fetchable:
        raise ManualDatasetError(manual_steps(source, home))
    if (home / source.target).exists():
        raise FedbenchError(f"{home / source.target} already exists: fedbench never replaces or deletes it; move it "
                            f"away and run again to download {name!r} there.")
    files = planned_files(source, mirror, checksums)
    home.mkdir(parents=True, exist_ok=True)
    folder = home / DOWNLOADS
    try:
        tell = lambda text: say(f"{name}: {text}")
        shas = {f.name: verified_download(f, folder, home, progress, tell) for f in files}
        done = {f.name: folder / f"{f.name}.part" for f in files}
        try:
            dest = install(source, done, home)
            record_first_use(home, files, shas, tell)
        finally:  # a download that did not unpack is not resumed either: the next run starts afresh
            for path in done.values():
                path.unlink(missing_ok=True)
    finally:
        if folder.exists() and not any(folder.iterdir()):
            folder.rmdir()
    return dest
