"""Readiness proves identity (docs/architecture.md, "Decisions"), with real engine processes
and no control plane: another process on an engine's port is a failed start on that port,
named, and retried on another port — never ready there; an engine serving another model
name is never ready."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fleet.agent import sockets
from fleet.agent.engines import AgentConfig, EngineManager
from fleet.states import ReplicaState as S

FAKE_ENGINE = str(Path(__file__).parent.parent / "fake_engine.py")

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="Linux /proc only")]


def spec(replica_id: int, *args: str, served_name: str = "fake-model", timeout_s: int = 30) -> dict:
    return {
        "replica_id": replica_id, "served_name": served_name, "weights": "file:/dev/null",
        "command": (f"{sys.executable} {FAKE_ENGINE} --host {{host}} --port {{port}} --api-key {{api_key}} "
                    + " ".join(args)),
        "env": {}, "gpu_indices": [], "cpu_cores": 1, "readiness_path": "/v1/models",
        "startup_timeout_s": timeout_s, "metrics_path": "", "metric_running": "", "metric_waiting": "",
        "api_key": f"key-{replica_id}",
    }


class Recorder:
    """Every report the manager would send, in order."""

    def __init__(self):
        self.manager: EngineManager | None = None
        self.seen: list[dict] = []

    def __call__(self):
        if self.manager is not None:
            self.seen += [dict(r) for r in self.manager.reports()]


@pytest.fixture
async def managed(tmp_path):
    recorder = Recorder()
    config = AgentConfig(state_dir=tmp_path / "agent", port_min=21300, port_max=21399, stop_grace_s=1,
                         readiness_poll_s=0.05, readiness_watch_s=0.2)
    manager = EngineManager(config, on_change=recorder)
    recorder.manager = manager
    yield manager, recorder
    await manager.stop_all()
    await manager.close()


async def wait_for(predicate, timeout_s: float = 30, what: str = "condition"):
    for _ in range(int(timeout_s / 0.02)):
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Impostor(BaseHTTPRequestHandler):
    """Answers every GET as the right engine would (200, the right model name): only the
    identity check can tell it is not the replica's engine."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = json.dumps({"object": "list", "data": [{"id": "fake-model", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("engine_on_bind_error", ["exits", "stays"])
async def test_another_process_on_the_engines_port_fails_that_port_and_the_start_moves_on(managed,
                                                                                         engine_on_bind_error):
    """The port is taken after the agent picked it and before the engine binds (the race
    the pick cannot close): by this test process, answering readiness like the engine."""
    manager, recorder = managed
    extra = ["--startup-delay-s", "1.0"] + (["--stay-on-bind-error"] if engine_on_bind_error == "stays" else [])
    manager.apply([spec(1, *extra)])
    engine = manager.engines[1]
    first_port = await wait_for(lambda: engine.state == S.STARTING and engine.port, what="a port to be picked")
    first_pid = engine.pid
    impostor = ThreadingHTTPServer(("127.0.0.1", first_port), Impostor)
    thread = threading.Thread(target=impostor.serve_forever, daemon=True)
    thread.start()
    try:
        await wait_for(lambda: engine.state == S.READY, timeout_s=60, what="the replica ready on another port")
    finally:
        impostor.shutdown()
        impostor.server_close()
    assert engine.port != first_port and engine.pid != first_pid
    assert not engine.error  # ready: the port trouble is behind it
    taken = f"port {first_port} taken by pid {os.getpid()} ({sockets.process_name(os.getpid())})"
    assert any(taken in r["error"] for r in recorder.seen), recorder.seen
    assert not [r for r in recorder.seen if r["state"] == "ready" and r["port"] == first_port]  # never a route there
    assert not os.path.exists(f"/proc/{first_pid}")  # the first engine was stopped, not left waiting
    holders = sockets.port_holders(engine.port, engine.host, engine.pid)
    assert holders.ours and not holders.foreign


async def test_a_start_that_finds_every_port_taken_fails_naming_them(tmp_path):
    config = AgentConfig(state_dir=tmp_path / "agent", port_min=21400, port_max=21499, stop_grace_s=1,
                         readiness_poll_s=0.05)
    manager = EngineManager(config, on_change=lambda: None)
    held: list[socket.socket] = []

    def take_every_picked_port():
        engine = manager.engines.get(1)
        if engine is not None and engine.port and engine.state == S.STARTING and engine.port not in [
                s.getsockname()[1] for s in held]:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", engine.port))
            sock.listen()  # accepts, never answers: only who listens tells
            held.append(sock)
        return engine is not None and engine.state == S.FAILED

    try:
        manager.apply([spec(1, "--startup-delay-s", "1.0")])
        await wait_for(take_every_picked_port, timeout_s=60, what="the start to fail")
        error = manager.engines[1].error
        ports = [s.getsockname()[1] for s in held]
        assert len(ports) == 3
        for port in ports:
            assert f"port {port} taken by pid {os.getpid()}" in error
        assert "gave up after 3 ports" in error
    finally:
        await manager.stop_all()
        await manager.close()
        for sock in held:
            sock.close()


async def test_an_engine_serving_another_model_name_is_never_ready(managed):
    manager, recorder = managed
    manager.apply([spec(1, "--served-name", "other-model")])
    engine = manager.engines[1]
    await wait_for(lambda: engine.state == S.FAILED, what="the start to fail")
    assert "the engine serves ['other-model'], not 'fake-model'" in engine.error
    assert not [r for r in recorder.seen if r["state"] == "ready"]
    assert not engine.alive()
