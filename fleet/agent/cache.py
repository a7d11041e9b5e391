"""The agent's cache of ``mirror:NAME`` weights, fetched from the control plane over HTTP.

Layout under the cache root (``<state>/weights/mirror``)::

    NAME/files/PATH          verified weights, as the control plane's manifest lists them
    NAME/files/PATH.part     a download in progress; resumed with ``Range: bytes=N-``
    NAME/manifest.json       the control plane's manifest last fetched (used offline)
    NAME/verified.json       {PATH: {"sha256", "size", "mtime_ns"}} of files checked so far
    NAME/.last-used          touched on every use: the LRU order of eviction

Files are fetched in pieces (``Range: bytes=N-M``, 64 MiB by default): a server without
flow control (daphne queues a whole response in memory when the client reads slower than
the disk) then holds at most one piece per download.

A file counts as present when its verified record matches the manifest's sha256 and the
file's size and mtime have not moved since it was checked (so a file touched on disk is
hashed again, and fetched again if its bytes changed). A downloaded file whose sha256 does
not match is deleted and fetched once more before giving up.

The cache has a size limit (bytes, 0 = none): before a download it evicts whole weights,
least recently used first, never ones an engine uses or another download is fetching.
Blocking code (httpx's sync client): the agent runs it with ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import quote

import httpx


log = logging.getLogger(__name__)


class WeightsError(RuntimeError):
    """The weights cannot be had; the message says why, for the operator."""


CHUNK = 1024 * 1024
PIECE = 64 * 1024 * 1024
#: ``progress(done_bytes, total_bytes)`` of one weights' download (all its files).
Progress = Callable[[int, int], None]


def http_base(server: str) -> str:
    """The control plane's HTTP base URL from the agent's ``--server`` (ws:// or http://)."""
    base = server.rstrip("/")
    for ws, http in (("ws://", "http://"), ("wss://", "https://")):
        if base.startswith(ws):
            base = http + base[len(ws):]
    base = base.removesuffix("/ws/agent")
    if "//" not in base:
        base = "http://" + base
    return base


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


class WeightsCache:
    """Mirrored weights on this machine. ``max_bytes``: the size limit (0 = none);
    ``in_use()``: names engines use now, never evicted; ``transport``: httpx transport
    (tests); ``retries``: how often an interrupted download resumes before giving up;
    ``piece_bytes``: the most one request asks for."""

    def __init__(self, root: Path, max_bytes: int = 0, in_use: Callable[[], Iterable[str]] | None = None,
                 transport: httpx.BaseTransport | None = None, retries: int = 3, retry_pause_s: float = 0.5,
                 progress_interval_s: float = 0.25, piece_bytes: int = PIECE) -> None:
        self.root = Path(root)
        self.max_bytes = max(0, int(max_bytes))
        self.in_use = in_use or (lambda: ())
        self.transport = transport
        self.retries = retries
        self.retry_pause_s = retry_pause_s
        self.progress_interval_s = progress_interval_s
        self.piece_bytes = max(1, int(piece_bytes))
        self._lock = threading.Lock()
        self._name_locks: dict[str, threading.Lock] = {}
        self._fetching: set[str] = set()

    # -- public ----------------------------------------------------------------------------
    def fetch(self, name: str, server: str, token: str, progress: Progress | None = None) -> Path:
        """A local path to mirrored weights ``name`` (the manifest's entry file, or the
        directory), downloading what is missing or damaged. Raises WeightsError."""
        if not name or "/" in name or name.startswith("."):
            raise WeightsError(f"{name!r} is not a mirror name")
        with self._lock:
            name_lock = self._name_locks.setdefault(name, threading.Lock())
            self._fetching.add(name)
        try:
            with name_lock, self._client(server, token) as client:
                path = self._fetch(client, name, progress)
            self.touch(name)
            return path
        finally:
            with self._lock:
                self._fetching.discard(name)

    def touch(self, name: str) -> None:
        """Record a use of ``name`` (the LRU order)."""
        marker = self.root / name / ".last-used"
        with contextlib.suppress(OSError):
            marker.touch()
            os.utime(marker)

    def entries(self) -> list[tuple[str, int, float]]:
        """(name, bytes on disk, last use as a timestamp) of every cached weights."""
        out = []
        if not self.root.is_dir():
            return out
        for path in self.root.iterdir():
            if path.is_dir():
                marker = path / ".last-used"
                used = marker.stat().st_mtime if marker.exists() else path.stat().st_mtime
                out.append((path.name, _disk_bytes(path), used))
        return out

    def usage(self) -> int:
        return sum(size for _, size, _ in self.entries())

    def make_room(self, need: int, keep: Iterable[str] = ()) -> list[str]:
        """Evict least recently used weights until ``need`` more bytes fit under the limit;
        returns the evicted names. Weights in ``keep``, in use by an engine or being
        fetched are never evicted. Raises WeightsError when even that is not enough."""
        if not self.max_bytes:
            return []
        with self._lock:
            protected = set(keep) | set(self.in_use()) | self._fetching
            entries = sorted(self.entries(), key=lambda e: e[2])
            used = sum(size for _, size, _ in entries)
            evicted = []
            for name, size, _ in entries:
                if used + need <= self.max_bytes:
                    break
                if name in protected:
                    continue
                shutil.rmtree(self.root / name, ignore_errors=True)
                used -= size
                evicted.append(name)
                log.info("evicted mirror:%s from the weights cache (%s, least recently used)", name, _gib(size))
            if used + need > self.max_bytes:
                held = sorted(n for n, _, _ in entries if n in protected and (self.root / n).exists())
                raise WeightsError(
                    f"the weights cache needs {_gib(need)} more but holds {_gib(used)} of its "
                    f"{_gib(self.max_bytes)} limit in weights in use ({', '.join(held) or 'none'}); "
                    "raise --cache-max-gib"
                )
            return evicted

    # -- one weights -----------------------------------------------------------------------
    def _client(self, server: str, token: str) -> httpx.Client:
        return httpx.Client(base_url=http_base(server), headers={"Authorization": f"Bearer {token}"},
                            timeout=httpx.Timeout(30.0, connect=10.0), transport=self.transport)

    def _fetch(self, client: httpx.Client, name: str, progress: Progress | None) -> Path:
        home = self.root / name
        files_dir = home / "files"
        try:
            manifest = self._manifest(client, name)
        except _Unreachable as exc:
            local = self._local_manifest(home)
            if local is not None and all(self._present(home, f) for f in local["files"]):
                log.warning("control plane unreachable (%s): using the cached mirror:%s", exc, name)
                return _entry_path(files_dir, local)
            raise WeightsError(f"could not reach the control plane for mirror:{name}: {exc}") from None
        files = manifest["files"]
        total = sum(int(f["size"]) for f in files)
        todo = [f for f in files if not self._present(home, f)]
        if todo:
            partial = sum(_size(files_dir / (f["path"] + ".part")) for f in todo)
            need = sum(int(f["size"]) for f in todo) - partial
            if self.max_bytes and total > self.max_bytes:
                raise WeightsError(f"mirror:{name} ({_gib(total)}) is larger than the weights cache limit "
                                   f"({_gib(self.max_bytes)}); raise --cache-max-gib")
            self.make_room(need, keep={name})
            files_dir.mkdir(parents=True, exist_ok=True)
            meter = _Meter(total - sum(int(f["size"]) for f in todo), total, progress, self.progress_interval_s)
            for f in todo:
                self._download(client, name, home, f, meter)
            meter.report(force=True)
        elif progress:
            progress(total, total)
        self._forget_others(home, files)
        (home / "manifest.json").write_text(json.dumps(manifest))
        return _entry_path(files_dir, manifest)

    def _manifest(self, client: httpx.Client, name: str) -> dict:
        try:
            response = client.get(f"/mirror/{quote(name)}/")
        except httpx.TransportError as exc:
            raise _Unreachable(str(exc) or type(exc).__name__) from None
        _check_status(response, name, "")
        try:
            manifest = response.json()
            for f in manifest["files"]:
                if not f["path"] or f["path"].startswith("/") or ".." in f["path"].split("/"):
                    raise ValueError(f"unsafe path {f['path']!r}")
                if int(f["size"]) < 0 or len(f["sha256"]) != 64:
                    raise ValueError(f"bad size or sha256 for {f['path']!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise WeightsError(f"the control plane's manifest of mirror:{name} is not usable: {exc}") from None
        return manifest

    def _download(self, client: httpx.Client, name: str, home: Path, f: dict, meter: _Meter) -> None:
        """Fetch one file to PATH.part (resuming), verify its sha256, rename it into place;
        a mismatch deletes it and fetches it once more."""
        rel, size, expected = f["path"], int(f["size"]), f["sha256"]
        final = home / "files" / rel
        part = final.with_name(final.name + ".part")
        part.parent.mkdir(parents=True, exist_ok=True)
        part.touch()  # (an empty file needs no request, but a .part to rename)
        for attempt in (1, 2):
            digest = self._download_part(client, name, rel, size, expected, part, meter)
            if digest == expected:
                part.replace(final)
                self._record_verified(home, rel, expected, final)
                meter.file_finished(size)
                return
            meter.at_file_offset(0)
            part.unlink(missing_ok=True)
            if attempt == 1:
                log.warning("mirror:%s/%s: sha256 mismatch (%s, expected %s); fetching it again",
                            name, rel, digest, expected)
        raise WeightsError(f"mirror:{name}/{rel}: sha256 still wrong after fetching it again "
                           f"(got {digest}, manifest says {expected})")

    def _download_part(self, client: httpx.Client, name: str, rel: str, size: int, expected: str,
                       part: Path, meter: _Meter) -> str:
        """Bring ``part`` to ``size`` bytes, piece by piece, resuming after interruptions;
        returns its sha256."""
        digest, hashed = hashlib.sha256(), 0
        tries = 0
        while True:
            have = _size(part)
            if have > size:
                part.unlink()
                have = 0
            if hashed != have:  # (re)read what is on disk: the digest covers exactly the file
                digest, hashed = _hash_prefix(part, have)
                meter.at_file_offset(have)
            if have == size:
                return digest.hexdigest()
            last = min(have + self.piece_bytes, size) - 1
            headers = {"If-Range": f'"{expected}"', "Range": f"bytes={have}-{last}"}
            try:
                with client.stream("GET", f"/mirror/{quote(name)}/{quote(rel)}", headers=headers) as response:
                    if response.status_code == 416:
                        part.unlink(missing_ok=True)
                        raise httpx.RemoteProtocolError("the control plane refused the resume offset")
                    _check_status(response, name, rel)
                    etag = response.headers.get("ETag")
                    if etag and etag != f'"{expected}"':
                        part.unlink(missing_ok=True)
                        raise WeightsError(f"mirror:{name}/{rel} changed on the control plane during the "
                                           "download; the next attempt fetches the new version")
                    mode = "ab"
                    if response.status_code == 200:
                        mode, have = "wb", 0  # the server sent the whole file: take it from the start
                        digest, hashed = hashlib.sha256(), 0
                        meter.at_file_offset(0)
                    elif response.status_code == 206 and not response.headers.get(
                            "Content-Range", "").startswith(f"bytes {have}-"):
                        raise WeightsError(f"mirror:{name}/{rel}: the control plane answered another range "
                                           f"({response.headers.get('Content-Range')}) than bytes {have}-")
                    with open(part, mode) as out:
                        for chunk in response.iter_raw():
                            out.write(chunk)
                            digest.update(chunk)
                            hashed += len(chunk)
                            meter.add(len(chunk))
            except httpx.TransportError as exc:
                tries += 1
                if tries > self.retries:
                    raise WeightsError(
                        f"download of mirror:{name}/{rel} interrupted at {_size(part)} of {size} bytes "
                        f"({exc or type(exc).__name__}); the next attempt resumes there") from None
                log.warning("download of mirror:%s/%s interrupted at %d of %d bytes (%s); resuming",
                            name, rel, _size(part), size, exc or type(exc).__name__)
                time.sleep(self.retry_pause_s * tries)
                continue
            if _size(part) > have:
                tries = 0  # the retry budget is per stall, not per file
            else:
                tries += 1  # a complete answer with no bytes: do not spin forever
                if tries > self.retries:
                    raise WeightsError(f"mirror:{name}/{rel}: the control plane sent no bytes at {have} of {size}")

    # -- what is on disk ---------------------------------------------------------------------
    def _present(self, home: Path, f: dict) -> bool:
        """True if file ``f`` of the manifest is here and verified; a file whose size or
        mtime moved since it was verified is hashed again (and deleted if wrong)."""
        path = home / "files" / f["path"]
        try:
            st = path.stat()
        except OSError:
            return False
        record = self._verified(home).get(f["path"])
        if record and record.get("sha256") == f["sha256"] and record.get("size") == st.st_size \
                and record.get("mtime_ns") == st.st_mtime_ns:
            return True
        if st.st_size == int(f["size"]) and _sha256(path) == f["sha256"]:
            self._record_verified(home, f["path"], f["sha256"], path)
            return True
        log.warning("mirror:%s/%s on disk does not match the manifest: fetching it again", home.name, f["path"])
        path.unlink(missing_ok=True)
        return False

    @staticmethod
    def _verified(home: Path) -> dict:
        try:
            return json.loads((home / "verified.json").read_text())
        except (OSError, ValueError):
            return {}

    def _record_verified(self, home: Path, rel: str, sha256: str, path: Path) -> None:
        st = path.stat()
        records = self._verified(home)
        records[rel] = {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        tmp = home / "verified.json.tmp"
        tmp.write_text(json.dumps(records))
        tmp.replace(home / "verified.json")

    @staticmethod
    def _local_manifest(home: Path) -> dict | None:
        try:
            return json.loads((home / "manifest.json").read_text())
        except (OSError, ValueError):
            return None

    def _forget_others(self, home: Path, files: list[dict]) -> None:
        """Delete files of an older version that the manifest no longer lists."""
        wanted = {f["path"] for f in files}
        files_dir = home / "files"
        for path in sorted(files_dir.rglob("*"), reverse=True):
            rel = path.relative_to(files_dir).as_posix()
            if path.is_file() and rel not in wanted:
                path.unlink(missing_ok=True)
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()
        records = self._verified(home)
        if set(records) - wanted:
            (home / "verified.json").write_text(json.dumps({k: v for k, v in records.items() if k in wanted}))


class _Unreachable(Exception):
    pass


class _Meter:
    """Bytes done of one weights' download, reported at most every ``interval_s``."""

    def __init__(self, base: int, total: int, progress: Progress | None, interval_s: float) -> None:
        self.base, self.file_done, self.total = base, 0, total
        self.progress, self.interval_s = progress, interval_s
        self.last = 0.0

    def at_file_offset(self, offset: int) -> None:
        self.file_done = offset
        self.report()

    def add(self, n: int) -> None:
        self.file_done += n
        self.report()

    def report(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.progress and (force or now - self.last >= self.interval_s):
            self.last = now
            self.progress(min(self.base + self.file_done, self.total), self.total)

    def file_finished(self, size: int) -> None:
        self.base += size
        self.file_done = 0


def _check_status(response: httpx.Response, name: str, rel: str) -> None:
    what = f"mirror:{name}" + (f"/{rel}" if rel else "")
    if response.status_code in (200, 206):
        return
    if response.status_code in (401, 403):
        raise WeightsError(f"the control plane refused this agent's token fetching {what} (HTTP {response.status_code})")
    if response.status_code == 404:
        raise WeightsError(f"the control plane has no {what} (llmgw mirror list)")
    raise WeightsError(f"the control plane answered HTTP {response.status_code} for {what}")


def _entry_path(files_dir: Path, manifest: dict) -> Path:
    entry = manifest.get("entry") or ""
    return files_dir / entry if entry else files_dir


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _hash_prefix(path: Path, length: int):
    digest = hashlib.sha256()
    left = length
    if left:
        with open(path, "rb") as fh:
            while left and (chunk := fh.read(min(CHUNK, left))):
                digest.update(chunk)
                left -= len(chunk)
    return digest, length - left


def _sha256(path: Path) -> str:
    digest, _ = _hash_prefix(path, path.stat().st_size)
    return digest.hexdigest()
