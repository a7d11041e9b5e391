"""Every message between agents and the control plane, in one place (DESIGN, Agent
protocol). JSON objects over the websocket, each with ``type`` and ``v`` (the version).

Both ends import this module; it imports nothing from Django.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

PROTOCOL_VERSION = 1


class GpuInfo(TypedDict):
    index: int
    uuid: str
    name: str
    memory_total_mib: int
    memory_used_mib: int


class Inventory(TypedDict):
    gpus: list[GpuInfo]
    cpu_cores: int
    memory_mib: int


class ReplicaReport(TypedDict, total=False):
    """What an agent knows about one replica it runs."""

    replica_id: int
    state: str  # a ReplicaState value the agent may report: downloading/starting/ready/failed/stopped
    pid: int | None
    port: int | None
    error: str
    #: Engine load from its metrics endpoint; None means unknown (never 0 by default).
    running: int | None
    waiting: int | None
    #: While ``downloading``: the fraction (0..1) of its weights fetched; None when unknown
    #: or not downloading. Optional: older agents do not send it.
    progress: float | None


class Hello(TypedDict):
    type: Literal["hello"]
    v: int
    name: str
    version: str
    address: str
    inventory: Inventory
    replicas: list[ReplicaReport]


class Status(TypedDict):
    type: Literal["status"]
    v: int
    replicas: list[ReplicaReport]
    inventory: Inventory


class Heartbeat(TypedDict):
    type: Literal["heartbeat"]
    v: int


class AssignedReplica(TypedDict, total=False):
    """One replica the agent must run. The agent renders ``command`` with its own port.

    ``api_key`` is the replica's engine key: the agent starts the engine with it (the
    ``{api_key}`` placeholder, in the command or the profile's env) and sends it on its
    readiness and metrics probes; only the gateway sends it otherwise. Optional on the
    wire: a control plane from before it sends none (the engine then runs unprotected).
    """

    replica_id: int
    served_name: str
    weights: str
    command: str
    env: dict[str, str]
    gpu_indices: list[int]
    cpu_cores: float
    readiness_path: str
    startup_timeout_s: int
    metrics_path: str
    metric_running: str
    metric_waiting: str
    api_key: str


class Assign(TypedDict):
    """The full desired set for one agent: run these, stop anything else (idempotent)."""

    type: Literal["assign"]
    v: int
    generation: int
    replicas: list[AssignedReplica]


class RestartAgent(TypedDict):
    type: Literal["restart_agent"]
    v: int


class ProtocolError(ValueError):
    """A message that is not JSON of a known type and version."""


AGENT_MESSAGES = frozenset({"hello", "status", "heartbeat"})
SERVER_MESSAGES = frozenset({"assign", "restart_agent"})


def check_message(message: Any, allowed: frozenset[str]) -> dict:
    """Return ``message`` if it is a dict of an allowed ``type`` and this protocol version,
    else raise ProtocolError with the reason."""
    if not isinstance(message, dict):
        raise ProtocolError("message is not a JSON object")
    kind = message.get("type")
    if kind not in allowed:
        raise ProtocolError(f"unknown message type {kind!r}")
    if message.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {message.get('v')!r} not supported (this end speaks {PROTOCOL_VERSION})"
        )
    return message


def heartbeat() -> Heartbeat:
    return {"type": "heartbeat", "v": PROTOCOL_VERSION}


def restart_agent() -> RestartAgent:
    return {"type": "restart_agent", "v": PROTOCOL_VERSION}
