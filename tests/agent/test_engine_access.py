"""Engines are reachable only through the gateway (issue 12), tried as an attacker on the
machine's network would: a real cluster (web, worker, agent processes), engines being the
fake engine started by the real agent with its replica's engine key."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from catalog.models import Model
from fleet.models import Replica
from tests.cluster import fake_profile, live_cluster_fixture
from tests.processes import wait_until
from tests.sockets import listening_addresses, refused

HI = [{"role": "user", "content": "x"}]  # the smallest valid chat

pytestmark = [pytest.mark.timeout(120)]

live = live_cluster_fixture("engine-access")


@pytest.fixture(scope="module")
def guarded(live, tmp_path_factory):
    """A model whose one replica runs a fake engine that records what reaches it and dumps
    the environment it was started with."""
    out = tmp_path_factory.mktemp("guarded")
    record, env_dump = out / "record.jsonl", out / "env.json"
    profile = fake_profile("guarded", "--record", str(record), "--dump-env", str(env_dump))
    model = Model(name="guarded", weights="file:/dev/null", profile=profile, min_replicas=1, max_replicas=1)
    model.full_clean()
    model.save()
    replica = wait_until(lambda: Replica.objects.filter(model=model, state="ready").select_related("agent").first(),
                         timeout_s=40, what="the replica to be ready")
    # Routed by the gateway too (its table refreshes on its own clock).
    wait_until(lambda: httpx.post(live.url + "/v1/embeddings", json={"model": "guarded", "input": "x"},
                                  timeout=10).status_code == 200, timeout_s=20, what="the gateway to route it")
    return {"model": model, "replica": replica, "record": record, "env": env_dump}


def events(record) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()]


def test_an_engine_port_without_its_key_is_refused_while_the_gateway_gets_through(live, guarded):
    replica, record = guarded["replica"], guarded["record"]
    engine = replica.url  # where the agent said its engine is: what an attacker would scan
    before = len(events(record))
    chat = {"model": "guarded", "messages": HI}
    attempts = [{}, {"Authorization": "Bearer wrong-key"}, {"Authorization": f"Bearer {replica.engine_key[:-1]}"},
                {"Authorization": replica.engine_key}, {"Authorization": f"Basic {replica.engine_key}"}]
    for headers in attempts:
        answer = httpx.post(f"{engine}/v1/chat/completions", json=chat, headers=headers, timeout=10)
        assert answer.status_code == 401, (headers, answer.text)
        assert httpx.get(f"{engine}/v1/models", headers=headers, timeout=10).status_code == 401
    # Nothing reached inference: every attempt refused, no request taken (a "completed"
    # may still come in for the fixture's routing probe, written after its answer).
    seen = [e["event"] for e in events(record)[before:] if e["event"] != "completed"]
    assert seen == ["refused"] * (2 * len(attempts))

    # The same request through the gateway, with credentials of the client's own: the
    # engine sees the replica's key and never the client's Authorization.
    through = httpx.post(live.url + "/v1/chat/completions", json=chat, timeout=30,
                         headers={"Authorization": "Bearer client-own-secret"})
    assert through.status_code == 200, through.text
    assert through.headers["x-llmgw-replica"].startswith(f"{replica.pk}@")
    assert through.json()["choices"][0]["message"]["content"]
    relayed = [e for e in events(record)[before:] if e["event"] == "request"]
    assert [e["authorization"] for e in relayed] == [f"Bearer {replica.engine_key}"]

    # Nothing changed: the same one replica, ready, same engine process.
    rows = list(Replica.objects.filter(model=guarded["model"]).values_list("id", "state", "pid"))
    assert rows == [(replica.pk, "ready", replica.pid)]


def test_the_engine_listens_on_the_agents_advertised_address_only(live, guarded):
    replica = guarded["replica"]
    assert replica.agent.address == "127.0.0.1"  # the agent reached the control plane over loopback
    assert listening_addresses(replica.port) == {"127.0.0.1"}  # not 0.0.0.0
    assert refused("127.0.0.2", replica.port)
    with socket.create_connection(("127.0.0.1", replica.port), timeout=5):
        pass


def test_the_engine_inherits_no_llmgw_variable_and_not_the_agents_token(live, guarded):
    seen = json.loads(guarded["env"].read_text())
    assert not [name for name in seen if name.upper().startswith("LLMGW")]
    assert not [name for name, value in seen.items() if live.token in value]
    # What the agent itself runs with, so the test means something: its LLMGW_* settings
    # (the test database's path among them), its token (LLMGW_AGENT_TOKEN) among them.
    agent_env = open(f"/proc/{live.agent.pid}/environ", "rb").read().split(b"\0")
    assert any(item.startswith(b"LLMGW_") for item in agent_env)
    assert f"LLMGW_AGENT_TOKEN={live.token}".encode() in agent_env
    assert seen["CUDA_VISIBLE_DEVICES"] == ""
