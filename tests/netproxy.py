"""A TCP proxy for fault tests, run in a thread of the test process: "one address" in front
of several web processes (round robin, skipping backends that refuse), and a link that can
be cut (``pause``: bytes are held, as in a network partition, and flow again on
``resume``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from tests.processes import free_port


class TcpProxy:
    """Listens on 127.0.0.1:``port`` and relays each connection to one of ``backends``."""

    def __init__(self, backends: list[int], port: int | None = None) -> None:
        self.backends = list(backends)
        self.port = port or free_port()
        self.connections = 0
        self._turn = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"proxy-{self.port}", daemon=True)
        self._flowing: asyncio.Event | None = None
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def start(self) -> TcpProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def pause(self) -> None:
        """Cut the link: nothing passes (new connections wait) until :meth:`resume`."""
        self._loop.call_soon_threadsafe(self._flowing.clear)

    def resume(self) -> None:
        self._loop.call_soon_threadsafe(self._flowing.set)

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._writers):
                writer.close()
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self._writers.add(client_w)
        try:
            await self._flowing.wait()
            upstream = await self._connect()
            if upstream is None:
                return
            up_r, up_w = upstream
            self._writers.add(up_w)
            self.connections += 1
            await asyncio.gather(self._pump(client_r, up_w), self._pump(up_r, client_w))
        finally:
            client_w.close()
            self._writers.discard(client_w)

    async def _connect(self):
        for _ in range(len(self.backends)):
            port = self.backends[self._turn % len(self.backends)]
            self._turn += 1
            try:
                return await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue
        return None

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            self._writers.discard(writer)
