"""``bench/prefix_routing.py`` (issue 17) in its fake mode, small, as real processes; and the
fake engine's prefill model it stands on (``tests/fake_engine.py``: what a prompt costs, what
the cache keeps). Counts of prompt tokens, never times: the machine may be busy."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from bench import prefix_routing
from tests import fake_engine
from tests.processes import PYTHON, ROOT


def engine(*argv: str) -> fake_engine.Engine:
    return fake_engine.Engine(fake_engine.parse_args(["--port", "1", *argv]))


def test_the_prefill_model_is_off_by_default():
    plain = engine()
    assert not plain.models_prefill
    assert "fake:prompt_tokens" not in engine("--metrics-kind", "vllm").metrics_text()


def test_a_prompt_evaluates_only_what_follows_its_longest_cached_prefix():
    e = engine("--prompt-cache-slots", "2")
    system = tuple(f"s{i}" for i in range(100))
    assert e.prefill_cost(system + ("a", "b")) == (102, 0)  # nothing cached yet
    assert e.prefill_cost(system + ("c",)) == (1, 100)  # the system prompt was cached
    assert e.prefill_cost(system + ("c",)) == (1, 100)  # the same prompt: its last token only
    assert len(e.prompt_cache) == 1  # a prompt sharing half of a cached one takes its slot


def test_the_prompt_cache_keeps_the_last_n_prompts():
    e = engine("--prompt-cache-slots", "2")
    tenants = [tuple(f"t{t}w{i}" for i in range(50)) for t in range(3)]
    for prompt in tenants:
        assert e.prefill_cost(prompt) == (50, 0)
    assert list(e.prompt_cache) == [tenants[1], tenants[2]]  # the least recently used dropped
    assert e.prefill_cost(tenants[0]) == (50, 0)
    assert e.prefill_cost(tenants[2] + ("more",)) == (1, 50)


def test_without_slots_every_prompt_is_evaluated_whole():
    e = engine("--prefill-ms-per-token", "0.1")
    prompt = tuple(str(i) for i in range(10))
    assert [e.prefill_cost(prompt) for _ in range(2)] == [(10, 0), (10, 0)]
    assert not e.prompt_cache


def test_the_counters_are_in_metrics_even_without_a_metrics_kind():
    e = engine("--prompt-cache-slots", "1", "--metrics-kind", "none")
    e.prompt_tokens_evaluated, e.prompt_tokens_cached = 7, 3
    values = dict(line.split() for line in e.metrics_text().splitlines() if not line.startswith("#"))
    assert values["fake:prompt_tokens_evaluated_total"] == "7" and values["fake:prompt_tokens_cached_total"] == "3"


def test_tenants_prompts_differ_from_their_first_bytes_and_the_order_is_fixed():
    prompts = [prefix_routing.system_prompt(t, 1000) for t in range(6)]
    assert len({p[:64] for p in prompts}) == 6
    assert all(len(p.split()) == 1000 for p in prompts)
    assert prefix_routing.request_order(6, 50, 17) == prefix_routing.request_order(6, 50, 17)
    assert set(prefix_routing.request_order(6, 50, 17)) == set(range(6))


def test_the_cache_must_hold_the_tenants_on_two_replicas_but_not_on_one():
    assert prefix_routing.parse_args(["--fake", "--tenants", "6"]).cache_slots == 3
    for slots in ("2", "6"):
        with pytest.raises(SystemExit):
            prefix_routing.parse_args(["--fake", "--tenants", "6", "--cache-slots", slots])


@pytest.mark.timeout(300)
def test_prefix_affinity_evaluates_far_fewer_prompt_tokens_and_loses_nothing(tmp_path):
    """Two clients: the load bound cannot bind, so every affinity request goes where its
    tenant's prefix is, and the tenants' split (printed) fits one replica's slots."""
    env = {k: v for k, v in os.environ.items() if k not in ("LLMGW_DATABASE_URL", "LLMGW_REDIS_URL")}
    bench = subprocess.Popen([PYTHON, "bench/prefix_routing.py", "--fake", "--json", "--requests", "40",
                              "--concurrency", "2", "--port-base", "24400"], cwd=ROOT,
                             env={**env, "TMPDIR": str(tmp_path)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        out, err = bench.communicate(timeout=270)
    except subprocess.TimeoutExpired:
        bench.terminate()  # SIGTERM: the bench stops its web process, worker, agent and engines
        out, err = bench.communicate(timeout=60)
        pytest.fail(f"the bench did not finish in 270 s:\n{err[-5000:]}")
    assert bench.returncode == 0, err[-5000:]
    result = json.loads(out)
    slots = result["args"]["cache_slots"]
    assert max(len(tenants) for tenants in result["split"].values()) <= slots, result["split"]
    least, affinity = result["phases"]["least-loaded"], result["phases"]["prefix-affinity"]
    for phase in (least, affinity):
        assert phase["answered"] == phase["requests"] == 40 and not phase["failures"]
        assert phase["starts_above_bound"] == 0
        assert sum(phase["requests_by_replica"].values()) == 40 and len(phase["requests_by_replica"]) == 2
    assert least["outcomes"] == {"least-loaded": 40}
    assert affinity["outcomes"] == {"hit": 40}
    # least-loaded spreads every tenant over both replicas: whole system prompts evaluated again
    assert least["prompt_tokens_evaluated"] >= 3 * 1000
    assert affinity["prompt_tokens_evaluated"] * 4 <= least["prompt_tokens_evaluated"]
    assert affinity["prompt_tokens_cached"] > least["prompt_tokens_cached"]
    assert result["goals"]["nothing_lost"]["pass"] and result["goals"]["within_bound"]["pass"]
    assert list(tmp_path.glob("llmgw-bench-prefix-*")) == []  # a run that passed leaves no temp dir
