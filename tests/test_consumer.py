"""The agents' websocket through the real ASGI app (WebsocketCommunicator)."""

from __future__ import annotations

import logging

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from fleet import protocol
from fleet.consumers import REFUSED_CLOSE_CODE
from fleet.models import Agent, Gpu, Replica
from fleet.reconciler import reconcile
from llmgw.asgi import application

pytestmark = [pytest.mark.django_db(transaction=True)]


def hello(**over) -> dict:
    message = {
        "type": "hello", "v": protocol.PROTOCOL_VERSION, "name": "gpu-1", "version": "test",
        "address": "10.0.0.5",
        "inventory": {"gpus": [{"index": 0, "uuid": "GPU-a", "name": "H100", "memory_total_mib": 81559, "memory_used_mib": 0},
                               {"index": 1, "uuid": "GPU-b", "name": "H100", "memory_total_mib": 81559, "memory_used_mib": 0}],
                      "cpu_cores": 32, "memory_mib": 256000},
        "replicas": [],
    }
    message.update(over)
    return message


async def receive_type(ws, kind: str) -> dict:
    """The next message of ``kind`` (assignments may be pushed in between)."""
    while True:
        message = await ws.receive_json_from(timeout=5)
        if message["type"] == kind:
            return message


def communicator(token: str) -> WebsocketCommunicator:
    return WebsocketCommunicator(application, "/ws/agent/", headers=[(b"authorization", f"Bearer {token}".encode())])


async def test_a_bad_token_is_refused_logged_and_changes_nothing(caplog, watcher_cleanup):
    agent, _ = await sync_to_async(Agent.create_with_token)("gpu-1")
    ws = communicator("llmgw-agent-not-a-real-token")
    with caplog.at_level(logging.WARNING, logger="fleet.consumers"):
        connected, code = await ws.connect()
    assert not connected and code == REFUSED_CLOSE_CODE
    await ws.disconnect()  # what the server does after the close; ends the consumer
    assert "refused agent connection" in caplog.text
    agent = await Agent.objects.aget(pk=agent.pk)
    assert not agent.connected and agent.last_seen_at is None


async def test_no_token_is_refused(watcher_cleanup):
    ws = WebsocketCommunicator(application, "/ws/agent/")
    connected, code = await ws.connect()
    assert not connected and code == REFUSED_CLOSE_CODE
    await ws.disconnect()


async def test_hello_registers_the_inventory(watcher_cleanup):
    agent, token = await sync_to_async(Agent.create_with_token)("gpu-1")
    ws = communicator(token)
    connected, _ = await ws.connect()
    assert connected
    await ws.send_json_to(hello())
    assign = await ws.receive_json_from(timeout=5)
    assert assign["type"] == "assign" and assign["replicas"] == []
    agent = await Agent.objects.aget(pk=agent.pk)
    assert agent.connected and agent.address == "10.0.0.5" and agent.cpu_cores == 32
    gpus = [g async for g in Gpu.objects.filter(agent=agent).order_by("index")]
    assert [(g.index, g.memory_total_mib) for g in gpus] == [(0, 81559), (1, 81559)]
    await ws.disconnect()
    agent = await Agent.objects.aget(pk=agent.pk)
    assert not agent.connected


async def test_a_message_of_unknown_type_gets_an_error_not_a_disconnect(watcher_cleanup):
    _, token = await sync_to_async(Agent.create_with_token)("gpu-1")
    ws = communicator(token)
    await ws.connect()
    await ws.send_json_to({"type": "bogus", "v": 1})
    reply = await receive_type(ws, "error")
    assert reply["type"] == "error" and "bogus" in reply["message"]
    await ws.send_json_to({"type": "heartbeat", "v": 99})
    reply = await receive_type(ws, "error")
    assert "version" in reply["message"]
    await ws.disconnect()


async def test_assignments_are_delivered_and_redelivered_on_reconnect(make_model, watcher_cleanup):
    await sync_to_async(make_model)("fake-model", min_replicas=1)
    agent, token = await sync_to_async(Agent.create_with_token)("cpu-1")
    ws = communicator(token)
    await ws.connect()
    await ws.send_json_to(hello(name="cpu-1", inventory={"gpus": [], "cpu_cores": 4, "memory_mib": 8192}))
    first = await ws.receive_json_from(timeout=5)
    if not first["replicas"]:  # the pass requested by hello may land after the first assign
        first = await ws.receive_json_from(timeout=5)
    assert [r["served_name"] for r in first["replicas"]] == ["fake-model"]
    replica_id = first["replicas"][0]["replica_id"]
    assert "{port}" in first["replicas"][0]["command"]
    # The replica's own engine key travels with it (the agent starts the engine with it).
    key = await sync_to_async(lambda: Replica.objects.get(pk=replica_id).engine_key)()
    assert first["replicas"][0]["api_key"] == key and len(key) >= 40
    await ws.disconnect()

    ws = communicator(token)
    await ws.connect()
    await ws.send_json_to(hello(name="cpu-1", inventory={"gpus": [], "cpu_cores": 4, "memory_mib": 8192}))
    again = await ws.receive_json_from(timeout=5)
    assert [r["replica_id"] for r in again["replicas"]] == [replica_id]
    await ws.disconnect()


async def test_a_desired_set_change_is_pushed_by_the_watcher(make_model, watcher_cleanup):
    agent, token = await sync_to_async(Agent.create_with_token)("cpu-1")
    ws = communicator(token)
    await ws.connect()
    await ws.send_json_to(hello(name="cpu-1", inventory={"gpus": [], "cpu_cores": 4, "memory_mib": 8192}))
    first = await ws.receive_json_from(timeout=5)
    assert first["replicas"] == []
    await sync_to_async(make_model)("later-model", min_replicas=1)
    await sync_to_async(reconcile)()
    pushed = await ws.receive_json_from(timeout=5)
    while not pushed["replicas"]:
        pushed = await ws.receive_json_from(timeout=5)
    assert [r["served_name"] for r in pushed["replicas"]] == ["later-model"]
    await ws.disconnect()


async def test_status_reports_move_a_replica_through_its_states(make_model, watcher_cleanup):
    await sync_to_async(make_model)("fake-model", min_replicas=1)
    agent, token = await sync_to_async(Agent.create_with_token)("cpu-1")
    ws = communicator(token)
    await ws.connect()
    await ws.send_json_to(hello(name="cpu-1", inventory={"gpus": [], "cpu_cores": 4, "memory_mib": 8192}))
    assign = await ws.receive_json_from(timeout=5)
    while not assign["replicas"]:
        assign = await ws.receive_json_from(timeout=5)
    replica = await sync_to_async(lambda: Replica.objects.get())()
    for state in ("starting", "ready"):
        await ws.send_json_to({"type": "status", "v": 1, "inventory": {"gpus": [], "cpu_cores": 4, "memory_mib": 8192},
                               "replicas": [{"replica_id": replica.pk, "state": state, "pid": 123, "port": 20001}]})
    await ws.send_json_to({"type": "heartbeat", "v": 1})

    async def current():
        return await Replica.objects.aget(pk=replica.pk)

    import asyncio
    for _ in range(100):
        r = await current()
        if r.state == "ready":
            break
        await asyncio.sleep(0.05)
    assert r.state == "ready" and r.port == 20001 and r.ready_at is not None
    await ws.disconnect()
