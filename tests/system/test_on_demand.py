"""On-demand models through a real cluster (web, qcluster, agent, fake engines): held
requests, cold-start timeout, unservable answers, one placement for many callers, idle
eviction back to zero; held requests ended as soon as the answer is known (a crash loop,
a failed start), a new fixed model's first request held, a client gone while held."""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import time

import httpx
import pytest

from catalog.models import ClusterSettings, Model
from fleet.models import ModelState, Replica
from tests.cluster import fake_profile, live_cluster_fixture
from tests.processes import ROOT, open_request, wait_until

pytestmark = [pytest.mark.timeout(120)]


FLAKY_ENGINE = ROOT / "tests" / "flaky_engine.py"
METRICS_TOKEN = "on-demand-metrics"
# Routing drops a silent agent's replicas after 2 s; the planner re-places them after 30 s.
live = live_cluster_fixture("on-demand", extra_env={"LLMGW_METRICS_TOKEN": METRICS_TOKEN,
                                                    "LLMGW_AGENT_ROUTE_GRACE": "2s", "LLMGW_AGENT_LOST_AFTER": "30s"})


@pytest.fixture
def client(live):
    with httpx.Client(base_url=live.url, timeout=60) as c:
        yield c


def on_demand(name: str, *engine_args: str, gpus: int = 0, **kw) -> Model:
    profile = fake_profile(f"p-{name}", *engine_args, gpus=gpus)
    m = Model(name=name, weights="file:/dev/null", profile=profile, min_replicas=0, max_replicas=1,
              on_demand=True, **kw)
    m.full_clean()
    m.save()
    return m


def chat(client, name: str, **kw) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"model": name, "messages": [{"role": "user", "content": "hi"}], **kw})


def test_a_held_request_succeeds_once_the_replica_is_ready(live, client):
    on_demand("cold-a", "--startup-delay-s", "1.5")
    assert Replica.objects.filter(model__name="cold-a").count() == 0
    started = time.monotonic()
    r = chat(client, "cold-a")
    assert r.status_code == 200, r.text + live.logs()
    assert time.monotonic() - started >= 1.4  # it really waited for the engine to load
    assert r.json()["choices"][0]["message"]["content"]


def test_a_held_streaming_request_streams_once_ready(live, client):
    on_demand("cold-stream", "--startup-delay-s", "1")
    with client.stream("POST", "/v1/chat/completions",
                       json={"model": "cold-stream", "stream": True, "messages": [{"role": "user", "content": "x"}]}) as r:
        assert r.status_code == 200
        body = b"".join(r.iter_raw())
    assert body.count(b"data: ") >= 3 and b"[DONE]" in body


def test_cold_start_timeout_is_a_503_with_retry_after(live, client):
    ClusterSettings.objects.filter(pk=1).update(cold_start_timeout_s=1)
    time.sleep(0.3)  # settings reach the gateway with its next refresh
    try:
        on_demand("very-slow", "--startup-delay-s", "20")
        started = time.monotonic()
        r = chat(client, "very-slow")
        assert r.status_code == 503
        assert r.headers["retry-after"]
        assert "still loading" in r.json()["error"]["message"]
        assert time.monotonic() - started < 5
    finally:
        ClusterSettings.objects.filter(pk=1).update(cold_start_timeout_s=300)
        Model.objects.filter(name="very-slow").update(on_demand=True, idle_timeout_s=1)


def test_an_unservable_model_is_answered_promptly_with_the_reason(live, client):
    m = on_demand("needs-gpu", gpus=1)
    started = time.monotonic()
    r = chat(client, "needs-gpu")
    assert r.status_code == 503
    assert time.monotonic() - started < 5
    message = r.json()["error"]["message"]
    assert "no agent has 1 free GPU of 40 GiB" in message and "local: no GPUs" in message
    first_reason_at = ModelState.objects.get(model=m).reason_at
    # A new request forgets the failed result: the next pass decides afresh.
    r = chat(client, "needs-gpu")
    assert r.status_code == 503
    assert ModelState.objects.get(model=m).reason_at > first_reason_at


def test_twenty_concurrent_first_requests_place_one_replica_and_all_succeed(live, client):
    m = on_demand("crowd", "--startup-delay-s", "1")

    def one(_):
        with httpx.Client(base_url=live.url, timeout=60) as c:
            return chat(c, "crowd").status_code

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        codes = list(pool.map(one, range(20)))
    assert codes == [200] * 20, live.logs()
    assert Replica.objects.filter(model=m).count() == 1


def test_an_idle_on_demand_model_returns_to_zero(live, client):
    m = on_demand("brief", idle_timeout_s=2)
    assert chat(client, "brief").status_code == 200
    replica = Replica.objects.get(model=m)
    wait_until(lambda: Replica.objects.get(pk=replica.pk).state == "stopped", timeout_s=30,
               what="the idle replica to stop")
    assert ModelState.objects.get(model=m).wanted_at is None
    assert "idle for" in Replica.objects.get(pk=replica.pk).reason
    # And it comes back when asked again.
    assert chat(client, "brief").status_code == 200
    assert Replica.objects.filter(model=m, state="ready").count() == 1


def test_use_keeps_an_on_demand_model_alive_past_its_idle_timeout(live, client):
    m = on_demand("busy", idle_timeout_s=2)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert chat(client, "busy").status_code == 200
        time.sleep(0.3)
    # The one replica it started with, never drained and replaced.
    assert list(Replica.objects.filter(model=m).values_list("state", flat=True)) == ["ready"]


# --- held requests end as soon as the answer is known (issue 14) ----------------------------

def flaky_profile(name: str, flag) -> object:
    from catalog.models import Profile

    profile = Profile(name=name, engine=Profile.Engine.CUSTOM,
                      command=f"{{python}} {FLAKY_ENGINE} --crash-while {flag} --host {{host}} --port {{port}}"
                              " --served-name {served_name} --api-key {api_key}",
                      gpus_needed=0, cpu_cores=0.1, memory_mib=64, readiness_path="/v1/models", startup_timeout_s=30)
    profile.full_clean()
    profile.save()
    return profile


@pytest.fixture
def long_cold_start(live):
    """A cold-start timeout far above what any answer below may take (60 s)."""
    ClusterSettings.objects.filter(pk=1).update(cold_start_timeout_s=60)
    time.sleep(0.3)  # settings reach the gateway with its next refresh
    yield 60
    ClusterSettings.objects.filter(pk=1).update(cold_start_timeout_s=300)


def test_held_requests_for_a_crash_looping_model_get_its_error_at_once_all_of_them(live, long_cold_start, tmp_path):
    flag = tmp_path / "broken"
    flag.touch()
    m = Model(name="crashy", weights="file:/dev/null", profile=flaky_profile("p-crashy", flag), min_replicas=0,
              max_replicas=1, on_demand=True)
    m.full_clean()
    m.save()

    def one(_):
        with httpx.Client(base_url=live.url, timeout=long_cold_start + 30) as c:
            started = time.monotonic()
            r = chat(c, "crashy")
            return r, time.monotonic() - started

    try:
        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(one, range(20)))
        for r, took_s in answers:
            # A failed start (held through it) or the crash loop's backoff (arrived after it):
            # either way the engine's error line and the next try, long before the timeout.
            assert r.status_code == 503, r.text + live.logs()
            assert took_s < 10, (took_s, r.text)
            error = r.json()["error"]
            assert error["code"] in ("replica_start_failed", "crash_loop"), error
            assert "crash loop" in error["message"] and "CUDA out of memory" in error["message"], error
            assert "next try" in error["message"] and int(r.headers["retry-after"]) >= 1
        assert sum(r.json()["error"]["code"] == "replica_start_failed" for r, _ in answers) >= 1
        # A later request gets the same error: at once during the backoff, after the next try otherwise.
        with httpx.Client(base_url=live.url, timeout=long_cold_start + 30) as c:
            r = chat(c, "crashy")
        assert r.status_code == 503 and "CUDA out of memory" in r.json()["error"]["message"]
        assert Replica.objects.filter(model=m, state="failed").exists()
    finally:
        Model.objects.filter(pk=m.pk).update(on_demand=False, min_replicas=0)


def test_a_new_fixed_model_holds_its_first_request_until_its_replica_is_ready(live, long_cold_start):
    profile = fake_profile("p-fresh", "--startup-delay-s", "1")
    m = Model(name="fresh-fixed", weights="file:/dev/null", profile=profile, min_replicas=1, max_replicas=1)
    m.full_clean()
    m.save()
    try:
        with httpx.Client(base_url=live.url, timeout=long_cold_start + 30) as c:
            r = chat(c, "fresh-fixed")  # at once: no pass has looked at it yet
        assert r.status_code == 200, r.text + live.logs()
        assert Replica.objects.filter(model=m).count() == 1
    finally:
        Model.objects.filter(pk=m.pk).update(min_replicas=0)


def _metric(live, name: str) -> float:
    r = httpx.get(f"{live.url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10)
    found = re.search(rf"^{name} ([0-9.e+-]+)$", r.text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_client_that_hangs_up_while_held_is_no_longer_held(live, long_cold_start):
    """Several clients hang up while held: each request is cancelled and recorded 499. A
    cancel that came as a refresh woke the request was once dropped (``asyncio.wait_for`` on
    Python 3.11): that request stayed held for the engine's 30 s start and was recorded 200,
    so the 499 records themselves are waited for, not the gauge (which reaches 0 either way)."""
    from gateway.models import UsageRecord

    on_demand("hang-up", "--startup-delay-s", "30")
    body = {"model": "hang-up", "messages": [{"role": "user", "content": "hi"}]}
    clients = 8  # each hang-up is one more chance to meet a refresh waking the request
    socks = []
    try:
        for _ in range(clients):
            socks.append(open_request(live.port, "/v1/chat/completions", body))
        wait_until(lambda: _metric(live, "llmgw_requests_held_for_cold_start") == clients, timeout_s=30,
                   what="the requests to be held")
    finally:
        for sock in socks:
            sock.close()
    try:
        # The engine is ready 30 s after its start: a request still held then would be
        # answered by it (200), never 499.
        wait_until(lambda: UsageRecord.objects.filter(model_name="hang-up", status=499).count() >= clients,
                   timeout_s=60, what="every hung-up request to be recorded as 499")
        # Recorded after it left the hold: no longer counted, and nothing else recorded for it.
        assert _metric(live, "llmgw_requests_held_for_cold_start") == 0
        assert list(UsageRecord.objects.filter(model_name="hang-up").values_list("status", flat=True)) == (
            [499] * clients)
    except (TimeoutError, AssertionError) as exc:
        statuses = list(UsageRecord.objects.filter(model_name="hang-up").values_list("status", flat=True))
        raise AssertionError(f"{exc}\nrecorded: {statuses}\n{live.logs()}") from exc
    finally:
        Model.objects.filter(name="hang-up").update(idle_timeout_s=1)


def test_a_silent_agent_is_named_with_when_its_replicas_are_re_placed(live, client):
    """Last in this module: it freezes the cluster's only agent (SIGSTOP) for a few seconds."""
    profile = fake_profile("p-steady")
    m = Model(name="steady-fixed", weights="file:/dev/null", profile=profile, min_replicas=1, max_replicas=1)
    m.full_clean()
    m.save()
    assert chat(client, "steady-fixed").status_code == 200, live.logs()
    os.kill(live.agent.pid, signal.SIGSTOP)
    try:
        def silent():
            r = chat(client, "steady-fixed")
            return r if r.status_code == 503 else None
        r = wait_until(silent, timeout_s=20, what="the frozen agent's replica to leave routing")
        error = r.json()["error"]
        assert error["code"] == "agent_silent", error
        found = re.search(r"agent local silent for (\d+) s; its replicas are re-placed in (\d+) s if it stays silent",
                          error["message"])
        assert found, error["message"]
        silent_s, left_s = int(found.group(1)), int(found.group(2))
        assert silent_s >= 1 and 25 <= silent_s + left_s <= 31, error["message"]
        assert int(r.headers["retry-after"]) == left_s
    finally:
        os.kill(live.agent.pid, signal.SIGCONT)
    wait_until(lambda: chat(client, "steady-fixed").status_code == 200, timeout_s=30,
               what="the agent's replica to be routed again")
    Model.objects.filter(pk=m.pk).update(min_replicas=0)
