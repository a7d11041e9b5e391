"""Tenants' limits in production mode's Redis, through real web processes: two of them
racing over one limit admit exactly the limit; a Redis stopped mid-run is handled by the
cluster's documented choice (open: admit uncounted; closed: 503), logged once per outage,
and counting resumes when it is back."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest
from django.utils import timezone

from catalog.models import ClusterSettings
from fleet.models import Agent
from gateway.models import ApiKey
from tests.pg import private_redis
from tests.processes import daphne, fake_engine, free_port, wait_for_port, wait_until
from tests.replicas import routed_to, serve

HI = [{"role": "user", "content": "x"}]

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def redis_server():
    with private_redis() as server:
        yield server


@pytest.fixture(scope="module")
def cluster(django_db_setup, redis_server, tmp_path_factory):
    logs = tmp_path_factory.mktemp("tenants-redis")
    engine_port = free_port()
    engine = fake_engine(engine_port, logs, "--tokens", "3")
    wait_for_port(engine_port)
    env = {"LLMGW_WATCH_INTERVAL": "50ms", "LLMGW_REDIS_URL": redis_server.url,
           "LLMGW_USAGE_FLUSH_INTERVAL": "0.2s"}
    webs = [daphne(free_port(), logs, env=env) for _ in range(2)]
    yield {"engine": engine_port, "webs": webs, "logs": logs}
    for proc in [*webs, engine]:
        proc.stop()


@pytest.fixture
def routed(cluster, make_model):
    model = make_model("shared")
    replica = serve(model, cluster["engine"])
    probe = ApiKey.create_key("probe")[1]
    bases = [web_url(web) for web in cluster["webs"]]
    for base in bases:
        wait_until(lambda: routed_to(post(base, probe), replica), timeout_s=60, what="routed")
    return bases


def alive(bases: list[str]) -> None:
    """The test's agent was heard from just now, and every web process routes again (a wait
    for a minute window is longer than an agent may stay silent)."""
    Agent.objects.filter(name="local").update(last_seen_at=timezone.now())
    probe = ApiKey.create_key("alive")[1]
    for base in bases:
        wait_until(lambda: post(base, probe).status_code == 200, timeout_s=30, what="routed again")


def web_url(web) -> str:
    args = list(web.proc.args)
    for flag in ("--port", "-p"):
        if flag in args:
            return f"http://127.0.0.1:{args[args.index(flag) + 1]}"
    raise AssertionError(f"no port in {args}")


def post(base: str, key: str) -> httpx.Response:
    return httpx.post(base + "/v1/chat/completions", json={"model": "shared", "messages": HI, "max_tokens": 1},
                      headers={"Authorization": f"Bearer {key}"}, timeout=60)


def test_two_web_processes_racing_over_one_limit_admit_exactly_the_limit(cluster, routed):
    wait_until(lambda: time.time() % 60 < 30, timeout_s=40, interval_s=0.5)  # one minute window
    alive(routed)
    _, key = ApiKey.create_key("raced", requests_per_minute=25)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda i: post(routed[i % 2], key), range(60)))
    statuses = [a.status_code for a in answers]
    assert 503 not in statuses, [a.text for a in answers if a.status_code == 503][:2]
    assert statuses.count(200) == 25, statuses
    assert statuses.count(429) == 35


def test_redis_stopped_mid_run_follows_the_cluster_setting_and_is_logged_once(cluster, routed, redis_server):
    alive(routed)
    _, key = ApiKey.create_key("outage", requests_per_minute=1000)
    base = routed[0]
    ok = post(base, key)
    assert ok.status_code == 200 and "x-ratelimit-remaining-requests" in ok.headers
    web = cluster["webs"][0]
    redis_server.stop()
    try:
        # open (the default): admitted, uncounted (no headers), the outage logged once.
        answers = [post(base, key) for _ in range(10)]
        assert [a.status_code for a in answers] == [200] * 10, [a.text for a in answers]
        assert not [h for h in answers[-1].headers if h.startswith("x-ratelimit")]
        # Log lines are written by the web process's log thread: a moment after the answers.
        wait_until(lambda: "Redis unreachable for the rate-limit counters" in web.log(), timeout_s=30,
                   what="the outage to be logged")
        assert web.log().count("Redis unreachable for the rate-limit counters") == 1
        # closed: refused with 503 until Redis is back.
        ClusterSettings.objects.update_or_create(pk=1, defaults={"rate_limits_without_redis": "closed"})
        refused = wait_until(lambda: (r := post(base, key)).status_code == 503 and r, timeout_s=30)
        assert refused.json()["error"]["code"] == "rate_limits_unavailable"
        assert refused.headers["Retry-After"]
        assert web.log().count("Redis unreachable for the rate-limit counters") == 1
    finally:
        redis_server.start()
    answer = wait_until(lambda: (r := post(base, key)).status_code == 200 and r, timeout_s=30)
    assert "x-ratelimit-remaining-requests" in answer.headers
    wait_until(lambda: "Redis is back for the rate-limit counters" in web.log(), timeout_s=30,
               what="the recovery to be logged")
    assert web.log().count("Redis unreachable for the rate-limit counters") == 1  # logged once for the outage
    ClusterSettings.objects.update_or_create(pk=1, defaults={"rate_limits_without_redis": "open"})
