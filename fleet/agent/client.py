"""The agent's connection to the control plane: hello, heartbeats and status out; assign and
restart_agent in. Reconnects with capped exponential backoff; engines keep running while
the control plane is away."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import sys
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus, WebSocketException

from fleet import protocol
from fleet.agent import VERSION
from fleet.agent.engines import AgentConfig, EngineManager
from fleet.agent.inventory import current_gpus, read_inventory
from fleet.agent.processes import StateDirInUse, hold_state_dir

log = logging.getLogger("llmgw.agent")


@dataclass
class ClientOptions:
    """How to reach the control plane. ``server``: ws(s)://host:port; durations in s."""

    server: str
    token: str
    name: str = ""
    advertise_address: str = ""
    heartbeat_s: float = 5.0
    #: How often a heartbeat carries every GPU's reading (memory, utilisation, temperature).
    gpu_readings_s: float = 15.0
    backoff_max_s: float = 10.0
    stop_engines_on_exit: bool = False


class Agent:
    """One agent process: an EngineManager and the websocket session loop."""

    def __init__(self, options: ClientOptions, config: AgentConfig) -> None:
        self.options = options
        self.config = config
        self._status_due = asyncio.Event()
        self.manager = EngineManager(config, on_change=self._status_due.set, server_url=options.server,
                                     token=options.token)
        self._stop = asyncio.Event()
        self._restart = False

    @property
    def url(self) -> str:
        """The websocket URL: ``--server`` as ws(s)://, without any query string, fragment
        or ``user:password@`` (credentials travel only in the Authorization header; a URL
        is written to access logs)."""
        parts = urlsplit(self.options.server.strip())
        scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
        netloc = parts.netloc.rsplit("@", 1)[-1]
        return urlunsplit((scheme, netloc, parts.path.rstrip("/") + "/ws/agent/", "", ""))

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> int:
        """Run until stopped; returns the process exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, self.request_stop)
        adopted = await self.manager.adopt()
        if adopted:
            log.info("adopted %d running engine(s)", adopted)
        backoff = 0.5
        stopper = asyncio.create_task(self._stop.wait())
        try:
            while not self._stop.is_set():
                session = asyncio.create_task(self._session())
                done, _ = await asyncio.wait({session, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if session in done:
                    try:
                        session.result()
                        backoff = 0.5
                    except InvalidStatus as exc:
                        log.error("control plane refused this agent (HTTP %s): check --token",
                                  exc.response.status_code)
                    except (OSError, WebSocketException, asyncio.TimeoutError) as exc:
                        log.warning("control plane unreachable (%s); retrying in %.1f s", exc or type(exc).__name__, backoff)
                    if self._restart:
                        break
                else:
                    session.cancel()
                    with contextlib.suppress(BaseException):
                        await session
                    break
                try:
                    # asyncio.timeout, not wait_for: Python 3.11's wait_for can drop a cancel
                    # that arrives as the wait ends (CPython gh-86296), and shutdown cancels.
                    async with asyncio.timeout(backoff * (0.8 + 0.4 * random.random())):
                        await self._stop.wait()
                except asyncio.TimeoutError:
                    pass
                backoff = min(backoff * 2, self.options.backoff_max_s)
        finally:
            stopper.cancel()
            if self._restart:
                await self.manager.close()
                self._reexec()
            if self.options.stop_engines_on_exit:
                log.info("stopping engines before exit")
                await self.manager.stop_all()
            else:
                self.manager.save_state()
            await self.manager.close()
        return 0

    async def _session(self) -> None:
        headers = {"Authorization": f"Bearer {self.options.token}"}
        async with connect(self.url, additional_headers=headers, open_timeout=10,
                           ping_interval=20, ping_timeout=20, max_size=16 * 1024 * 1024) as ws:
            address = self.options.advertise_address or ws.local_address[0]
            self.manager.advertise(address)  # engines listen where the gateway will look
            log.info("connected to %s as %s", self.url, address)
            hello: protocol.Hello = {
                "type": "hello", "v": protocol.PROTOCOL_VERSION,
                "name": self.options.name, "version": VERSION, "address": address,
                "inventory": await asyncio.to_thread(read_inventory),
                "replicas": self.manager.reports(),
            }
            await ws.send(json.dumps(hello))
            self.manager.sent(hello["replicas"])
            sender = asyncio.create_task(self._send_loop(ws))
            try:
                async for raw in ws:
                    try:
                        message = protocol.check_message(json.loads(raw), protocol.SERVER_MESSAGES)
                    except (ValueError, protocol.ProtocolError) as exc:
                        log.warning("ignoring a message from the control plane: %s", exc)
                        continue
                    if message["type"] == "assign":
                        self.manager.apply(message["replicas"])
                    elif message["type"] == "restart_agent":
                        log.info("restart requested by the control plane: re-executing")
                        self._restart = True
                        return
            finally:
                sender.cancel()
                with contextlib.suppress(BaseException):
                    await sender

    async def _send_loop(self, ws) -> None:
        """A status whenever something changed; otherwise a heartbeat every ``heartbeat_s``
        that carries every ready replica's load as last read from its engine's metrics (the
        engine manager reads them every ``load_poll_s`` whether or not they change), so the
        control plane's load stamp stays fresh while the load is steady (docs/architecture.md,
        R7 and "Agent protocol": heartbeat). At most every ``gpu_readings_s`` a heartbeat also
        carries every GPU's reading (``protocol.GpuReading``); a machine without GPUs sends none."""
        readings_at = asyncio.get_running_loop().time()  # the hello carried the first reading
        while True:
            try:
                async with asyncio.timeout(self.options.heartbeat_s):  # not wait_for (gh-86296)
                    await self._status_due.wait()
            except asyncio.TimeoutError:
                gpus = None
                now = asyncio.get_running_loop().time()
                if now - readings_at >= self.options.gpu_readings_s:
                    readings_at = now
                    gpus = await self._gpu_readings()
                await ws.send(json.dumps(protocol.heartbeat(protocol.loads_of(self.manager.reports()), gpus)))
                continue
            self._status_due.clear()
            status: protocol.Status = {
                "type": "status", "v": protocol.PROTOCOL_VERSION,
                "replicas": self.manager.reports(), "inventory": await asyncio.to_thread(read_inventory),
            }
            await ws.send(json.dumps(status))
            self.manager.sent(status["replicas"])
            await asyncio.sleep(0.05)  # coalesce bursts of changes

    async def _gpu_readings(self) -> list[protocol.GpuReading]:
        """Every GPU's reading now (read in a thread: NVML blocks); [] if it cannot be read."""
        try:
            return protocol.readings_of(await asyncio.to_thread(current_gpus))
        except Exception as exc:  # noqa: BLE001 (a reading must never end the session)
            log.warning("could not read the GPUs for a heartbeat: %s", exc)
            return []

    def _reexec(self) -> None:
        """Replace this process with a fresh agent; engines keep running and are adopted."""
        self.manager.save_state()
        logging.shutdown()
        os.execv(sys.executable, [sys.executable] + sys.argv)


def run_agent(options: ClientOptions, config: AgentConfig) -> int:
    """Entry point used by ``manage.py llmgw agent`` and ``python -m fleet.agent``. Returns
    the exit code: 2, before anything is adopted or started, while another agent process
    holds the state directory (:func:`fleet.agent.processes.hold_state_dir`)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s agent: %(message)s")
    # Its state file, engine logs and weights (and what engines write) stay private to this user.
    os.umask(os.umask(0o077) | 0o077)
    try:
        hold_state_dir(config.state_dir)  # held until this process exits or re-executes
    except StateDirInUse as exc:
        log.error("%s", exc)
        return 2
    except OSError as exc:
        log.error("cannot take the state directory %s: %s", config.state_dir, exc)
        return 2
    return asyncio.run(Agent(options, config).run())
