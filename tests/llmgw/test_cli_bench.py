"""``llmgw bench`` without a gateway: ``--dry-run`` (what it would send; nothing sent or
stored), bad usage, and the warnings on a result capped by ``--max-concurrency`` or read
from too few requests (the ramp itself is replaced by a canned result; test_bench.py runs
it against a real gateway)."""

from __future__ import annotations

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from catalog.models import Benchmark
from gateway import loadtest
from gateway.loadtest import MIN_REQUESTS_FOR_P95, RampResult, StepResult
from gateway.models import ApiKey
from llmgw.cli import gateway_url
from tests.cli import llmgw
from tests.processes import free_port
from tests.replicas import serve

pytestmark = pytest.mark.django_db


def _step(concurrency: int, requests: int, ttft_ms: float, errors: int = 0) -> StepResult:
    return StepResult(concurrency, requests=requests, errors=errors, duration_s=1.0,
                      ttft_ms=[ttft_ms] * requests, tpot_ms=[10.0] * requests)


#: The real reachability check, before ``canned`` replaces it.
REAL_NOTHING_ANSWERS = gateway_url.nothing_answers


@pytest.fixture(autouse=True)
def no_recorded_gateway(settings, tmp_path, monkeypatch):
    """A data directory of the test's own (no ``web_url`` from a cluster running here) and
    no LLMGW_GATEWAY_URL from the caller's shell."""
    settings.DATA_DIR = tmp_path
    monkeypatch.delenv("LLMGW_GATEWAY_URL", raising=False)


@pytest.fixture
def canned(monkeypatch):
    """Replace the ramp with ``canned.result``; ``canned.calls`` counts the runs. Something
    answers at every URL (a test of an unreachable gateway puts the real check back)."""
    class Canned:
        result: RampResult | None = None
        calls = 0

    async def fake_ramp(*args, **kwargs):
        Canned.calls += 1
        return Canned.result

    monkeypatch.setattr("llmgw.cli.bench.ramp", fake_ramp)
    monkeypatch.setattr(gateway_url, "nothing_answers", lambda url, timeout_s=3.0: None)
    return Canned


@pytest.fixture
def listening():
    """A base URL where an HTTP server answers 200 to everything."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_dry_run_says_what_it_would_send_and_sends_nothing(make_model, canned):
    serve(make_model("chat"), 9)
    code, out, err = llmgw("bench", "chat", "--slo-ttft-p95-ms", "500", "--slo-tpot-p95-ms", "40",
                           "--max-concurrency", "10", "--url", "http://gw.example:8000/", "--dry-run")
    assert code == 0 and err == ""
    assert "would measure chat on profile fake-cpu through http://gw.example:8000/v1/chat/completions" in out
    assert "(1 ready replica(s) now)" in out
    assert "TTFT p95 ≤ 500 ms and TPOT p95 ≤ 40 ms" in out
    assert "concurrency 1, 2, 4, 8, 10; stops at the first step that misses the SLO" in out
    assert "20, 20, 20, 24, 30 per step" in out and "at most 114 in all" in out
    assert "nothing sent, nothing stored (--dry-run)" in out
    assert canned.calls == 0 and not Benchmark.objects.exists() and not ApiKey.objects.exists()
    plan = json.loads(llmgw("bench", "chat", "--slo-ttft-p95-ms", "500", "--dry-run", "--json")[1])
    assert plan["concurrency_steps"] == [1, 2, 4, 8, 16, 32, 64] and plan["requests_per_step"][-1] == 192
    assert plan["would_refuse"] is None and plan["dry_run"] is True


def test_dry_run_without_a_ready_replica_still_plans_and_warns_that_a_run_would_be_refused(make_model, canned):
    make_model("cold", min_replicas=0, on_demand=True)
    code, out, err = llmgw("bench", "cold", "--slo-ttft-p95-ms", "500", "--dry-run")
    assert code == 0 and "would measure cold" in out and "(0 ready replica(s) now)" in out
    assert "warning: a run now would be refused: cold has no ready replica" in err
    assert canned.calls == 0


@pytest.mark.parametrize(("args", "message"), [
    (("--slo-ttft-p95-ms", "0"), "--slo-ttft-p95-ms takes milliseconds > 0"),
    (("--slo-ttft-p95-ms", "nan"), "--slo-ttft-p95-ms takes milliseconds > 0"),
    (("--slo-ttft-p95-ms", "500", "--slo-tpot-p95-ms", "-1"), "--slo-tpot-p95-ms takes milliseconds > 0"),
    (("--slo-ttft-p95-ms", "500", "--max-concurrency", "0"), "--max-concurrency must be at least 1"),
    (("--slo-ttft-p95-ms", "500", "--max-tokens", "0"), "--max-tokens must be at least 1"),
    (("--slo-ttft-p95-ms", "500", "--max-concurrency", "16", "--requests-per-step", "8"),
     "--requests-per-step (8) must be at least --max-concurrency (16)"),
    (("--slo-ttft-p95-ms", "500", "--url", "gw.example:8000"), "--url takes the gateway's base URL"),
])
def test_bad_numbers_and_urls_are_bad_usage(make_model, canned, args, message):
    serve(make_model("chat"), 9)
    code, _, err = llmgw("bench", "chat", *args)
    assert code == 2 and message in err, err
    assert canned.calls == 0 and not Benchmark.objects.exists()


def test_a_result_capped_by_max_concurrency_is_stored_as_a_lower_bound_with_a_warning(make_model, canned):
    serve(make_model("chat"), 9)
    canned.result = RampResult([_step(c, 30, 100.0) for c in (1, 2, 4, 8, 10)], 10, 10)
    code, out, err = llmgw("bench", "chat", "--slo-ttft-p95-ms", "500", "--max-concurrency", "10")
    assert code == 0 and canned.calls == 1
    assert ("warning: every step met the SLO up to concurrency 10, the cap (--max-concurrency 10): "
            "the SLO was never crossed") in err
    assert "raise --max-concurrency" in err and "too few" not in err
    assert "holds at least 10 concurrent request(s) per replica" in out
    benchmark = Benchmark.objects.get()
    assert benchmark.max_concurrency == 10 and "a lower bound" in benchmark.method


def test_steps_with_too_few_requests_are_named_with_the_minimum(make_model, canned):
    serve(make_model("chat"), 9)
    canned.result = RampResult([_step(1, 8, 100.0), _step(2, 8, 100.0), _step(4, 24, 900.0)], 2, 64)
    code, out, _ = llmgw("bench", "chat", "--slo-ttft-p95-ms", "500", "--requests-per-step", "8",
                           "--max-concurrency", "4", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["capped"] is False and len(data["warnings"]) == 1
    warning = data["warnings"][0]
    assert warning == (f"TTFT p95 measured from too few requests at concurrency 1 (8 requests), 2 (8 requests): "
                       f"a p95 needs at least {MIN_REQUESTS_FOR_P95} (raise --requests-per-step)")
    assert "capped" not in Benchmark.objects.get().method


def test_a_result_measured_well_has_no_warning(make_model, canned):
    serve(make_model("chat"), 9)
    canned.result = RampResult([_step(1, 20, 100.0), _step(2, 20, 100.0), _step(4, 20, 900.0)], 2, 64)
    code, out, err = llmgw("bench", "chat", "--slo-ttft-p95-ms", "500")
    assert code == 0 and "warning" not in err and "holds 2 concurrent" in out


def test_the_ramp_sends_at_least_the_minimum_per_step_by_default():
    assert [loadtest.requests_for_step(c) for c in loadtest.concurrency_steps(16)] == [20, 20, 20, 24, 48]
    assert loadtest.requests_for_step(4, 5) == 5
    assert loadtest.concurrency_steps(1) == [1] and loadtest.concurrency_steps(0) == []


def test_the_ramp_ends_on_the_cap_itself_so_the_cap_is_measured():
    assert loadtest.concurrency_steps(6) == [1, 2, 4, 6]
    assert loadtest.concurrency_steps(8) == [1, 2, 4, 8] and loadtest.concurrency_steps(2) == [1, 2]
    assert loadtest.concurrency_steps(3) == [1, 2, 3]


def test_the_runs_temporary_key_is_deleted_afterwards_so_key_lists_stay_clean(make_model, canned):
    serve(make_model("chat"), 9)
    canned.result = RampResult([_step(1, 20, 100.0), _step(2, 20, 900.0)], 1, 64)
    ApiKey.create_key("alice")
    code, _, _ = llmgw("bench", "chat", "--slo-ttft-p95-ms", "500")
    assert code == 0 and canned.calls == 1
    assert list(ApiKey.objects.values_list("name", flat=True)) == ["alice"]
    assert "bench" not in llmgw("keys", "list")[1]


def test_a_result_under_one_request_per_replica_is_said_so_and_not_stored(make_model, canned):
    model = make_model("chat", min_replicas=2, max_replicas=2)
    serve(model, 9)
    serve(model, 10)
    canned.result = RampResult([_step(1, 20, 100.0), _step(2, 20, 900.0)], 1, 64)
    code, _, err = llmgw("bench", "chat", "--slo-ttft-p95-ms", "500")
    assert code == 1 and "concurrency 1 met TTFT p95 ≤ 500 ms across 2 ready replicas" in err
    assert "no concurrency met" not in err and not Benchmark.objects.exists()


def test_without_url_it_measures_the_web_process_llmgw_up_recorded_on_its_port(make_model, canned):
    serve(make_model("chat"), 9)
    gateway_url.record("http://127.0.0.1:8731")  # as `llmgw up --port 8731` does
    code, out, err = llmgw("bench", "chat", "--slo-ttft-p95-ms", "500", "--dry-run")
    assert code == 0 and err == ""
    assert "through http://127.0.0.1:8731/v1/chat/completions" in out
    gateway_url.forget("http://127.0.0.1:8731")
    assert gateway_url.recorded() is None and gateway_url.default_url()[0] == "http://127.0.0.1:8000"


def test_url_and_the_environment_still_override_the_recorded_web_process(make_model, canned, monkeypatch):
    serve(make_model("chat"), 9)
    gateway_url.record("http://127.0.0.1:8731")
    out = llmgw("bench", "chat", "--slo-ttft-p95-ms", "500", "--dry-run", "--url", "http://gw.example:9000")[1]
    assert "through http://gw.example:9000/v1/chat/completions" in out
    monkeypatch.setenv("LLMGW_GATEWAY_URL", "http://gw.example:9001")
    out = llmgw("bench", "chat", "--slo-ttft-p95-ms", "500", "--dry-run")[1]
    assert "through http://gw.example:9001/v1/chat/completions" in out


def test_nothing_answering_at_the_url_is_said_in_one_line_before_measuring(make_model, canned, monkeypatch):
    monkeypatch.setattr(gateway_url, "nothing_answers", REAL_NOTHING_ANSWERS)
    serve(make_model("chat"), 9)
    closed = f"http://127.0.0.1:{free_port()}"
    gateway_url.record(closed)  # a cluster that stopped without forgetting it
    code, out, err = llmgw("bench", "chat", "--slo-ttft-p95-ms", "500")
    assert code == 1 and out == "" and canned.calls == 0
    assert err.startswith(f"nothing answers at {closed} (recorded by `llmgw up` or `llmgw web` in ")
    assert err.count("\n") == 1 and "is the cluster up?" in err
    assert not ApiKey.objects.exists() and not Benchmark.objects.exists()
    code, out, err = llmgw("bench", "chat", "--slo-ttft-p95-ms", "500", "--dry-run")
    assert code == 0 and "would measure chat" in out and err.startswith(f"warning: nothing answers at {closed}")


def test_a_gateway_that_answers_is_measured(make_model, canned, monkeypatch, listening):
    monkeypatch.setattr(gateway_url, "nothing_answers", REAL_NOTHING_ANSWERS)
    serve(make_model("chat"), 9)
    canned.result = RampResult([_step(1, 20, 100.0), _step(2, 20, 900.0)], 1, 64)
    code, _, err = llmgw("bench", "chat", "--slo-ttft-p95-ms", "500", "--url", listening)
    assert code == 0 and canned.calls == 1 and "nothing answers" not in err


def test_llmgw_web_records_its_address_for_bench(monkeypatch):
    from llmgw.cli import web
    execs = []
    # Both exec calls replaced: one left real would turn this test process into uvicorn.
    monkeypatch.setattr("os.execv", lambda *args: execs.append(args))
    monkeypatch.setattr("os.execve", lambda *args: execs.append(args))
    port = free_port()
    assert web.run({"host": "127.0.0.1", "port": port, "workers": "1"}, io.StringIO(), io.StringIO()) == 1
    assert len(execs) == 1 and gateway_url.recorded() == f"http://127.0.0.1:{port}"
