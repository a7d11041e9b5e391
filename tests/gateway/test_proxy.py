"""The gateway's hard edges, through a real daphne process and fake engine processes: API
keys, external models, exact streaming, retries, statuses, usage records and /metrics;
with the official openai client (sync and async) wherever it can express the case."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
import time
from datetime import timedelta

import httpx
import openai
import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from catalog.models import Model
from fleet.models import Replica
from gateway.models import ApiKey, UsageRecord
from tests.processes import daphne, fake_engine, free_port, open_request, wait_for_port, wait_until
from tests.replicas import routed_to, serve

HI = [{"role": "user", "content": "x"}]  # the smallest valid chat

pytestmark = [pytest.mark.django_db(transaction=True)]

TEXT = "Ünïcödé € ✓ 日本"


@pytest.fixture(scope="module")
def servers(django_db_setup, tmp_path_factory):
    logs = tmp_path_factory.mktemp("edges")
    ports = {name: free_port() for name in ("plain", "utf8", "tools", "slow", "limited", "external", "web")}
    records = {name: logs / f"{name}.jsonl" for name in ports}
    engines = [
        fake_engine(ports["plain"], logs, "--tokens", "6", "--record", str(records["plain"])),
        fake_engine(ports["utf8"], logs, "--text", TEXT, "--split-bytes", "--record", str(records["utf8"])),
        fake_engine(ports["tools"], logs, "--tool-call"),
        fake_engine(ports["slow"], logs, "--tokens", "50", "--token-delay-ms", "100", "--record", str(records["slow"])),
        fake_engine(ports["limited"], logs, "--fail-status", "429"),
        fake_engine(ports["external"], logs, "--tokens", "4", "--record", str(records["external"]), name="upstream-model"),
    ]
    for name in ("plain", "utf8", "tools", "slow", "limited", "external"):
        wait_for_port(ports[name])
    web = daphne(ports["web"], logs, env={"LLMGW_WATCH_INTERVAL": "50ms", "LLMGW_MAX_BODY_BYTES": "4096",
                                          "LLMGW_USAGE_FLUSH_INTERVAL": "0.2s"})
    yield {"ports": ports, "records": records, "url": f"http://127.0.0.1:{ports['web']}", "web": web, "logs": logs}
    for proc in [web, *engines]:
        proc.stop()


def records(servers, name: str) -> list[dict]:
    path = servers["records"][name]
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def key(transactional_db) -> str:
    return ApiKey.create_key("edges")[1]


@pytest.fixture
def models(servers, make_model, transactional_db):
    made, replicas = {}, {}
    for name in ("plain", "utf8", "tools", "slow", "limited"):
        made[name] = make_model(name)
        replicas[name] = serve(made[name], servers["ports"][name])
    ext = Model(name="ext", external_base_url=f"http://127.0.0.1:{servers['ports']['external']}/v1",
                external_api_key="upstream-secret", min_replicas=0, max_replicas=0)
    ext.full_clean()
    ext.save()
    made["ext"] = ext
    _, probe = ApiKey.create_key("probe")
    for name in ("plain", "utf8", "tools", "limited"):  # wait until the gateway routes them (this test's rows)
        wait_until(lambda: routed_to(post(servers, "/v1/embeddings", {"model": name, "input": "x"}, probe),
                                     replicas[name]),
                   timeout_s=10, what=f"{name} to be routed to replica {replicas[name].pk}")
    return made


@pytest.fixture
def oai(servers, key, models):
    return openai.OpenAI(base_url=servers["url"] + "/v1", api_key=key, max_retries=0)


def post(servers, path: str, body: dict, key: str | None, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    kw.setdefault("timeout", 30)
    return httpx.post(servers["url"] + path, json=body, headers=headers, **kw)


# --- keys ----------------------------------------------------------------------------------------

def test_a_missing_or_wrong_key_is_a_401(servers, models, key):
    assert post(servers, "/v1/chat/completions", {"model": "plain"}, None).status_code == 401
    r = post(servers, "/v1/chat/completions", {"model": "plain"}, "llmgw-key-nope")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=servers["url"] + "/v1", api_key="wrong", max_retries=0).models.list()


def test_a_revoked_key_fails_within_one_refresh(servers, models):
    obj, clear = ApiKey.create_key("soon-revoked")
    assert post(servers, "/v1/chat/completions", {"model": "plain", "messages": HI}, clear).status_code == 200
    obj.revoke()
    time.sleep(0.3)  # keys are cached per process, refreshed with the routing table (50 ms here, 0.2 s by default)
    r = post(servers, "/v1/chat/completions", {"model": "plain", "messages": HI}, clear)
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]


def test_an_expired_key_is_a_401(servers, models):
    _, clear = ApiKey.create_key("old", expires_at=timezone.now() - timedelta(seconds=1))
    r = post(servers, "/v1/chat/completions", {"model": "plain", "messages": HI}, clear)
    assert r.status_code == 401 and "expired" in r.json()["error"]["message"]


def test_a_key_limited_to_some_models_gets_403_for_others(servers, models):
    _, clear = ApiKey.create_key("narrow", ["plain"])
    assert post(servers, "/v1/chat/completions", {"model": "plain", "messages": HI}, clear).status_code == 200
    r = post(servers, "/v1/chat/completions", {"model": "utf8", "messages": HI}, clear)
    assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed"
    client = openai.OpenAI(base_url=servers["url"] + "/v1", api_key=clear, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model="utf8", messages=[{"role": "user", "content": "x"}])
    assert [m.id for m in client.models.list()] == ["plain"]


# --- external models --------------------------------------------------------------------------------

def test_an_external_model_is_forwarded_under_its_own_key(oai, servers):
    reply = oai.chat.completions.create(model="ext", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content.startswith("tok0")
    seen = [r for r in records(servers, "external") if r["event"] == "request"][-1]
    assert seen["authorization"] == "Bearer upstream-secret"  # never the client's key
    chunks = list(oai.chat.completions.create(model="ext", stream=True, messages=[{"role": "user", "content": "x"}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).startswith("tok0")


def test_an_external_upstreams_error_status_comes_back_as_it_is(servers, key, models):
    Model.objects.filter(name="ext").update(external_base_url=f"http://127.0.0.1:{servers['ports']['limited']}/v1")
    # External models come from the in-memory view: the edit applies within a refresh.
    wait_until(lambda: post(servers, "/v1/chat/completions", {"model": "ext", "messages": HI}, key).status_code == 429,
               timeout_s=10, what="the external model's new URL to apply")


# --- streaming, exactly ------------------------------------------------------------------------------

def test_a_character_split_across_tcp_writes_arrives_intact(oai):
    chunks = oai.chat.completions.create(model="utf8", stream=True, messages=[{"role": "user", "content": "x"}])
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TEXT
    assert oai.chat.completions.create(model="utf8", messages=[{"role": "user", "content": "x"}]).choices[0].message.content == TEXT


def test_tool_call_deltas_arrive_intact(oai):
    chunks = list(oai.chat.completions.create(model="tools", stream=True, messages=[{"role": "user", "content": "x"}]))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].function.name == "get_weather"
    assert json.loads("".join(tc.function.arguments or "" for tc in calls)) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_usage_chunk_only_when_the_client_asked_but_always_recorded(oai, servers):
    plain = list(oai.chat.completions.create(model="plain", stream=True, messages=[{"role": "user", "content": "x"}]))
    assert all(c.usage is None for c in plain)
    asked_for = [r for r in records(servers, "plain") if r["event"] == "request"][-1]
    assert asked_for["stream_options"] == {"include_usage": True}  # asked on the client's behalf
    asked = list(oai.chat.completions.create(model="plain", stream=True, stream_options={"include_usage": True},
                                             messages=[{"role": "user", "content": "x"}]))
    assert asked[-1].usage.completion_tokens == 6
    wait_until(lambda: UsageRecord.objects.filter(model_name="plain", stream=True, completion_tokens=6).count() >= 2,
               timeout_s=5, what="usage rows for both streams")


def test_a_models_default_max_tokens_bounds_requests_that_set_none(oai, servers):
    """An unbounded request can hold a replica for minutes; the model's default applies only
    when the client gave neither max_tokens nor max_completion_tokens, and never to embeddings."""
    Model.objects.filter(name="plain").update(default_max_tokens=3)
    messages = [{"role": "user", "content": "x"}]

    def last_request():
        return [r for r in records(servers, "plain") if r["event"] == "request"][-1]

    def bounded():
        reply = oai.chat.completions.create(model="plain", messages=messages)
        return reply.choices[0].finish_reason == "length"
    wait_until(bounded, timeout_s=5, what="the gateway to see the new default")  # the cache refreshes
    reply = oai.chat.completions.create(model="plain", messages=messages)
    assert reply.usage.completion_tokens == 3 and last_request()["max_tokens"] == 3
    chunks = list(oai.chat.completions.create(model="plain", stream=True, messages=messages))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "tok0 tok1 tok2 "
    assert last_request()["max_tokens"] == 3 and last_request()["stream_options"] == {"include_usage": True}
    assert oai.completions.create(model="plain", prompt="x").choices[0].text == "tok0 tok1 tok2 "
    oai.chat.completions.create(model="plain", messages=messages, max_tokens=5)
    assert last_request()["max_tokens"] == 5
    # The newer name alone is copied to max_tokens (llama-cpp-python ignores it).
    oai.chat.completions.create(model="plain", messages=messages, max_completion_tokens=4)
    assert last_request()["max_tokens"] == 4 and last_request()["max_completion_tokens"] == 4
    post(servers, "/v1/chat/completions", {"model": "plain", "messages": messages, "max_tokens": None}, oai.api_key)
    assert last_request()["max_tokens"] == 3  # no limit named: the default applies
    for unbounded in (0, -1):  # "no limit" to llama.cpp, but OpenAI refuses them: never sent
        before = len(records(servers, "plain"))
        r = post(servers, "/v1/chat/completions", {"model": "plain", "messages": messages, "max_tokens": unbounded},
                 oai.api_key)
        assert r.status_code == 400 and r.json()["error"]["code"] == "integer_below_min_value", r.text
        assert len(records(servers, "plain")) == before
    oai.embeddings.create(model="plain", input="x")
    assert last_request()["path"].endswith("embeddings") and last_request()["max_tokens"] is None


def test_an_external_models_request_is_sent_as_the_client_wrote_it(oai, servers):
    oai.chat.completions.create(model="ext", messages=[{"role": "user", "content": "x"}], max_completion_tokens=4)
    seen = [r for r in records(servers, "external") if r["event"] == "request"][-1]
    assert seen["max_tokens"] is None and seen["max_completion_tokens"] == 4
    with pytest.raises(ValidationError) as refused:
        Model(name="ext2", external_base_url="http://x/v1", default_max_tokens=10).full_clean()
    assert "Only for models served here" in str(refused.value)


def test_a_client_that_disconnects_cancels_the_upstream_request(servers, key, models):
    with socket.create_connection(("127.0.0.1", servers["ports"]["web"])) as sock:
        body = json.dumps({"model": "slow", "stream": True, "messages": HI}).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     + f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        assert b"tok" in sock.recv(4096) + sock.recv(4096)
    wait_until(lambda: any(r["event"] == "cancelled" for r in records(servers, "slow")), timeout_s=60,
               what="the engine to see the cancellation")


def test_a_client_gone_before_a_non_streamed_answer_is_counted_out_and_recorded_499(servers, key, models):
    """Engines send a non-streamed answer's headers only when done: a client leaving before
    then once left the replica counted in flight for good (never idle, never evicted)."""
    from fleet.models import UsageReport

    slow = models["slow"].replicas.get()
    sent = [r for r in records(servers, "slow") if r["event"] == "request"]
    # The client leaves once the engine has the request (its answer is 5 s away), however
    # long a busy machine took to get it there: a client timeout could run out first.
    with open_request(servers["ports"]["web"], "/v1/chat/completions", {"model": "slow", "messages": HI}, key):
        wait_until(lambda: len([r for r in records(servers, "slow") if r["event"] == "request"]) > len(sent),
                   timeout_s=60, what="the engine to get the request")
    wait_until(lambda: UsageRecord.objects.filter(model_name="slow", stream=False, status=499).exists(),
               timeout_s=60, what="a 499 usage record")
    assert UsageRecord.objects.get(model_name="slow", stream=False, status=499).replica_id == slow.pk

    def counted_out():
        reports = list(UsageReport.objects.filter(replica=slow))
        return reports and all(r.in_flight == 0 for r in reports)
    wait_until(counted_out, timeout_s=60, what="the replica's in-flight count back to 0")


def test_a_refused_connection_is_retried_on_another_ready_replica(servers, key, models):
    good = Replica.objects.get(model=models["plain"], port=servers["ports"]["plain"])
    serve(models["plain"], free_port())  # a second "ready" replica whose port refuses
    time.sleep(0.3)
    for _ in range(6):  # whichever replica is chosen first, every request succeeds, from the one that listens
        r = post(servers, "/v1/chat/completions", {"model": "plain", "messages": HI}, key)
        assert r.status_code == 200 and routed_to(r, good), (r.status_code, r.headers.get("x-llmgw-replica"))


def test_an_upstream_429_stays_a_429(oai):
    with pytest.raises(openai.RateLimitError):
        oai.chat.completions.create(model="limited", messages=[{"role": "user", "content": "x"}])


def test_an_oversized_body_is_a_413_before_any_upstream_work(servers, key, models):
    before = len(records(servers, "plain"))  # every event of the engine
    r = post(servers, "/v1/chat/completions", {"model": "plain", "messages": [{"role": "user", "content": "x" * 5000}]}, key)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert len(records(servers, "plain")) == before


def test_the_async_openai_client_streams_and_gets_errors(servers, key, models):
    async def main():
        client = openai.AsyncOpenAI(base_url=servers["url"] + "/v1", api_key=key, max_retries=0)
        stream = await client.chat.completions.create(model="utf8", stream=True, messages=[{"role": "user", "content": "x"}])
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
        await client.close()
        return text

    assert asyncio.run(main()) == TEXT


def test_responses_name_the_replica_and_the_overhead(servers, key, models):
    r = post(servers, "/v1/chat/completions", {"model": "plain", "messages": HI}, key)
    assert r.headers["x-llmgw-replica"].endswith("@local") and float(r.headers["x-llmgw-overhead-ms"]) < 1000


# --- usage and metrics ----------------------------------------------------------------------------

def test_usage_rows_carry_key_model_replica_tokens_and_times(servers, key, models):
    post(servers, "/v1/chat/completions", {"model": "plain", "messages": HI}, key)
    row = wait_until(lambda: UsageRecord.objects.filter(model_name="plain", status=200, stream=False,
                                                        key__name="edges").first(), timeout_s=5, what="a usage row")
    assert row.replica_id and row.prompt_tokens >= 1 and row.completion_tokens == 6
    assert row.ttft_ms > 0 and row.total_ms >= row.ttft_ms


def test_metrics_parse_and_count_requests_by_model_and_status(servers, key, models):
    post(servers, "/v1/chat/completions", {"model": "plain", "messages": HI}, key)
    post(servers, "/v1/chat/completions", {"model": "no-such-model-" + "x" * 10, "messages": HI}, key)
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(servers["url"] + "/metrics").text)}
    labels = {(s.labels.get("model"), s.labels.get("status")) for s in families["llmgw_requests"].samples
              if s.name == "llmgw_requests_total"}
    assert ("plain", "200") in labels and ("unknown", "404") in labels
    assert not any(m and m.startswith("no-such-model") for m, _ in labels)  # bounded labels
    for name in ("llmgw_time_to_first_token_seconds", "llmgw_request_duration_seconds", "llmgw_gateway_overhead_seconds",
                 "llmgw_requests_in_flight", "llmgw_requests_held_for_cold_start", "llmgw_replicas", "llmgw_agents_connected"):
        assert name in families, name


def in_flight(servers, model: str) -> float:
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(servers["url"] + "/metrics").text)}
    return sum(s.value for s in families["llmgw_requests_in_flight"].samples if s.labels.get("model") == model)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "streamed"])
def test_a_request_counts_in_flight_from_its_upstream_call_to_its_end(servers, key, models, stream):
    """A JSON answer comes whole at the end (the engine holds its headers until then): it was
    never counted in ``llmgw_requests_in_flight``, which only streams were."""
    wait_until(lambda: in_flight(servers, "slow") == 0, timeout_s=60, what="earlier tests' requests to end")
    sent = [r for r in records(servers, "slow") if r["event"] == "request"]
    answered = []
    client = threading.Thread(target=lambda: answered.append(post(
        servers, "/v1/chat/completions", {"model": "slow", "messages": HI, "stream": stream}, key, timeout=120)))
    client.start()
    try:
        wait_until(lambda: len([r for r in records(servers, "slow") if r["event"] == "request"]) > len(sent),
                   timeout_s=60, what="the engine to get the request")
        assert in_flight(servers, "slow") == 1  # its answer is 5 s away
    finally:
        client.join(120)
    assert answered[0].status_code == 200
    wait_until(lambda: in_flight(servers, "slow") == 0, timeout_s=30, what="the gauge back to 0")


def test_usage_is_flushed_when_the_web_process_is_stopped(servers, models, tmp_path):
    _, key = ApiKey.create_key("flush-test")
    port = free_port()
    web = daphne(port, tmp_path, env={"LLMGW_USAGE_FLUSH_INTERVAL": "1h", "LLMGW_WATCH_INTERVAL": "50ms"})
    try:
        time.sleep(0.3)
        for _ in range(3):
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "plain", "messages": HI},
                           headers={"Authorization": f"Bearer {key}"}, timeout=30)
            assert r.status_code == 200
        assert UsageRecord.objects.filter(key__name="flush-test").count() == 0  # still in memory
    finally:
        web.stop(sig=signal.SIGTERM)
    assert UsageRecord.objects.filter(key__name="flush-test").count() == 3


def test_a_stream_the_engine_breaks_off_ends_with_an_error_event_and_is_recorded_as_502(servers, key, make_model,
                                                                                       tmp_path):
    port = free_port()
    dying = fake_engine(port, tmp_path, "--tokens", "100", "--token-delay-ms", "50", "--exit-after-s", "1.5")
    try:
        wait_for_port(port)
        model = make_model("dying")
        serve(model, port)
        time.sleep(0.3)
        with httpx.stream("POST", servers["url"] + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                          json={"model": "dying", "stream": True, "messages": HI}, timeout=30) as r:
            body = b"".join(r.iter_raw())
        assert b"tok" in body and b"upstream_stream_broken" in body and not body.rstrip().endswith(b"[DONE]")
        wait_until(lambda: UsageRecord.objects.filter(model_name="dying", status=502).exists(), timeout_s=5,
                   what="the broken stream's record")
    finally:
        dying.stop()


# --- request shapes ------------------------------------------------------------------------------

def test_a_body_sent_as_form_data_reaches_the_engine_as_json(servers, key, models):
    """curl -d without -H Content-Type says application/x-www-form-urlencoded; engines that
    trust the header (llama-cpp-python) would answer 500."""
    body = json.dumps({"model": "plain", "messages": HI}).encode()
    r = httpx.post(servers["url"] + "/v1/chat/completions", content=body, timeout=30,
                   headers={"Authorization": f"Bearer {key}", "Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200
    assert [x for x in records(servers, "plain") if x["event"] == "request"][-1]["content_type"] == "application/json"


@pytest.mark.parametrize("body, param, code", [
    ({"messages": "hi"}, "messages", "invalid_type"),
    ({"messages": []}, "messages", "empty_array"),
    ({}, "messages", "missing_required_parameter"),
    ({"messages": ["hi"]}, "messages[0]", "invalid_type"),
    ({"messages": [{"content": "x"}]}, "messages[0].role", "missing_required_parameter"),
    ({"messages": HI, "max_tokens": "10"}, "max_tokens", "invalid_type"),
    ({"messages": HI, "stream": "yes"}, "stream", "invalid_type"),
    ({"messages": HI, "temperature": "hot"}, "temperature", "invalid_type"),
])
def test_a_wrongly_shaped_chat_request_is_a_400_naming_the_field_before_any_engine(servers, key, models, body, param,
                                                                                  code):
    before = len(records(servers, "plain"))
    r = post(servers, "/v1/chat/completions", {"model": "plain", **body}, key)
    assert r.status_code == 400 and r.json()["error"]["param"] == param and r.json()["error"]["code"] == code
    assert "Traceback" not in r.text and len(records(servers, "plain")) == before


def test_wrongly_shaped_completions_embeddings_and_model_fields_are_400s(servers, key, models):
    for path, body, param in [("/v1/completions", {"model": "plain", "prompt": 5}, "prompt"),
                              ("/v1/embeddings", {"model": "plain"}, "input"),
                              ("/v1/embeddings", {"model": "plain", "input": {"a": 1}}, "input"),
                              ("/v1/chat/completions", {"model": 5, "messages": HI}, "model")]:
        r = post(servers, path, body, key)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, body, r.text)
    assert "expected a string, but got an integer" in post(servers, "/v1/chat/completions", {"model": 5}, key).text


def test_an_endpoint_the_gateway_does_not_serve_is_a_404_that_never_reaches_a_replica(servers, key, models):
    before = len(records(servers, "plain"))
    r = post(servers, "/v1/foo", {"model": "plain"}, key)
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "unknown_url" and "/v1/foo" in r.json()["error"]["message"]
    assert "x-llmgw-replica" not in r.headers and len(records(servers, "plain")) == before


@pytest.mark.parametrize("raw, why", [
    (b'{"model": "plain", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}', "NaN"),
    (b'{"model": "plain", "messages": [{"role": "user", "content": "x"}], "temperature": 1e400}', "out of range"),
    (b'{"model": "plain", "x": ' + b"[" * 2000 + b"]" * 2000 + b"}", "nested"),  # under the 4 KB limit
])
def test_bodies_python_would_mangle_are_400s_not_500s(servers, key, models, raw, why):
    r = httpx.post(servers["url"] + "/v1/chat/completions", content=raw, timeout=30,
                   headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", (why, r.text[:300])


def test_integral_floats_are_counts_and_a_float_limit_is_kept(oai, servers):
    Model.objects.filter(name="plain").update(default_max_tokens=3)
    r = post(servers, "/v1/chat/completions", {"model": "plain", "messages": HI, "max_tokens": 5.0, "n": 1.0},
             oai.api_key)
    assert r.status_code == 200
    assert [x for x in records(servers, "plain") if x["event"] == "request"][-1]["max_tokens"] == 5.0
    assert post(servers, "/v1/chat/completions", {"model": "plain", "messages": HI, "max_tokens": 5.5},
                oai.api_key).status_code == 400


def test_the_sdk_retrieves_a_model_by_name_or_alias_and_gets_404_for_none(servers, key, models):
    Model.objects.filter(name="plain").update(aliases="plain-alias")
    client = openai.OpenAI(base_url=servers["url"] + "/v1", api_key=key, max_retries=0)
    assert client.models.retrieve("plain").id == "plain"
    assert client.models.retrieve("plain-alias").id == "plain"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
    _, narrow = ApiKey.create_key("narrow-retrieve", ["plain"])
    with pytest.raises(openai.PermissionDeniedError):
        openai.OpenAI(base_url=servers["url"] + "/v1", api_key=narrow, max_retries=0).models.retrieve("utf8")
    listed = httpx.get(servers["url"] + "/v1/models/", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    assert listed.status_code == 200 and listed.json()["object"] == "list"
    r = httpx.get(servers["url"] + "/v1/", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"
