"""Tenants' limits end to end: a real web process, a fake engine, the ``openai`` SDK —
headers on 200 and 429, each limit at its edge, the SDK's retries, budgets seeded from usage
records (a restart is no way around a spent budget). On PostgreSQL + Redis (the CI's second
pass) the counters are Redis's."""

from __future__ import annotations

import datetime
import time

import httpx
import openai
import pytest
from django.utils import timezone

from fleet.models import Agent
from gateway.models import ApiKey, ModelBudget, Team, UsageRecord
from tests.processes import daphne, fake_engine, free_port, open_request, wait_for_port, wait_until
from tests.replicas import routed_to, serve

HI = [{"role": "user", "content": "x"}]

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def servers(django_db_setup, tmp_path_factory):
    logs = tmp_path_factory.mktemp("tenants")
    ports = {name: free_port() for name in ("fast", "slow", "web")}
    engines = [fake_engine(ports["fast"], logs, "--tokens", "5"),
               fake_engine(ports["slow"], logs, "--tokens", "400", "--token-delay-ms", "150")]
    for name in ("fast", "slow"):
        wait_for_port(ports[name])
    web = daphne(ports["web"], logs, env={"LLMGW_WATCH_INTERVAL": "50ms", "LLMGW_USAGE_FLUSH_INTERVAL": "0.2s"})
    yield {"ports": ports, "url": f"http://127.0.0.1:{ports['web']}", "web": web, "logs": logs}
    for proc in [web, *engines]:
        proc.stop()


@pytest.fixture
def models(servers, make_model):
    made = {}
    probe = ApiKey.create_key("probe")[1]
    for name in ("fast", "slow"):
        model = make_model(name)
        replica = serve(model, servers["ports"][name])
        wait_until(lambda: routed_to(post(servers, probe, {"model": name, "messages": HI, "max_tokens": 1}),
                                     replica), timeout_s=60, what=f"{name} routed")
        made[name] = model
    return made


def post(servers, key: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(servers["url"] + "/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {key}", **(headers or {})})


def early_in_a_minute(servers) -> None:
    """Wait for the first 40 s of a minute (its window must not turn while a test counts),
    then tell the web process the test's agent is alive: the wait may be longer than an
    agent may stay silent, and a request for a silent agent's model is a 503."""
    wait_until(lambda: time.time() % 60 < 40, timeout_s=30, interval_s=0.5)
    Agent.objects.filter(name="local").update(last_seen_at=timezone.now())
    probe = ApiKey.create_key("alive")[1]
    for name in ("fast", "slow"):
        wait_until(lambda n=name: post(servers, probe, {"model": n, "messages": HI, "max_tokens": 1}).status_code
                   == 200, timeout_s=30, what=f"{name} routed again")


def sdk(servers, key: str, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=servers["url"] + "/v1", api_key=key, timeout=60, **kw)


def test_requests_per_minute_at_its_edge_with_headers_on_200_and_429(servers, models):
    early_in_a_minute(servers)  # a minute window must not turn while the test counts
    _, key = ApiKey.create_key("rpm", requests_per_minute=3)
    answers = [post(servers, key, {"model": "fast", "messages": HI, "max_tokens": 2}) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429], [a.text for a in answers]
    assert [a.headers["x-ratelimit-remaining-requests"] for a in answers] == ["2", "1", "0", "0"]
    for a in answers:
        assert a.headers["x-ratelimit-limit-requests"] == "3"
        assert a.headers["x-ratelimit-reset-requests"].endswith("s")
    refused = answers[-1]
    error = refused.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests"
    assert "requests per minute (RPM)" in error["message"] and "key 'rpm'" in error["message"]
    assert int(refused.headers["Retry-After"]) in range(1, 61)
    assert refused.headers["x-should-retry"] == "true"
    # No tokens limit: no tokens headers.
    assert "x-ratelimit-limit-tokens" not in answers[0].headers


def test_tokens_per_minute_reserved_then_settled(servers, models):
    early_in_a_minute(servers)
    _, key = ApiKey.create_key("tpm", tokens_per_minute=1000)
    first = post(servers, key, {"model": "fast", "messages": HI, "max_tokens": 400})
    assert first.status_code == 200
    # Reserved at admission: prompt (≈1) + 400.
    assert 590 <= int(first.headers["x-ratelimit-remaining-tokens"]) <= 599
    used = first.json()["usage"]["total_tokens"]  # settled with this (a few tokens)
    second = post(servers, key, {"model": "fast", "messages": HI, "max_tokens": 400})
    assert second.status_code == 200
    remaining = int(second.headers["x-ratelimit-remaining-tokens"])
    assert 1000 - used - 401 - 5 <= remaining <= 1000 - used - 400, (used, remaining)
    # A request larger than the limit itself: 429, and waiting would not help.
    big = post(servers, key, {"model": "fast", "messages": HI, "max_tokens": 5000})
    assert big.status_code == 429 and big.headers["x-should-retry"] == "false"
    assert "Request too large" in big.json()["error"]["message"]


def test_the_sdk_waits_for_a_concurrency_slot_and_succeeds(servers, models):
    _, key = ApiKey.create_key("one at a time", max_concurrent_requests=1)
    # A streamed request takes the one slot (a minute of generation) until the test hangs it up.
    port = int(servers["url"].rsplit(":", 1)[1])
    holder = open_request(port, "/v1/chat/completions", {"model": "slow", "messages": HI, "max_tokens": 400,
                                                         "stream": True}, key)
    wait_until(lambda: post(servers, key, {"model": "fast", "messages": HI, "max_tokens": 1}).status_code == 429,
               timeout_s=60, what="the slot taken")
    sent, refused = [], []

    def answered(response: httpx.Response) -> None:
        if response.status_code == 429:
            refused.append(response.headers.get("Retry-After"))
            holder.close()  # the slot frees while the SDK waits out Retry-After

    client = sdk(servers, key, max_retries=5, http_client=httpx.Client(event_hooks={
        "request": [lambda request: sent.append(request.url)], "response": [answered]}))
    answer = client.chat.completions.create(model="fast", messages=HI, max_tokens=2)
    assert answer.choices[0].message.content
    assert refused and refused[0] == "1"  # refused first, told to wait a second…
    assert len(sent) == len(refused) + 1  # …retried, and got through


def test_the_sdk_does_not_retry_a_spent_budget(servers, models):
    team = Team.objects.create(name="spent", tokens_per_day=100)
    key_row, key = ApiKey.create_key("spender", team=team)
    # Spent before this process counted anything: the budget is seeded from usage records,
    # as after a restart or a failover.
    UsageRecord.objects.create(key=key_row, team_id=team.id, model_name="fast", path="chat/completions", status=200,
                               prompt_tokens=60, completion_tokens=40, total_ms=1)
    sent = []
    client = sdk(servers, key, max_retries=3,
                 http_client=httpx.Client(event_hooks={"request": [lambda request: sent.append(request.url)]}))
    started = time.monotonic()
    with pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(model="fast", messages=HI, max_tokens=2)
    assert len(sent) == 1  # asked once: x-should-retry false
    assert time.monotonic() - started < 5  # no backoff rounds
    assert raised.value.code == "insufficient_quota"
    assert "team 'spent' has used 100 of its 100 tokens today (UTC)" in raised.value.message


def test_a_team_budget_for_one_model_leaves_the_others(servers, models):
    team = Team.objects.create(name="per-model")
    ModelBudget.objects.create(team=team, model=models["slow"], tokens_per_month=1)
    _, key = ApiKey.create_key("member", team=team)
    slow = post(servers, key, {"model": "slow", "messages": HI, "max_tokens": 1})
    assert slow.status_code == 429 and slow.json()["error"]["code"] == "insufficient_quota"
    assert "for 'slow' this month (UTC)" in slow.json()["error"]["message"]
    assert post(servers, key, {"model": "fast", "messages": HI, "max_tokens": 1}).status_code == 200


def test_budget_counts_what_the_usage_records_already_hold_then_what_this_process_adds(servers, models):
    row, key = ApiKey.create_key("daily", tokens_per_day=1000)
    UsageRecord.objects.create(key=row, model_name="fast", path="chat/completions", status=200, prompt_tokens=900,
                               completion_tokens=0, total_ms=1)
    UsageRecord.objects.create(key=row, model_name="fast", path="chat/completions", status=200, prompt_tokens=500,
                               completion_tokens=0, total_ms=1, at=timezone.now() - datetime.timedelta(days=1))
    ok = post(servers, key, {"model": "fast", "messages": HI, "max_tokens": 50})  # 900 + ≈51 ≤ 1000
    assert ok.status_code == 200, ok.text
    spent = 900 + ok.json()["usage"]["total_tokens"]  # settled with the real count, not the 51 reserved
    refused = post(servers, key, {"model": "fast", "messages": HI, "max_tokens": 1000 - spent})  # 1 over
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "insufficient_quota"
    assert f"has used {spent:,} of its 1,000 tokens today" in refused.json()["error"]["message"]
    assert post(servers, key, {"model": "fast", "messages": HI, "max_tokens": 999 - spent}).status_code == 200


def test_a_key_without_limits_gets_no_headers_and_no_counting(servers, models):
    _, key = ApiKey.create_key("free")
    answer = post(servers, key, {"model": "fast", "messages": HI, "max_tokens": 1})
    assert answer.status_code == 200
    assert not [h for h in answer.headers if h.startswith("x-ratelimit")]


def test_a_streamed_answer_carries_the_headers_and_settles_at_its_end(servers, models):
    early_in_a_minute(servers)
    _, key = ApiKey.create_key("streamer", tokens_per_minute=10_000, max_concurrent_requests=1)
    with httpx.stream("POST", servers["url"] + "/v1/chat/completions", timeout=60,
                      json={"model": "slow", "messages": HI, "max_tokens": 40, "stream": True},  # ~6 s
                      headers={"Authorization": f"Bearer {key}"}) as response:
        assert response.status_code == 200
        assert int(response.headers["x-ratelimit-remaining-tokens"]) < 10_000
        # While it streams, the slot is taken.
        assert post(servers, key, {"model": "fast", "messages": HI, "max_tokens": 1}).status_code == 429
        body = response.read()
    assert b"[DONE]" in body
    # Once it ended, the slot is free again (settled in the web process).
    wait_until(lambda: post(servers, key, {"model": "fast", "messages": HI, "max_tokens": 1}).status_code == 200,
               timeout_s=30)
