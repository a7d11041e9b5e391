"""A scripted control plane for agent tests: a websocket server speaking the agent protocol
(fleet/protocol.py) that answers every hello with the desired set the test chose, can push a
new one, and records what agents send. No database, no planner: the test is the planner."""

from __future__ import annotations

import asyncio
import json
import threading
import time

from websockets.asyncio.server import serve

from fleet import protocol


class ScriptedControlPlane:
    """Runs in a thread of its own; ``url`` is what ``--server`` takes. ``desired`` (a list
    of AssignedReplica dicts) is sent on every hello and by :meth:`assign`."""

    def __init__(self) -> None:
        self.desired: list[dict] = []
        #: (session number, message) for every message received, in order.
        self.messages: list[tuple[int, dict]] = []
        self.sessions = 0
        self._connections: set = set()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "the scripted control plane did not start"
        self.url = f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        async with serve(self._handle, "127.0.0.1", 0) as server:
            self.port = server.sockets[0].getsockname()[1]
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()

    def _assign_message(self) -> str:
        return json.dumps({"type": "assign", "v": protocol.PROTOCOL_VERSION, "generation": int(time.time() * 1000),
                           "replicas": self.desired})

    async def _handle(self, ws) -> None:
        with self._lock:
            self.sessions += 1
            session = self.sessions
        try:
            async for raw in ws:
                message = json.loads(raw)
                with self._lock:
                    self.messages.append((session, message))
                if message.get("type") == "hello":
                    await ws.send(self._assign_message())
                    self._connections.add(ws)
        finally:
            self._connections.discard(ws)

    def assign(self, replicas: list[dict]) -> None:
        """Make ``replicas`` the desired set and send it to every connected agent."""
        self.desired = list(replicas)

        async def push() -> None:
            for ws in list(self._connections):
                await ws.send(self._assign_message())

        asyncio.run_coroutine_threadsafe(push(), self._loop).result(10)

    def reports(self, session: int | None = None) -> list[dict]:
        """Every replica report received (of ``session`` only, if given), oldest first."""
        with self._lock:
            messages = list(self.messages)
        return [r for s, m in messages if session is None or s == session
                for r in m.get("replicas") or [] if m.get("type") in ("hello", "status")]

    def hello(self, session: int) -> dict | None:
        with self._lock:
            return next((m for s, m in self.messages if s == session and m.get("type") == "hello"), None)

    def latest(self, replica_id: int, session: int | None = None) -> dict | None:
        """The last report about ``replica_id``."""
        found = [r for r in self.reports(session) if r.get("replica_id") == replica_id]
        return found[-1] if found else None

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
