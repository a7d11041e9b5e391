"""The agents' websocket at ``/ws/agent/``: token checked on connect, then hello, status and
heartbeats in; the full desired set (``assign``) and ``restart_agent`` out.

What an agent may not do (docs/architecture.md, "Agent protocol" and "Security"): authenticate
other than with ``Authorization: Bearer`` (query strings end up in access logs); keep its
socket once its token was re-keyed or it was deleted (``fleet.groups.revoke_sessions`` closes
it through the channel layer, and the consumer re-checks its token on heartbeats for when no
shared layer reaches it); advertise an address that is not an IP or host name; take the
consumer down with binary frames or pathological JSON. If the consumer fails anyway, the
agent's row is marked disconnected and the socket closed, so a row never says connected without
a live socket.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import time

from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.db import DatabaseError, InterfaceError

from llmgw import tokens
from fleet import protocol
from fleet.groups import agent_group
from fleet.control import reports
from fleet.live.watch import heartbeats, watcher
from fleet.states import ReplicaState

log = logging.getLogger(__name__)

#: Close codes an agent may see (4000–4999 are the application's own).
REFUSED_CLOSE_CODE = 4401  # missing or unknown token (before accept: HTTP 403)
BAD_HELLO_CLOSE_CODE = 4400  # a hello the control plane will not record (bad address)
REVOKED_CLOSE_CODE = 4403  # its token was re-keyed, or the agent was deleted
FAILED_CLOSE_CODE = 1011  # the consumer failed; the agent reconnects
#: Seconds between two heartbeats' GPU readings written for one agent, at least: agents send
#: them every 15 s; one sending faster gets no more database writes.
GPU_READINGS_EVERY_S = 5.0


def _token_from_scope(scope) -> str:
    """The token of ``Authorization: Bearer TOKEN``, or "". Only the header: a token in the
    query string (``?token=``) is ignored, since URLs are written to access logs."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            token = tokens.token_from_authorization(value.decode("latin-1"))
            if token is not None:
                return token
    return ""


def _peer_is_loopback(scope) -> bool:
    """Whether the agent connected over loopback. No client address at all (a unix socket,
    an in-process test) counts as local."""
    client = scope.get("client")
    if not client or not client[0]:
        return True
    try:
        ip = ipaddress.ip_address(client[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


class AgentConsumer(AsyncJsonWebsocketConsumer):
    """One connected agent."""

    agent_id: int = 0
    agent_name: str = "?"
    sent_generation: int = -1
    restart_generation: int = 0
    session: str = ""
    #: The hash of the token it connected with: a re-key or delete makes it stale.
    token_sha256: str = ""
    _checked_at: float = 0.0
    _gpu_readings_at: float = float("-inf")
    _hello_at: float | None = None
    _closed: bool = False
    _cleaned: bool = False

    async def dispatch(self, message) -> None:
        """Channels' dispatch, with the rule that a failing consumer leaves no trace of a
        live connection: any exception marks the agent disconnected, closes the socket
        (1011) and ends this consumer; the agent reconnects."""
        try:
            await super().dispatch(message)
        except StopConsumer:
            raise
        except Exception:
            log.exception("agent %s: the websocket consumer failed; closing the connection", self.agent_name)
            try:
                await self._cleanup()
            except Exception:
                log.warning("agent %s: could not mark it disconnected", self.agent_name, exc_info=True)
            if not self._closed:
                self._closed = True
                try:
                    await self.close(code=FAILED_CLOSE_CODE)
                except Exception:
                    pass
            raise StopConsumer() from None

    async def connect(self) -> None:
        token = _token_from_scope(self.scope)
        agent = await database_sync_to_async(reports.authenticate)(token)
        if agent is None:
            client = self.scope.get("client") or ("?", 0)
            why = "no Authorization: Bearer header" if not token else "unknown token"
            log.warning("refused agent connection from %s: %s", client[0], why)
            self._closed = True
            await self.close(code=REFUSED_CLOSE_CODE)
            return
        self.agent_id = agent.id
        self.agent_name = agent.name
        self.token_sha256 = agent.token_sha256
        self.restart_generation = agent.restart_generation  # only later requests restart it
        # Join the group before the last token check: a re-key in between is either seen
        # by the check or delivered to the group.
        if self.channel_layer is not None:
            await self.channel_layer.group_add(agent_group(agent.id), self.channel_name)
        await self.accept()
        self.session = await database_sync_to_async(reports.mark_connected)(agent.id)
        watcher.register_agent(self)
        watcher.ensure_started()
        self._checked_at = time.monotonic()
        if not await database_sync_to_async(reports.token_still_valid)(agent.id, self.token_sha256):
            await self._drop("its token was re-keyed or the agent deleted", REVOKED_CLOSE_CODE)
            return
        log.info("agent %s connected", agent.name)

    async def _cleanup(self) -> None:
        """Forget this connection (once): watcher, group, and the row says disconnected."""
        if self._cleaned or not self.agent_id:
            return
        self._cleaned = True
        watcher.unregister_agent(self)
        if self.channel_layer is not None:
            await self.channel_layer.group_discard(agent_group(self.agent_id), self.channel_name)
        await database_sync_to_async(reports.mark_disconnected)(self.agent_id, self.session)

    async def _drop(self, why: str, code: int) -> None:
        """Close the connection from this end with ``code`` and ``why`` as the reason."""
        log.warning("closing the connection of agent %s: %s", self.agent_name, why)
        await self._cleanup()
        if not self._closed:
            self._closed = True
            await self.close(code=code, reason=why[:120])  # a close reason is at most 123 bytes

    async def disconnect(self, code: int) -> None:
        if not self.agent_id:
            return
        await self._cleanup()
        log.info("agent %s disconnected (code %s)", self.agent_name, code)

    async def _error(self, why: str) -> None:
        log.warning("agent %s sent a bad message: %s", self.agent_name, why)
        await self.send_json({"type": "error", "v": protocol.PROTOCOL_VERSION, "message": why})

    async def websocket_receive(self, message) -> None:
        await self.receive(text_data=message.get("text"), bytes_data=message.get("bytes"))

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        """One frame: JSON text of at most ``LLMGW_AGENT_MAX_MESSAGE_BYTES``, without NaN or
        Infinity. Anything else (binary, oversized, undecodable, nested past Python's
        recursion limit) is answered with an ``error`` message and the connection stays."""
        if self._closed:
            return
        if text_data is None:
            await self._error("binary frames are not part of the protocol: send JSON text")
            return
        limit = settings.LLMGW_AGENT_MAX_MESSAGE_BYTES
        size = len(text_data) if len(text_data) * 4 <= limit else len(text_data.encode("utf-8", "replace"))
        if size > limit:
            await self._error(f"message of {size} bytes is over the limit of {limit} bytes")
            return
        try:
            content = json.loads(text_data, parse_constant=_refuse_constant)
        except RecursionError:
            await self._error("message is nested too deeply")
            return
        except ValueError as exc:
            await self._error(f"message is not valid JSON ({str(exc)[:200]})")
            return
        await self.receive_json(content)

    async def receive_json(self, content, **kwargs) -> None:
        try:
            message = protocol.check_fields(protocol.check_message(content, protocol.AGENT_MESSAGES))
            if message["type"] == "hello":
                try:
                    message["address"] = protocol.check_address(message.get("address", ""),
                                                                peer_is_loopback=_peer_is_loopback(self.scope))
                except protocol.ProtocolError as exc:
                    await self._drop(f"hello refused: {exc}", BAD_HELLO_CLOSE_CODE)
                    return
        except protocol.ProtocolError as exc:
            await self._error(str(exc))
            return
        if not await self._token_still_valid():  # every type: a stale hello would move its address
            await self._drop("its token was re-keyed or the agent deleted", REVOKED_CLOSE_CODE)
            return
        if message["type"] == "hello":
            now = time.monotonic()
            if self._hello_at is not None and now - self._hello_at < settings.LLMGW_AGENT_HELLO_INTERVAL_S:
                await self._error(f"hello repeated within {settings.LLMGW_AGENT_HELLO_INTERVAL_S:g} s: not applied "
                                  "(each one queues a reconcile pass; one per connection is enough)")
                return
            self._hello_at = now
        try:
            await self._handle(message)
        except Exception:  # a bad report must not cost the agent its connection
            log.exception("could not apply a %s message from agent %s", message.get("type"), self.agent_name)
            await self.send_json({"type": "error", "v": protocol.PROTOCOL_VERSION,
                                  "message": f"could not apply your {message.get('type')} message"})

    async def _token_still_valid(self) -> bool:
        """Re-check the token at most every ``LLMGW_AGENT_TOKEN_RECHECK`` seconds (the
        level-triggered side of revocation, for re-keys no channel layer delivered): before
        any message of the agent is applied and before anything is sent to it. A silent
        agent is covered by the watcher's sweep (``fleet.live.watch.Watcher``).

        While the database is away (PostgreSQL restarting) the token counts as valid and is
        checked again after the same interval: a re-key needs the database too, and dropping
        every agent over a database blip would take every route with it."""
        if self._closed:
            return False
        now = time.monotonic()
        if now - self._checked_at < settings.LLMGW_AGENT_TOKEN_RECHECK_S:
            return True
        self._checked_at = now
        try:
            return await database_sync_to_async(reports.token_still_valid)(self.agent_id, self.token_sha256)
        except (DatabaseError, InterfaceError) as exc:
            log.warning("could not re-check agent %s's token (database unavailable: %s); kept until the next "
                        "check", self.agent_name, exc)
            return True

    async def _handle(self, message: dict) -> None:
        kind = message["type"]
        if kind == "heartbeat":
            # Its loads are written with the stamps, batched (fleet.live.watch.HeartbeatStamps).
            heartbeats.stamp(self.agent_id, reports.heartbeat_loads(message))
            # Every few heartbeats: the GPUs' readings (a few queries), at most once per
            # GPU_READINGS_EVERY_S whatever rate the agent sends them at.
            if message.get("gpus") and time.monotonic() - self._gpu_readings_at >= GPU_READINGS_EVERY_S:
                self._gpu_readings_at = time.monotonic()
                await database_sync_to_async(reports.record_gpu_readings)(self.agent_id, message["gpus"])
        elif kind == "hello":
            self._route_as_reported(message)
            await database_sync_to_async(reports.record_hello)(self.agent_id, message)
            await self.push_assign(force=True)
        elif kind == "status":
            heartbeats.stamp(self.agent_id)
            self._route_as_reported(message)
            await database_sync_to_async(reports.record_status)(self.agent_id, message)

    def _route_as_reported(self, message: dict) -> None:
        """Before the report's rows are written: replicas it says are not ready leave this
        process's routing table now (``Watcher.withdraw``), those it says are ready may come
        back once their rows agree. Only this agent's replicas are withdrawn."""
        not_ready, ready = [], []
        for report in message.get("replicas") or []:
            rid = report.get("replica_id") if isinstance(report, dict) else None
            if isinstance(rid, int) and not isinstance(rid, bool):
                (ready if report.get("state") == ReplicaState.READY.value else not_ready).append(rid)
        if not_ready:
            watcher.withdraw(not_ready, self.agent_name)
        if ready:
            watcher.readmit(ready)

    async def push_assign(self, force: bool = False) -> None:
        """Send the full desired set if it moved since the last one sent (or if forced)."""
        if self._closed:
            return
        if not await self._token_still_valid():  # a desired set carries engine keys
            await self._drop("its token was re-keyed or the agent deleted", REVOKED_CLOSE_CODE)
            return
        assign = await database_sync_to_async(reports.desired_set)(self.agent_id)
        if force or assign["generation"] != self.sent_generation:
            self.sent_generation = assign["generation"]
            await self.send_json(assign)

    # Channel-layer events (Redis nudges from the reconciler, restart from the CLI, revocation).
    async def agent_assign(self, event) -> None:
        await self.push_assign()

    async def agent_restart(self, event) -> None:
        await self.send_restart()

    async def agent_revoked(self, event) -> None:
        await self._drop("its token was re-keyed or the agent deleted", REVOKED_CLOSE_CODE)

    async def send_restart(self) -> None:
        if self._closed:
            return
        if not await self._token_still_valid():
            await self._drop("its token was re-keyed or the agent deleted", REVOKED_CLOSE_CODE)
            return
        log.info("asking agent %s to restart", self.agent_name)
        await self.send_json(protocol.restart_agent())
