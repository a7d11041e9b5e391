"""The agents' websocket through the real ASGI app (WebsocketCommunicator)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from fleet import protocol
from fleet.live.consumer import REFUSED_CLOSE_CODE
from fleet.models import Agent, Gpu, Replica
from fleet.control.reconciler import reconcile
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
    with caplog.at_level(logging.WARNING, logger="fleet.live.consumer"):
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


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/admin/", "/ws/agent", "/ws/agent/x",
                                  "/ws//agent/", "/"])
async def test_a_websocket_to_any_other_path_is_refused_quietly(watcher_cleanup, caplog, path):
    """A websocket upgrade anywhere but ``/ws/agent/`` is refused (403 to the handshake),
    not an unhandled exception with a traceback on the error log per attempt (a way for
    anyone to flood it); nothing is registered."""
    before = await Agent.objects.acount()
    ws = WebsocketCommunicator(application, path)
    connected, code = await ws.connect()
    assert not connected
    await ws.disconnect()
    assert "Traceback" not in caplog.text and not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert await Agent.objects.acount() == before


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
    agent, token = await sync_to_async(Agent.create_with_token)("gpu-1")
    ws = communicator(token)
    await ws.connect()
    await ws.send_json_to({"type": "bogus", "v": 1})
    reply = await receive_type(ws, "error")
    assert reply["type"] == "error" and "bogus" in reply["message"]
    await ws.send_json_to({"type": "heartbeat", "v": 99})
    reply = await receive_type(ws, "error")
    assert "version" in reply["message"]
    # Still connected: the socket is open and the agent's row says so.
    # Still connected: nothing but messages comes (no close), and the agent's row says so.
    outputs = []
    while not await ws.receive_nothing(timeout=0.3):
        outputs.append(await ws.receive_output())
    assert [o["type"] for o in outputs] == ["websocket.send"] * len(outputs), outputs
    assert (await Agent.objects.aget(pk=agent.pk)).connected
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


# -- issue 12: revocation is immediate, tokens only in a header, agents cannot lie ---------

async def close_code(ws, timeout_s: float = 10) -> int:
    """Read what the server sends until it closes the socket; returns the close code."""
    while True:
        output = await ws.receive_output(timeout=timeout_s)
        if output["type"] == "websocket.close":
            return output.get("code", 1000)


async def connected_agent(name="gpu-1", **hello_over):
    """An agent row with a live, accepted websocket that has said hello and got its set."""
    agent, token = await sync_to_async(Agent.create_with_token)(name)
    ws = communicator(token)
    connected, _ = await ws.connect()
    assert connected
    await ws.send_json_to(hello(name=name, **hello_over))
    await receive_type(ws, "assign")
    return agent, token, ws


async def is_refused(token: str) -> bool:
    ws = communicator(token)
    connected, code = await ws.connect()
    await ws.disconnect()
    return not connected and code == REFUSED_CLOSE_CODE


async def test_a_rekeyed_agent_is_dropped_at_once_and_its_old_token_refused(watcher_cleanup):
    from fleet.live.consumer import REVOKED_CLOSE_CODE

    agent, old_token, ws = await connected_agent()
    new_token = await sync_to_async(agent.rekey)()  # as the admin action and `llmgw agents rekey` do
    assert await close_code(ws) == REVOKED_CLOSE_CODE
    await ws.disconnect()
    row = await Agent.objects.aget(pk=agent.pk)
    assert not row.connected
    assert await is_refused(old_token)
    assert not (await Agent.objects.aget(pk=agent.pk)).connected
    ws = communicator(new_token)  # the new one works
    connected, _ = await ws.connect()
    assert connected and (await Agent.objects.aget(pk=agent.pk)).connected
    await ws.disconnect()


async def test_a_deleted_agent_is_dropped_at_once_and_cannot_reconnect(watcher_cleanup):
    from fleet.live.consumer import REVOKED_CLOSE_CODE

    agent, token, ws = await connected_agent()
    await sync_to_async(agent.delete)()
    assert await close_code(ws) == REVOKED_CLOSE_CODE
    await ws.disconnect()
    assert await is_refused(token)
    assert not await Agent.objects.filter(name="gpu-1").aexists()  # the refused attempt made no row


async def test_without_a_layer_reaching_it_the_heartbeat_recheck_drops_a_rekeyed_agent(
        watcher_cleanup, monkeypatch, settings):
    """A re-key made in another process (`llmgw agents rekey` with the in-memory layer):
    no event arrives, the token re-check on the next heartbeat closes the socket."""
    from fleet import groups
    from fleet.live import consumer

    monkeypatch.setattr(groups, "revoke_sessions", lambda agent_id: None)
    settings.LLMGW_AGENT_TOKEN_RECHECK_S = 0.0
    agent, old_token, ws = await connected_agent()
    await ws.send_json_to({"type": "heartbeat", "v": 1})  # still valid: nothing happens
    await ws.send_json_to({"type": "bogus", "v": 1})
    assert (await receive_type(ws, "error"))["message"]  # answered, so the heartbeat passed
    assert (await Agent.objects.aget(pk=agent.pk)).connected
    await sync_to_async(agent.rekey)()
    await ws.send_json_to({"type": "heartbeat", "v": 1})
    assert await close_code(ws) == consumer.REVOKED_CLOSE_CODE
    await ws.disconnect()
    assert not (await Agent.objects.aget(pk=agent.pk)).connected
    assert await is_refused(old_token)


async def test_a_database_blip_during_the_token_recheck_keeps_the_agent_connected(
        watcher_cleanup, monkeypatch, settings):
    """PostgreSQL restarting: the re-check cannot reach the database. The agent keeps its
    socket (a re-key needs the database too); dropping it took its routes with it."""
    from django.db import OperationalError

    from fleet.control import reports

    settings.LLMGW_AGENT_TOKEN_RECHECK_S = 0.0
    agent, token, ws = await connected_agent()

    def away(*args):
        raise OperationalError("the database system is shutting down")

    monkeypatch.setattr(reports, "token_still_valid", away)
    await ws.send_json_to({"type": "heartbeat", "v": 1})
    await ws.send_json_to({"type": "bogus", "v": 1})
    assert (await receive_type(ws, "error"))["message"]  # still served: the heartbeat did not end it
    assert (await Agent.objects.aget(pk=agent.pk)).connected
    await ws.disconnect()


async def test_a_rekeyed_agent_cannot_move_its_address_with_a_hello(watcher_cleanup, monkeypatch, settings):
    """Re-keyed in another process (no event): a hello from the old session is not recorded
    (its address would redirect the gateway's traffic) and closes the socket."""
    from fleet import groups
    from fleet.live import consumer

    monkeypatch.setattr(groups, "revoke_sessions", lambda agent_id: None)
    settings.LLMGW_AGENT_TOKEN_RECHECK_S = 0.0
    agent, old_token, ws = await connected_agent()
    await sync_to_async(agent.rekey)()
    await ws.send_json_to(hello(address="10.6.6.6", inventory={"gpus": [], "cpu_cores": 1, "memory_mib": 1}))
    assert await close_code(ws) == consumer.REVOKED_CLOSE_CODE
    await ws.disconnect()
    row = await Agent.objects.aget(pk=agent.pk)
    assert not row.connected and row.address == "10.0.0.5" and row.cpu_cores == 32
    assert await Gpu.objects.filter(agent=agent).acount() == 2


async def test_a_silent_rekeyed_agent_is_dropped_and_gets_no_more_assignments(
        make_model, watcher_cleanup, monkeypatch, settings):
    """Re-keyed in another process, an agent that sends nothing is closed by the watcher's
    sweep, and a desired set that moves meanwhile (engine keys) is not sent to it."""
    from fleet import groups
    from fleet.live import consumer

    monkeypatch.setattr(groups, "revoke_sessions", lambda agent_id: None)
    settings.LLMGW_AGENT_TOKEN_RECHECK_S = 0.0
    agent, old_token, ws = await connected_agent()
    await sync_to_async(agent.rekey)()
    model = await sync_to_async(make_model)("m", min_replicas=1)
    # Its desired set moves as a pass would move it (a real pass may already find the agent
    # dropped by the sweep, and place nothing): a replica with its engine key, a new generation.
    await Replica.objects.acreate(model=model, profile=model.profile, agent=agent, state="placing", cpu_cores=1,
                                  memory_mib=128)
    await sync_to_async(Agent.bump_generation)([agent.pk])
    sent = []
    while True:
        output = await ws.receive_output(timeout=10)
        if output["type"] == "websocket.close":
            break
        sent.append(output)
    assert output.get("code") == consumer.REVOKED_CLOSE_CODE
    assert not [o for o in sent if '"api_key"' in (o.get("text") or "")]  # no replica (nor its key) sent
    await ws.disconnect()
    assert not (await Agent.objects.aget(pk=agent.pk)).connected
    assert await is_refused(old_token)


async def test_every_socket_of_an_agent_that_connected_twice_is_dropped_on_rekey(
        watcher_cleanup, monkeypatch, settings):
    """Two sockets with one token (the watcher pushes to the newest): after a re-key made
    in another process both close without sending anything, the older one too."""
    from fleet import groups
    from fleet.live import consumer

    monkeypatch.setattr(groups, "revoke_sessions", lambda agent_id: None)
    settings.LLMGW_AGENT_TOKEN_RECHECK_S = 0.0
    agent, token, first = await connected_agent()
    second = communicator(token)
    assert (await second.connect())[0]
    await sync_to_async(agent.rekey)()
    assert await close_code(first) == consumer.REVOKED_CLOSE_CODE
    assert await close_code(second) == consumer.REVOKED_CLOSE_CODE
    await first.disconnect()
    await second.disconnect()
    assert not (await Agent.objects.aget(pk=agent.pk)).connected


async def test_a_flood_of_hellos_is_answered_not_applied(watcher_cleanup, monkeypatch, settings):
    """Each applied hello queues a reconcile pass: one connection may not make the worker
    run hundreds. Hellos within LLMGW_AGENT_HELLO_INTERVAL of the last one are answered."""
    from fleet.control import reports

    settings.LLMGW_AGENT_HELLO_INTERVAL_S = 60.0  # the 20 below all fall within it, however slow the machine

    agent, token, ws = await connected_agent()
    # The assign connected_agent waited for may be the one pushed on connect: wait until the
    # connection's own hello is applied before counting.
    deadline = time.monotonic() + 15
    while (await Agent.objects.aget(pk=agent.pk)).address != "10.0.0.5" and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    applied = []  # each applied hello asks for a pass
    monkeypatch.setattr(reports, "record_hello", lambda *args: applied.append(args))
    for _ in range(20):
        await ws.send_json_to(hello(address="10.0.0.77"))
    errors = [await receive_type(ws, "error") for _ in range(20)]
    assert all("hello repeated" in e["message"] for e in errors)
    assert applied == [] and (await Agent.objects.aget(pk=agent.pk)).address == "10.0.0.5"
    assert (await Agent.objects.aget(pk=agent.pk)).connected  # the connection stays
    await ws.disconnect()


async def test_a_token_in_the_query_string_is_refused(watcher_cleanup, caplog):
    agent, token = await sync_to_async(Agent.create_with_token)("gpu-1")
    ws = WebsocketCommunicator(application, f"/ws/agent/?token={token}")
    with caplog.at_level(logging.INFO):
        connected, code = await ws.connect()
    await ws.disconnect()
    assert not connected and code == REFUSED_CLOSE_CODE
    row = await Agent.objects.aget(pk=agent.pk)
    assert not row.connected and row.last_seen_at is None
    assert token not in caplog.text  # nor is it logged
    ws = communicator(token)  # the header works
    connected, _ = await ws.connect()
    assert connected
    await ws.disconnect()


def test_a_token_in_a_url_never_reaches_the_access_log():
    """uvicorn logs every request line with its query string; a token or key a client put
    there (refused anyway) is blanked by the filter llmgw.asgi installs."""
    import llmgw.asgi  # noqa: F401 (installs the filter)

    token = "llmgw-agent-AbCdEf0123456789-secret"
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5", "GET", f"/ws/agent/?v=1&token={token}&api_key=k1&ok=2", "1.1", 403),
                               None)
    for f in logging.getLogger("uvicorn.access").filters:
        f.filter(record)
    line = record.getMessage()
    assert token not in line and "k1" not in line
    assert "token=[redacted]" in line and "api_key=[redacted]" in line and "v=1" in line and "ok=2" in line
    # websocket handshakes are logged by uvicorn.error: '%s - "WebSocket %s" %d'
    record = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, '%s - "WebSocket %s" %d',
                               ("127.0.0.1:5", f"/ws/agent/?token={token}", 403), None)
    for f in logging.getLogger("uvicorn.error").filters:
        f.filter(record)
    assert token not in record.getMessage() and "token=[redacted]" in record.getMessage()


@pytest.mark.parametrize("address", [
    "http://10.0.0.5", "10.0.0.5/v1", "root@10.0.0.5", "10.0.0.5:8080", "gpu 1", "evil.com#", "a" * 254,
    "x" * 64 + ".example.com", "[::1]", "0.0.0.0", "::", "169.254.169.254", "224.0.0.1", "-gpu", "1.2.3",
    "127.0.0.1", "localhost", "::ffff:127.0.0.1",  # loopback, from an agent that did not connect over loopback
    # IPv4 in the notations resolvers accept (glibc inet_aton, WHATWG), loopback and metadata
    "0x7f000001", "0x7f.0x1", "127.0.0.0x1", "0xa9fea9fe", "2130706433", "127.0.0.1.", "0x7f.1",
    "ip6-localhost", "localhost.localdomain", "gpu.localhost",  # loopback names of /etc/hosts, RFC 6761
    "::127.0.0.1", "fe80::1%eth0", "2001:db8::1%eth0",  # IPv4-compatible IPv6, zones
])
async def test_a_hello_with_a_bad_address_is_refused_and_records_nothing(address, watcher_cleanup, caplog):
    from fleet.live.consumer import BAD_HELLO_CLOSE_CODE

    agent, token = await sync_to_async(Agent.create_with_token)("gpu-1")
    ws = communicator(token)
    ws.scope["client"] = ("10.9.8.7", 40000)  # a remote agent
    connected, _ = await ws.connect()
    assert connected
    with caplog.at_level(logging.WARNING, logger="fleet.live.consumer"):
        await ws.send_json_to(hello(address=address))
        assert await close_code(ws) == BAD_HELLO_CLOSE_CODE
    await ws.disconnect()
    assert "hello refused: address" in caplog.text
    row = await Agent.objects.aget(pk=agent.pk)
    assert not row.connected and row.address == "" and row.cpu_cores == 0
    assert not await Gpu.objects.filter(agent=agent).aexists()


async def test_loopback_and_host_names_are_accepted_where_they_are_true(watcher_cleanup, settings):
    settings.LLMGW_AGENT_HELLO_INTERVAL_S = 0.0  # several hellos on one connection
    agent, _, ws = await connected_agent(address="127.0.0.1")  # no client address: in-process, local
    assert (await Agent.objects.aget(pk=agent.pk)).address == "127.0.0.1"
    await ws.disconnect()
    agent, token = await sync_to_async(Agent.create_with_token)("gpu-2")
    ws = communicator(token)
    ws.scope["client"] = ("10.9.8.7", 40000)
    assert (await ws.connect())[0]
    await ws.send_json_to(hello(name="gpu-2", address="gpu-2.cluster.example"))
    await ws.send_json_to({"type": "bogus", "v": 1})  # answered after the hello was applied
    await receive_type(ws, "error")
    assert (await Agent.objects.aget(pk=agent.pk)).address == "gpu-2.cluster.example"
    await ws.send_json_to(hello(name="gpu-2", address=""))  # not advertised: accepted, stored empty
    await ws.send_json_to({"type": "bogus", "v": 1})  # answered after the hello was applied
    await receive_type(ws, "error")
    assert (await Agent.objects.aget(pk=agent.pk)).address == ""
    assert (await Agent.objects.aget(pk=agent.pk)).connected
    await ws.disconnect()


def _bad_hellos_and_statuses() -> list:
    """Every field of hello and status with a wrong type, and a few malformed containers."""
    bad = []
    for key, value in [("name", 5), ("version", []), ("address", 10), ("inventory", "lots"), ("replicas", 5),
                       ("replicas", "ready"), ("replicas", [5]), ("name", "n" * 1000),
                       ("inventory", {"gpus": "all", "cpu_cores": 4, "memory_mib": 1}),
                       ("inventory", {"gpus": [], "cpu_cores": "4", "memory_mib": 1}),
                       ("inventory", {"gpus": [], "cpu_cores": 4, "memory_mib": True}),
                       ("inventory", {"gpus": [7], "cpu_cores": 4, "memory_mib": 1}),
                       ("inventory", {"gpus": [{"index": "0"}], "cpu_cores": 4, "memory_mib": 1}),
                       ("inventory", {"gpus": [{"index": 0, "uuid": 5}], "cpu_cores": 4, "memory_mib": 1}),
                       ("inventory", {"gpus": [{"index": 0, "memory_total_mib": 1.5}], "cpu_cores": 4, "memory_mib": 1}),
                       ("inventory", {"gpus": [{"index": 0}] * 2000, "cpu_cores": 4, "memory_mib": 1})]:
        bad.append(hello(**{key: value}))
    for report in [{"replica_id": "1", "state": "ready"}, {"replica_id": 1, "state": 3},
                   {"replica_id": 1, "pid": "9"}, {"replica_id": 1, "port": [1]}, {"replica_id": 1, "error": {}},
                   {"replica_id": 1, "running": "many"}, {"replica_id": 1, "waiting": {}},
                   {"replica_id": 1, "progress": "half"}, {"state": "ready"}, {"replica_id": True}]:
        bad.append({"type": "status", "v": 1, "replicas": [report]})
    bad.append({"type": "status", "v": 1, "replicas": {"1": "ready"}})
    bad.append({"type": "status", "v": 1, "replicas": [], "inventory": []})
    return bad


async def test_binary_frames_and_pathological_json_are_answered_and_the_consumer_survives(
        make_model, watcher_cleanup):
    await sync_to_async(make_model)("fake-model", min_replicas=1)
    agent, token = await sync_to_async(Agent.create_with_token)("cpu-1")
    ws = communicator(token)
    await ws.connect()
    cpu = {"gpus": [], "cpu_cores": 4, "memory_mib": 8192}
    await ws.send_json_to(hello(name="cpu-1", inventory=cpu))
    assign = await receive_type(ws, "assign")
    while not assign["replicas"]:
        assign = await receive_type(ws, "assign")
    replica_id = assign["replicas"][0]["replica_id"]
    frames = [
        {"bytes": b"\x00\x01binary"},
        {"text": '{"type": "heartbeat", "v": 1, "pad": "' + "x" * (1024 * 1024) + '"}'},
        {"text": "[" * 10_000 + "]" * 10_000},
        {"text": '{"type": "heartbeat", "v": 1, "x": ' + '{"a": ' * 10_000 + "1" + "}" * 10_001},
        {"text": '{"type": "status", "v": 1, "replicas": [{"replica_id": ' + str(replica_id)
                      + ', "state": "starting", "progress": NaN}]}'},
        {"text": '{"type": "status", "v": 1, "replicas": [{"replica_id": 1, "running": Infinity}]}'},
        {"text": '{"type": "status", "v": 1, "replicas": [{"replica_id": 1' + "0" * 5000 + "}]}"},
        {"text": "not json"},
        {"text": ""},
        {"text": '"just a string"'},
    ] + [{"text": json_text} for json_text in map(__import__("json").dumps, _bad_hellos_and_statuses())]
    for frame in frames:
        await ws.send_input({"type": "websocket.receive", **frame})
        reply = await receive_type(ws, "error")
        assert reply["message"] and not reply["message"].startswith("None"), frame  # names where it is
    # Nothing of it was recorded, and the agent is still connected.
    row = await Agent.objects.aget(pk=agent.pk)
    assert row.connected and row.cpu_cores == 4 and row.address == "10.0.0.5" and row.name == "cpu-1"
    replica = await Replica.objects.aget(pk=replica_id)
    assert replica.state == "placing" and replica.download_progress is None
    # A following valid status is still processed.
    await ws.send_json_to({"type": "status", "v": 1, "inventory": cpu,
                           "replicas": [{"replica_id": replica_id, "state": "starting", "pid": 123, "port": 20001}]})
    import asyncio
    for _ in range(200):
        replica = await Replica.objects.aget(pk=replica_id)
        if replica.state == "starting":
            break
        await asyncio.sleep(0.05)
    assert replica.state == "starting" and replica.port == 20001
    await ws.disconnect()
    assert not (await Agent.objects.aget(pk=agent.pk)).connected


async def test_a_consumer_that_fails_marks_its_agent_disconnected_and_closes(watcher_cleanup, monkeypatch, caplog):
    from fleet.live import consumer

    agent, token, ws = await connected_agent()
    assert (await Agent.objects.aget(pk=agent.pk)).connected

    def broken(message):
        raise RuntimeError("a bug nobody caught")

    monkeypatch.setattr(consumer.protocol, "check_fields", broken)
    with caplog.at_level(logging.ERROR, logger="fleet.live.consumer"):
        await ws.send_json_to({"type": "heartbeat", "v": 1})
        assert await close_code(ws) == consumer.FAILED_CLOSE_CODE
    assert "consumer failed" in caplog.text
    assert not (await Agent.objects.aget(pk=agent.pk)).connected
    monkeypatch.undo()
    ws = communicator(token)  # and it may come back
    assert (await ws.connect())[0]
    await ws.disconnect()


async def test_llmgw_agents_rekey_prints_the_new_token_once_and_drops_the_connection(watcher_cleanup):
    import io

    from django.core.management import call_command

    from fleet.live.consumer import REVOKED_CLOSE_CODE

    agent, old_token, ws = await connected_agent()
    out = io.StringIO()
    await sync_to_async(call_command)("llmgw", "agents", "rekey", "gpu-1", stdout=out)
    assert await close_code(ws) == REVOKED_CLOSE_CODE
    await ws.disconnect()
    text = out.getvalue()
    new_token = text.split("gpu-1: token ", 1)[1].split()[0]
    assert text.count(new_token) == 1 and old_token not in text
    assert await is_refused(old_token)
    assert (await sync_to_async(Agent.authenticate)(new_token)).pk == agent.pk
    with pytest.raises(SystemExit) as exit_info:
        await sync_to_async(call_command)("llmgw", "agents", "rekey", "nobody", stdout=io.StringIO(),
                                          stderr=io.StringIO())
    assert exit_info.value.code == 1


# -- issue 14: load on every heartbeat --------------------------------------------------------

async def test_steady_heartbeats_keep_a_replicas_load_fresh(make_model, watcher_cleanup, settings):
    """The same load on every heartbeat: the consumer hands it to the batched stamps and the
    watcher's flush writes it, refreshed once its stamp is a third of LLMGW_LOAD_STALE old, so
    ``load_reported_at`` follows the heartbeats and only silence makes it stale."""
    settings.LLMGW_LOAD_STALE_S = 0.6  # refreshed every 0.2 s
    m = await sync_to_async(make_model)("m", min_replicas=0)
    agent, token, ws = await connected_agent("cpu-1", inventory={"gpus": [], "cpu_cores": 4, "memory_mib": 8192})
    other = await sync_to_async(Agent.objects.create)(name="cpu-2", connected=True)
    r = await Replica.objects.acreate(model=m, profile=m.profile, agent=agent, state="ready", port=1)
    theirs = await Replica.objects.acreate(model=m, profile=m.profile, agent=other, state="ready", port=2)

    async def row_when(check):
        for _ in range(200):
            row = await Replica.objects.aget(pk=r.pk)
            if check(row):
                return row
            await asyncio.sleep(0.05)
        raise AssertionError(f"replica {r.pk}: load {row.load_running}/{row.load_waiting} at {row.load_reported_at}")

    await ws.send_json_to(protocol.heartbeat([[r.pk, 2, 3], [theirs.pk, 7, 7]]))
    first = await row_when(lambda row: row.load_reported_at is not None)
    assert (first.load_running, first.load_waiting) == (2, 3)
    stamps = [first.load_reported_at]
    for _ in range(3):
        await asyncio.sleep(0.25)
        await ws.send_json_to(protocol.heartbeat([[r.pk, 2, 3]]))  # nothing changed
        row = await row_when(lambda row: row.load_reported_at > stamps[-1])
        stamps.append(row.load_reported_at)
        assert (row.load_running, row.load_waiting) == (2, 3)
    assert (await Replica.objects.aget(pk=theirs.pk)).load_reported_at is None  # not this agent's replica
    await ws.disconnect()


async def test_a_bare_heartbeat_is_still_accepted_and_a_bad_load_is_answered(watcher_cleanup):
    agent, token, ws = await connected_agent("cpu-1")
    await ws.send_json_to({"type": "heartbeat", "v": 1})  # an agent from before loads
    await ws.send_json_to({"type": "heartbeat", "v": 1, "loads": [[1, "two", 3]]})
    error = await receive_type(ws, "error")
    assert "load" in error["message"]
    await ws.send_json_to({"type": "heartbeat", "v": 1, "loads": {"1": [2, 3]}})
    assert "'loads' must be a list" in (await receive_type(ws, "error"))["message"]
    assert await ws.receive_nothing(timeout=0.2)  # the bare one was not refused
    await ws.disconnect()


async def test_a_replica_reported_failed_leaves_this_processs_routing_before_its_row_is_written(
        watcher_cleanup, monkeypatch):
    """The route goes with the report, not with the (maybe slow) database write: a process
    that takes a dead engine's port gets nothing meant for it (docs/architecture.md,
    "Decisions": readiness proves identity). Another agent's report cannot withdraw it."""
    from fleet.control import reports
    from fleet.live import watch
    from fleet.live.watch import AgentGenerations, Endpoint, View, watcher

    agent, token, ws = await connected_agent("gpu-1")
    other, other_token, other_ws = await connected_agent("gpu-2")
    written = []
    monkeypatch.setattr(reports, "record_status", lambda agent_id, message: written.append(message))

    def rows_not_written_yet(*args):  # every refresh still reads both replicas ready
        return View(routes={1: (Endpoint(41, 1, "http://10.0.0.5:20001", "gpu-1"),
                                Endpoint(42, 1, "http://10.0.0.5:20002", "gpu-1"))}), AgentGenerations()

    monkeypatch.setattr(watch, "_load_view", rows_not_written_yet)
    await watcher.refresh_now()
    assert [e.replica_id for e in watcher.view.routes[1]] == [41, 42]
    await other_ws.send_json_to({"type": "status", "v": 1, "replicas": [{"replica_id": 41, "state": "failed"}]})
    await ws.send_json_to({"type": "status", "v": 1, "replicas": [{"replica_id": 42, "state": "failed",
                                                                  "error": "engine killed by signal 9"}]})
    for _ in range(100):
        if len(written) == 2:
            break
        await asyncio.sleep(0.05)
    assert len(written) == 2
    await watcher.refresh_now()  # a refresh from rows not written yet does not bring it back
    assert [e.replica_id for e in watcher.view.routes[1]] == [41]
    await ws.disconnect()
    await other_ws.disconnect()
