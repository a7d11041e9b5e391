"""The gateway's overhead (``Exchange.note_overhead``): its own work before the upstream
call, never the time a request waited on others — held for a replica (a cold start), in the
admission queue — which TTFT and the total keep, as the client sees them."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

from catalog.models import ClusterSettings
from gateway import queueing
from gateway.exchange import Exchange
from gateway.models import ApiKey, Priority, UsageRecord
from tests.processes import daphne, fake_engine, free_port, wait_for_port, wait_until
from tests.replicas import serve

HI = [{"role": "user", "content": "x"}]
#: How long the test holds a request before a replica becomes ready.
HOLD_S = 2.0


def test_overhead_is_the_time_so_far_less_what_was_waited():
    ex = Exchange("chat/completions")
    ex.started -= 5.0  # began five seconds ago…
    ex.waited(4.9)  # …of which it waited 4.9
    ex.waited(-1.0)  # a clock's jitter never counts back
    ex.note_overhead()
    assert ex.waited_s == 4.9
    assert 0.1 <= ex.overhead_s < 1.0


async def test_time_in_the_admission_queue_is_waited_not_overhead(monkeypatch):
    monkeypatch.setattr(queueing.live, "capacity", lambda model_id: (1, 1))  # one request at a time
    monkeypatch.setattr(queueing.live, "set_queued", lambda model_id, depth: None)
    monkeypatch.setattr(queueing.cache, "admission_settings", lambda: SimpleNamespace(admission_wait_s=60))
    monkeypatch.setattr(queueing, "_ensure_resizer", lambda: None)  # no watcher in this test
    model = SimpleNamespace(id=-4242, name="overhead-queue")
    tenancy = SimpleNamespace(tenant="t", weight=1.0)
    first, second = Exchange("chat/completions"), Exchange("chat/completions")
    assert await queueing.wait_for_slot(model, first, tenancy, Priority.NORMAL, lambda: 1) is None
    assert first.waited_s == 0  # admitted at once
    queued = asyncio.create_task(queueing.wait_for_slot(model, second, tenancy, Priority.NORMAL, lambda: 1))
    await asyncio.sleep(0.5)
    assert not queued.done()
    for release in first.on_finish:
        release()
    assert await asyncio.wait_for(queued, 10) is None
    second.note_overhead()
    assert second.waited_s >= 0.5
    assert second.overhead_s < time.monotonic() - second.started - 0.5
    for release in second.on_finish:
        release()


@pytest.mark.django_db(transaction=True)
def test_a_held_requests_overhead_leaves_the_hold_out_and_its_ttft_keeps_it(tmp_path, make_model):
    engine_port, web_port = free_port(), free_port()
    engine = fake_engine(engine_port, tmp_path, "--tokens", "3")
    wait_for_port(engine_port)
    settings = ClusterSettings.get_solo()
    settings.cold_start_timeout_s = 120
    settings.save()
    cold = make_model("cold", min_replicas=0, max_replicas=1, on_demand=True)
    _, key = ApiKey.create_key("overhead")
    web = daphne(web_port, tmp_path, env={"LLMGW_WATCH_INTERVAL": "50ms", "LLMGW_USAGE_FLUSH_INTERVAL": "0.2s"})
    url = f"http://127.0.0.1:{web_port}"
    answers: list[httpx.Response] = []
    try:
        def chat(model: str) -> httpx.Response:
            return httpx.post(f"{url}/v1/chat/completions", json={"model": model, "messages": HI},
                              headers={"Authorization": f"Bearer {key}"}, timeout=120)

        assert chat("no-such-model").status_code == 404  # the process is warm: its first request is done
        thread = threading.Thread(target=lambda: answers.append(chat("cold")), daemon=True)
        thread.start()
        wait_until(lambda: 'llmgw_requests_held{model="cold"} 1.0' in httpx.get(f"{url}/metrics", timeout=10).text,
                   timeout_s=30, what="the request held")
        time.sleep(HOLD_S)  # no replica: no reconciler runs here, the request stays held
        serve(cold, engine_port)
        thread.join(60)
        (answer,) = answers
        assert answer.status_code == 200, answer.text
        overhead_ms = float(answer.headers["x-llmgw-overhead-ms"])
        record = wait_until(lambda: UsageRecord.objects.filter(model_name="cold", status=200).first(),
                            timeout_s=30, what="the usage record")
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    finally:
        web.stop()
        engine.stop()
    # The client waited the hold before its first token; the gateway's own work is apart from it.
    assert record.ttft_ms >= HOLD_S * 1000
    assert record.overhead_ms == pytest.approx(overhead_ms, abs=0.01)
    assert overhead_ms < 1000  # was the whole hold (over 2 s) before
    assert record.ttft_ms - record.overhead_ms >= HOLD_S * 1000
    assert "llmgw_gateway_overhead_seconds_count 1.0" in metrics  # the held request, the only one relayed
    overhead_sum = next(line for line in metrics.splitlines() if line.startswith("llmgw_gateway_overhead_seconds_sum"))
    assert float(overhead_sum.split()[1]) < 1.0
