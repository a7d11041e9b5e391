"""The admission queue end to end: a model benchmarked at one request at a time on a slow
fake engine, a real web process. Requests above capacity wait in the gateway (the engine sees
one at a time), by priority, fairly across teams, FIFO within one; a bounded wait is a 429;
a client that leaves is out of the queue; the queue's depth reaches the database the scaler
reads."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from catalog.models import Benchmark, ClusterSettings
from fleet.models import QueueReport
from gateway.models import ApiKey, Priority, Team, UsageRecord
from tests.processes import daphne, fake_engine, free_port, open_request, wait_for_port, wait_until
from tests.replicas import routed_to, serve

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def servers(django_db_setup, tmp_path_factory):
    logs = tmp_path_factory.mktemp("admission")
    port, web_port = free_port(), free_port()
    record = logs / "engine.jsonl"
    engine = fake_engine(port, logs, "--tokens", "3000", "--token-delay-ms", "20", "--record", str(record))
    wait_for_port(port)
    web = daphne(web_port, logs, env={"LLMGW_WATCH_INTERVAL": "50ms", "LLMGW_USAGE_FLUSH_INTERVAL": "0.2s"})
    yield {"port": port, "url": f"http://127.0.0.1:{web_port}", "record": record, "web": web}
    for proc in (web, engine):
        proc.stop()


@pytest.fixture
def model(servers, make_model):
    m = make_model("queued")
    replica = serve(m, servers["port"])
    Benchmark.objects.create(model=m, profile=m.profile, max_concurrency=1, slo_ttft_p95_ms=1000)
    ClusterSettings.objects.update_or_create(pk=1, defaults={"admission_wait_s": 60})
    probe = ApiKey.create_key("probe")[1]
    wait_until(lambda: routed_to(chat(servers, probe, "probe"), replica), timeout_s=60, what="routed")
    servers["record"].write_text("")
    return m


def chat(servers, key: str, text: str, headers: dict | None = None, timeout_s: float = 120) -> httpx.Response:
    return httpx.post(servers["url"] + "/v1/chat/completions", timeout=timeout_s,
                      json={"model": "queued", "messages": [{"role": "user", "content": text}], "max_tokens": 2},
                      headers={"Authorization": f"Bearer {key}", **(headers or {})})


def engine_order(servers) -> list[str]:
    lines = [json.loads(line) for line in servers["record"].read_text().splitlines() if line.strip()]
    return [r["contents"][0] for r in lines if r.get("event") == "request" and r.get("contents")]


def queued_here() -> int:
    return sum(QueueReport.objects.values_list("waiting", flat=True))


def in_background(fn, *args, **kw) -> threading.Thread:
    thread = threading.Thread(target=fn, args=args, kwargs=kw, daemon=True)
    thread.start()
    return thread


class Holder:
    """A request that takes the model's one slot and keeps it (a minute of generation) until
    :meth:`release` hangs it up: the test decides when the queue moves, not a clock."""

    def __init__(self, servers, key: str) -> None:
        port = int(servers["url"].rsplit(":", 1)[1])
        self.sock = open_request(port, "/v1/chat/completions", {
            "model": "queued", "max_tokens": 3000, "stream": True,
            "messages": [{"role": "user", "content": "holder"}]}, key)
        wait_until(lambda: "holder" in engine_order(servers), timeout_s=60, what="the holder at the engine")

    def release(self) -> None:
        self.sock.close()


def test_above_capacity_requests_wait_in_the_gateway_and_the_depth_reaches_the_scaler(servers, model):
    _, key = ApiKey.create_key("many")
    holder = Holder(servers, key)
    threads = [in_background(chat, servers, key, f"r{i}") for i in range(4)]
    # The engine has only the holder; the four wait at the gateway, reported.
    wait_until(lambda: queued_here() == 4, timeout_s=60, what="the queue reported")
    assert engine_order(servers) == ["holder"]
    holder.release()
    for t in threads:
        t.join(120)
    assert sorted(engine_order(servers)[1:]) == [f"r{i}" for i in range(4)]
    wait_until(lambda: queued_here() == 0, timeout_s=60, what="the queue report back to 0")
    wait_until(lambda: UsageRecord.objects.filter(model_name="queued", status=200).count() >= 4, timeout_s=60,
               what="the four answers recorded")  # records are written in batches


def test_a_higher_priority_is_admitted_first_and_a_header_may_only_lower_it(servers, model):
    # One team: one tenant (no fair-share headroom to borrow), keys of two classes.
    team = Team.objects.create(name="classes")
    _, low = ApiKey.create_key("low", priority=Priority.LOW, team=team)
    _, high = ApiKey.create_key("high", priority=Priority.HIGH, team=team)
    holder = Holder(servers, low)
    waiting = [in_background(chat, servers, low, "low-1")]
    wait_until(lambda: queued_here() >= 1, timeout_s=60)
    waiting.append(in_background(chat, servers, high, "high-asks-low", {"X-Llmgw-Priority": "low"}))
    wait_until(lambda: queued_here() >= 2, timeout_s=60)
    waiting.append(in_background(chat, servers, high, "high-1"))
    waiting.append(in_background(chat, servers, low, "low-asks-high", {"X-Llmgw-Priority": "high"}))
    wait_until(lambda: queued_here() >= 4, timeout_s=60)
    holder.release()
    for t in waiting:
        t.join(120)
    # high first; then the low class in arrival order (asking higher gets the key's own).
    assert engine_order(servers) == ["holder", "high-1", "low-1", "high-asks-low", "low-asks-high"]
    # The class applied is in the answer: asking higher gets the key's own.
    assert chat(servers, low, "x", {"X-Llmgw-Priority": "high"}).headers["x-llmgw-priority"] == "low"
    assert chat(servers, high, "x", {"X-Llmgw-Priority": "normal"}).headers["x-llmgw-priority"] == "normal"
    bad = chat(servers, high, "x", {"X-Llmgw-Priority": "urgent"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Llmgw-Priority"


def test_a_light_team_is_admitted_within_its_share_behind_a_flooding_team(servers, model):
    flood_team, light_team = Team.objects.create(name="flood"), Team.objects.create(name="light")
    _, flood = ApiKey.create_key("flood", team=flood_team)
    _, light = ApiKey.create_key("light", team=light_team)
    holder = Holder(servers, flood)
    threads = []
    for i in range(8):
        threads.append(in_background(chat, servers, flood, f"flood-{i}"))
        wait_until(lambda n=i + 1: queued_here() >= n, timeout_s=60)
    threads.append(in_background(chat, servers, light, "light-0"))
    # Under its share, the light team is let in at once (the headroom), while the flood waits.
    wait_until(lambda: "light-0" in engine_order(servers), timeout_s=60, what="the light team admitted")
    assert engine_order(servers) == ["holder", "light-0"] and queued_here() == 8
    holder.release()
    for t in threads:
        t.join(180)
    order = engine_order(servers)
    assert [x for x in order if x.startswith("flood-")] == [f"flood-{i}" for i in range(8)]  # FIFO within


def test_a_bounded_wait_is_a_429_with_retry_after(servers, model):
    ClusterSettings.objects.update_or_create(pk=1, defaults={"admission_wait_s": 1})
    _, key = ApiKey.create_key("impatient")
    time.sleep(0.3)  # a refresh brings the setting
    holder = Holder(servers, key)

    def refused_within_seconds():
        started = time.monotonic()
        answer = chat(servers, key, "waiter")
        assert answer.status_code == 429, answer.text
        return answer if time.monotonic() - started < 30 else None  # the setting's second, not a minute

    refused = wait_until(refused_within_seconds, timeout_s=180, what="the 1 s wait applied")
    error = refused.json()["error"]
    assert error["code"] == "model_at_capacity" and int(refused.headers["Retry-After"]) >= 1
    holder.release()
    assert "waiter" not in engine_order(servers)


def test_a_client_that_leaves_the_queue_is_out_of_it(servers, model):
    _, key = ApiKey.create_key("leaver")
    holder = Holder(servers, key)
    port = int(servers["url"].rsplit(":", 1)[1])
    sock = open_request(port, "/v1/chat/completions", {"model": "queued", "max_tokens": 4,
                                                       "messages": [{"role": "user", "content": "gone"}]}, key)
    wait_until(lambda: queued_here() >= 1, timeout_s=60, what="the leaver queued")
    sock.close()
    wait_until(lambda: UsageRecord.objects.filter(model_name="queued", status=499).exists(), timeout_s=60)
    wait_until(lambda: queued_here() == 0, timeout_s=60)
    holder.release()
    assert chat(servers, key, "after").status_code == 200
    assert "gone" not in engine_order(servers)  # never reached the engine
