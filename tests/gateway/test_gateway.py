"""The /v1/ gateway in a real daphne process against a fake engine process: relaying,
streaming as produced, and every error status of issue #2."""

from __future__ import annotations

import time

import httpx
import pytest

from fleet.models import ModelState, Replica
from tests.processes import daphne, fake_engine, free_port, wait_for_port, wait_until
from tests.replicas import ENGINE_KEY, routed_to, serve

HI = [{"role": "user", "content": "x"}]  # the smallest valid chat

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def servers(django_db_setup, django_db_blocker, tmp_path_factory):
    logs = tmp_path_factory.mktemp("gateway-logs")
    engine_port, slow_port, linger_port, web_port = free_port(), free_port(), free_port(), free_port()
    engine = fake_engine(engine_port, logs, "--tokens", "8", api_key=ENGINE_KEY)
    slow = fake_engine(slow_port, logs, "--tokens", "5", "--token-delay-ms", "300", api_key=ENGINE_KEY)
    linger = fake_engine(linger_port, logs, "--tokens", "3", "--linger-after-done-ms", "700", api_key=ENGINE_KEY)
    rough_port = free_port()
    rough = fake_engine(rough_port, logs, "--tokens", "3", "--reset-after-done", api_key=ENGINE_KEY)
    web = daphne(web_port, logs, env={"LLMGW_WATCH_INTERVAL": "50ms", "LLMGW_WATCH_FAST_INTERVAL": "20ms",
                                      "LLMGW_COLD_START_TIMEOUT": "2s"})
    wait_for_port(engine_port, proc=engine.proc)
    wait_for_port(slow_port, proc=slow.proc)
    wait_for_port(linger_port, proc=linger.proc)
    wait_for_port(rough_port, proc=rough.proc)
    yield {"engine": engine_port, "slow": slow_port, "linger": linger_port, "rough": rough_port,
           "url": f"http://127.0.0.1:{web_port}", "web": web}
    for proc in (web, engine, slow, linger, rough):
        proc.stop()


@pytest.fixture
def api_key(transactional_db) -> str:
    from gateway.models import ApiKey

    return ApiKey.create_key("tests")[1]


@pytest.fixture
def client(servers, api_key):
    """Every gateway test talks through this client, which carries a valid API key."""
    with httpx.Client(base_url=servers["url"], timeout=30, headers={"Authorization": f"Bearer {api_key}"}) as c:
        yield c


def wait_routed(client, replica: Replica) -> None:
    """Wait until ``/v1/`` routes ``replica``'s model to it; views only move forwards, so
    from then on the gateway sees this test's rows."""
    name = replica.model.name

    def routed():
        r = client.post("/v1/chat/completions", json={"model": name, "messages": HI})
        return r.status_code == 200 and routed_to(r, replica)
    wait_until(routed, timeout_s=10, what=f"{name} to be routed to replica {replica.pk}")


def test_chat_completion_is_relayed(client, servers, make_model):
    wait_routed(client, serve(make_model("fake-model", aliases="fm"), servers["engine"]))
    r = client.post("/v1/chat/completions", json={"model": "fm", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    body = r.json()
    assert body["choices"][0]["message"]["content"].startswith("tok0")
    assert body["usage"]["completion_tokens"] == 8
    assert r.headers["x-llmgw-replica"].endswith("@local")
    assert float(r.headers["x-llmgw-overhead-ms"]) >= 0


def test_completions_and_embeddings_are_relayed(client, servers, make_model):
    wait_routed(client, serve(make_model("fake-model"), servers["engine"]))
    r = client.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
    assert r.status_code == 200 and r.json()["object"] == "text_completion"
    assert r.json()["choices"][0]["text"].startswith("tok0")
    r = client.post("/v1/embeddings", json={"model": "fake-model", "input": ["a", "b"]})
    assert r.status_code == 200 and [(d["index"], len(d["embedding"])) for d in r.json()["data"]] == [(0, 8), (1, 8)]


def test_streaming_chunks_arrive_as_they_are_produced(client, servers, make_model):
    wait_routed(client, serve(make_model("slow-model"), servers["slow"]))
    arrivals = []
    started = time.monotonic()
    with client.stream("POST", "/v1/chat/completions",
                       json={"model": "slow-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for chunk in r.iter_raw():
            if b"tok" in chunk:
                arrivals.append(time.monotonic() - started)
            text = chunk
    assert b"[DONE]" in text
    assert len(arrivals) >= 4, arrivals
    # 5 tokens 300 ms apart: the first arrives long before the last (not buffered to the end).
    assert arrivals[-1] - arrivals[0] > 0.8, arrivals


def test_models_list_shows_the_catalog(client, make_model):
    make_model("fake-model")
    r = client.get("/v1/models")
    assert r.status_code == 200
    assert "fake-model" in [m["id"] for m in r.json()["data"]]


def test_malformed_json_is_a_400(client):
    r = client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_json"


def test_missing_model_is_a_400(client):
    r = client.post("/v1/chat/completions", json={"messages": HI})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "model"


def test_unknown_model_is_a_404_model_not_found(client, db):
    r = client.post("/v1/chat/completions", json={"model": "nope", "messages": HI})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"


def test_no_ready_replica_is_a_503_with_the_placement_reason(client, make_model):
    m = make_model("big-model")
    reason = "no agent has 2 free GPUs of 40 GiB; gpu-1: 1 free"
    ModelState.objects.create(model=m, desired=1, unservable=True, reason=reason)
    time.sleep(0.2)
    r = client.post("/v1/chat/completions", json={"model": "big-model", "messages": HI})
    assert r.status_code == 503
    assert reason in r.json()["error"]["message"]


def test_a_dead_replica_is_a_502_not_a_500(client, make_model):
    serve(make_model("dead-model"), free_port())
    time.sleep(0.3)
    r = client.post("/v1/chat/completions", json={"model": "dead-model", "messages": HI})
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "upstream_unreachable"


def test_get_on_a_post_endpoint_is_a_405_in_openai_shape(client):
    r = client.get("/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_a_stopped_cluster_answers_503_system_stopped_and_still_lists_models(client, servers, make_model):
    from fleet.ops.operations import start_cluster, stop_cluster

    wait_routed(client, serve(make_model("fake-model"), servers["engine"]))
    stop_cluster("test")
    try:
        def stopped():
            return client.post("/v1/chat/completions", json={"model": "fake-model", "messages": HI}).status_code == 503
        wait_until(stopped, timeout_s=5, what="the stop to reach the gateway")
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
            r = client.post(path, json={"model": "fake-model"})
            assert r.status_code == 503 and r.json()["error"]["code"] == "system_stopped", path
        # A path the gateway does not serve is unknown whether or not the cluster is stopped.
        assert client.post("/v1/anything/else", json={"model": "fake-model"}).status_code == 404
        assert "fake-model" in [m["id"] for m in client.get("/v1/models").json()["data"]]
    finally:
        start_cluster()


def test_a_database_outage_is_answered_503_and_logged_once_per_interval_not_per_request(caplog, monkeypatch):
    import logging

    from django.db import OperationalError
    from django.test import RequestFactory

    from llmgw import middleware

    clock = [1000.0]
    monkeypatch.setattr(middleware.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(middleware, "_outage_log", middleware._OutageLog())
    mw = middleware.DatabaseUnavailableMiddleware(lambda request: None)
    request = RequestFactory().post("/v1/chat/completions")
    with caplog.at_level(logging.WARNING, logger="llmgw.middleware"):
        answers = [mw.process_exception(request, OperationalError("connection refused")) for _ in range(50)]
        assert len(caplog.records) == 1
        clock[0] += middleware.LOG_EVERY_S
        mw.process_exception(request, OperationalError("connection refused"))
    assert {a.status_code for a in answers} == {503} and answers[0]["Retry-After"] == "2"
    assert len(caplog.records) == 2 and "49 more request(s)" in caplog.records[1].getMessage()
    # A day later, another outage: its first failure is told at once, the earlier count as such.
    with caplog.at_level(logging.WARNING, logger="llmgw.middleware"):
        for _ in range(3):
            mw.process_exception(request, OperationalError("connection refused"))
        clock[0] += 86400
        mw.process_exception(request, OperationalError("connection refused"))
    assert len(caplog.records) == 3
    assert "the previous outage answered 3 more request(s) 503" in caplog.records[2].getMessage()


def test_a_stream_the_client_closes_right_after_done_is_recorded_as_served_not_499(client, servers, make_model):
    """The openai SDK hangs up once it reads [DONE]; an engine may end its body a moment
    later. The client had everything: that request was served."""
    from gateway.models import UsageRecord

    wait_routed(client, serve(make_model("linger-model"), servers["linger"]))
    with client.stream("POST", "/v1/chat/completions",
                       json={"model": "linger-model", "stream": True, "messages": HI}) as r:
        for line in r.iter_lines():
            if line == "data: [DONE]":
                break  # leaving the block closes the connection before the engine's EOF
    wait_until(lambda: UsageRecord.objects.filter(model_name="linger-model", stream=True).exists(), timeout_s=10,
               what="the stream's usage record")
    record = UsageRecord.objects.get(model_name="linger-model", stream=True)
    assert record.status == 200 and record.completion_tokens == 3


def test_an_engine_that_drops_the_connection_after_done_still_served_the_stream(client, servers, make_model):
    """The client has every event, [DONE] included: no error event after it, recorded 200."""
    from gateway.models import UsageRecord

    wait_routed(client, serve(make_model("rough-model"), servers["rough"]))
    with client.stream("POST", "/v1/chat/completions",
                       json={"model": "rough-model", "stream": True, "messages": HI}) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and not any("upstream_stream_broken" in line for line in lines)
    wait_until(lambda: UsageRecord.objects.filter(model_name="rough-model", stream=True).exists(), timeout_s=10,
               what="the stream's usage record")
    assert UsageRecord.objects.get(model_name="rough-model", stream=True).status == 200


def test_v1_and_metrics_refuse_a_host_not_allowed(settings):
    """The lean handler (no middleware) checks Host too: a DNS-rebinding page on another
    name reads no metrics and reaches no endpoint; X-Forwarded-Host is not believed."""
    import asyncio

    import httpx

    from llmgw.asgi import application

    settings.LLMGW_METRICS_TOKEN = ""

    async def run():
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            answers = {}
            for path in ("/metrics", "/v1/models"):
                for host in ("evil.example", "127.0.0.1.evil.example", "evil.example:80"):
                    answers[path, host] = await client.get(path, headers={"Host": host})
            answers["xfh"] = await client.get("/metrics", headers={"Host": "evil.example",
                                                                   "X-Forwarded-Host": "127.0.0.1"})
            answers["ok"] = await client.get("/metrics")
            return answers

    answers = asyncio.run(run())
    ok = answers.pop("ok")
    assert ok.status_code == 200 and b"llmgw_" in ok.content
    for key, answer in answers.items():
        path = key[0] if isinstance(key, tuple) else "/metrics"
        assert answer.status_code == 400 and b"llmgw_" not in answer.content, (key, answer.text)
        if path == "/v1/models":
            assert answer.json()["error"]["code"] == "disallowed_host"


def test_metrics_can_be_put_behind_a_bearer_token(settings):
    from django.test import AsyncClient

    settings.LLMGW_METRICS_TOKEN = "s3cret"
    client = AsyncClient()

    async def get(**headers):
        return await client.get("/metrics", headers=headers)

    import asyncio

    assert asyncio.run(get()).status_code == 401
    assert asyncio.run(get(Authorization="Bearer nope")).status_code == 401
    assert asyncio.run(get(Authorization="bearer s3cret")).status_code == 200  # schemes are case-insensitive
    answer = asyncio.run(get(Authorization="Bearer s3cret"))
    assert answer.status_code == 200 and b"llmgw_" in answer.content
    settings.LLMGW_METRICS_TOKEN = ""
    assert asyncio.run(get()).status_code == 200


def test_a_405_names_the_allowed_method_in_an_allow_header():
    """RFC 9110 (15.5.6): a 405 carries ``Allow``; no server is needed, the views answer it."""
    import asyncio

    from django.test import AsyncClient

    client = AsyncClient()
    asked = {("get", "/v1/chat/completions"): "POST", ("put", "/v1/completions"): "POST",
             ("delete", "/v1/embeddings"): "POST", ("post", "/v1/models"): "GET",
             ("delete", "/v1/models/some-model"): "GET"}

    async def run():
        return {key: await getattr(client, key[0])(key[1]) for key in asked}

    for key, answer in asyncio.run(run()).items():
        assert answer.status_code == 405, (key, answer.content)
        assert answer["Allow"] == asked[key], key
        assert answer.json()["error"]["type"] == "invalid_request_error"
