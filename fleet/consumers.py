"""The agents' websocket at ``/ws/agent/``: token checked on connect, then hello, status and
heartbeats in; the full desired set (``assign``) and ``restart_agent`` out."""

from __future__ import annotations

import logging
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from fleet import protocol, reports
from fleet.live import watcher

log = logging.getLogger(__name__)

REFUSED_CLOSE_CODE = 4401


def agent_group(agent_id: int) -> str:
    return f"agent.{agent_id}"


def _token_from_scope(scope) -> str:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            text = value.decode("latin-1")
            if text.lower().startswith("bearer "):
                return text[7:].strip()
    query = parse_qs(scope.get("query_string", b"").decode())
    return (query.get("token") or [""])[0]


class AgentConsumer(AsyncJsonWebsocketConsumer):
    """One connected agent."""

    agent_id: int = 0
    sent_generation: int = -1
    restart_generation: int = 0
    session: str = ""

    async def connect(self) -> None:
        token = _token_from_scope(self.scope)
        agent = await database_sync_to_async(reports.authenticate)(token)
        if agent is None:
            client = self.scope.get("client") or ("?", 0)
            log.warning("refused agent connection from %s: missing or unknown token", client[0])
            await self.close(code=REFUSED_CLOSE_CODE)
            return
        self.agent_id = agent.id
        self.agent_name = agent.name
        self.restart_generation = agent.restart_generation  # only later requests restart it
        await self.accept()
        self.session = await database_sync_to_async(reports.mark_connected)(agent.id)
        if self.channel_layer is not None:
            await self.channel_layer.group_add(agent_group(agent.id), self.channel_name)
        watcher.register_agent(self)
        watcher.ensure_started()
        log.info("agent %s connected", agent.name)

    async def disconnect(self, code: int) -> None:
        if not self.agent_id:
            return
        watcher.unregister_agent(self)
        if self.channel_layer is not None:
            await self.channel_layer.group_discard(agent_group(self.agent_id), self.channel_name)
        await database_sync_to_async(reports.mark_disconnected)(self.agent_id, self.session)
        log.info("agent %s disconnected (code %s)", self.agent_name, code)

    async def receive_json(self, content, **kwargs) -> None:
        try:
            message = protocol.check_message(content, protocol.AGENT_MESSAGES)
        except protocol.ProtocolError as exc:
            log.warning("agent %s sent a bad message: %s", self.agent_name, exc)
            await self.send_json({"type": "error", "v": protocol.PROTOCOL_VERSION, "message": str(exc)})
            return
        try:
            await self._handle(message)
        except Exception:  # a bad report must not cost the agent its connection
            log.exception("could not apply a %s message from agent %s", message.get("type"), self.agent_name)
            await self.send_json({"type": "error", "v": protocol.PROTOCOL_VERSION,
                                  "message": f"could not apply your {message.get('type')} message"})

    async def _handle(self, message: dict) -> None:
        kind = message["type"]
        if kind == "heartbeat":
            await database_sync_to_async(reports.touch)(self.agent_id)
        elif kind == "hello":
            await database_sync_to_async(reports.record_hello)(self.agent_id, message)
            await self.push_assign(force=True)
        elif kind == "status":
            await database_sync_to_async(reports.touch)(self.agent_id)
            await database_sync_to_async(reports.record_status)(self.agent_id, message)

    async def decode_json(self, text_data):
        try:
            return await super().decode_json(text_data)
        except ValueError:
            return None

    async def push_assign(self, force: bool = False) -> None:
        """Send the full desired set if it moved since the last one sent (or if forced)."""
        assign = await database_sync_to_async(reports.desired_set)(self.agent_id)
        if force or assign["generation"] != self.sent_generation:
            self.sent_generation = assign["generation"]
            await self.send_json(assign)

    # Channel-layer events (Redis nudges from the reconciler, restart from the CLI).
    async def agent_assign(self, event) -> None:
        await self.push_assign()

    async def agent_restart(self, event) -> None:
        await self.send_restart()

    async def send_restart(self) -> None:
        log.info("asking agent %s to restart", self.agent_name)
        await self.send_json(protocol.restart_agent())
