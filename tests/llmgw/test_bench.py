"""``llmgw bench`` against a fake engine of known capacity, through a real gateway."""

from __future__ import annotations

import httpx

import pytest

from catalog.models import Benchmark
from tests.processes import daphne, fake_engine, free_port, wait_for_port, wait_until
from tests.replicas import ENGINE_KEY, serve
from tests.cli import llmgw

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]




def test_bench_finds_the_engines_capacity_within_one_step(make_model, tmp_path):
    engine_port, web_port = free_port(), free_port()
    # 4 slots; 8 tokens 40 ms apart: beyond 4 concurrent, requests wait ~300 ms for a slot.
    engine = fake_engine(engine_port, tmp_path, "--capacity", "4", "--tokens", "8", "--token-delay-ms", "40",
                         api_key=ENGINE_KEY)
    web = daphne(web_port, tmp_path, env={"LLMGW_WATCH_INTERVAL": "50ms"})
    try:
        wait_for_port(engine_port)
        model = make_model("bench-me")
        serve(model, engine_port)
        from gateway.models import ApiKey
        probe = ApiKey.create_key("probe")[1]
        wait_until(lambda: httpx.post(f"http://127.0.0.1:{web_port}/v1/embeddings", json={"model": "bench-me", "input": "x"},
                                      headers={"Authorization": f"Bearer {probe}"}).status_code == 200,
                   timeout_s=10, what="the model to be routed")
        code, out, err = llmgw("bench", "bench-me", "--slo-ttft-p95-ms", "200", "--url", f"http://127.0.0.1:{web_port}",
                               "--max-concurrency", "16", "--requests-per-step", "16")
        assert code == 0, out + err
        measured = Benchmark.objects.get(model=model).max_concurrency
        assert measured == 4, out  # the fake engine has exactly 4 slots
        assert "TTFT p95" in out and "stored" in out
    finally:
        web.stop()
        engine.stop()


def test_bench_refuses_clearly_without_a_ready_replica(make_model):
    make_model("cold", min_replicas=0, on_demand=True)
    code, out, err = llmgw("bench", "cold", "--slo-ttft-p95-ms", "500")
    assert code == 1 and "has no ready replica" in err
    assert not Benchmark.objects.exists()
