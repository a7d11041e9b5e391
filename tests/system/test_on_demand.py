"""On-demand models through a real cluster (daphne, qcluster, agent, fake engines): held
requests, cold-start timeout, unservable answers, one placement for many callers, idle
eviction back to zero."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest

from catalog.models import ClusterSettings, Model
from fleet.models import ModelState, Replica
from tests.cluster import fake_profile, live_cluster_fixture
from tests.processes import wait_until

pytestmark = [pytest.mark.timeout(120)]


live = live_cluster_fixture("on-demand")


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
