"""``/metrics`` worth alerting on (``fleet.ops.metrics`` and ``gateway.metrics``), each
series read back with prometheus-client's parser: replicas by their current state only,
outdated replicas, scaling steps, crash loops, every GPU's last reading, heartbeat ages,
tokens by model, team and key, requests held and queued — and a scrape whose queries do not
grow with the fleet."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from fleet.control.reconciler import reconcile
from fleet.control.specs import spec_hash
from fleet.models import Agent, ControlPlane, Gpu, ModelState, Replica, ScalingEvent
from fleet.ops.metrics import LIVE_STATES
from gateway import held, metrics, queueing
from gateway.metrics import TokenCounts
from gateway.models import ApiKey, Team
from gateway.usage import usage_records
from llmgw.metrics import render

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_control_planes(settings):
    """Silence counts from the agents' last message (no web-process rows from other tests)."""
    settings.LLMGW_AGENT_LOST_AFTER_S = 30.0
    ControlPlane.objects.all().delete()


def scrape(text: str | None = None) -> dict[tuple[str, tuple], float]:
    """``/metrics`` as (sample name, sorted labels) → value."""
    samples = {}
    for family in text_string_to_metric_families(text if text is not None else render().decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def named(samples: dict, name: str) -> dict[tuple, float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def agent(name: str, seen_s_ago: float | None = 0.0, connected: bool = True) -> Agent:
    seen = None if seen_s_ago is None else timezone.now() - timedelta(seconds=seen_s_ago)
    return Agent.objects.create(name=name, connected=connected, last_seen_at=seen, cpu_cores=16, memory_mib=65536,
                                address="127.0.0.1")


def replica(model, on: Agent, state: str, **kw) -> Replica:
    return Replica.objects.create(model=model, model_name=model.name, profile=model.profile, agent=on, state=state,
                                  cpu_cores=1, memory_mib=128, **kw)


# --- replicas -----------------------------------------------------------------------------------


def test_replicas_are_counted_by_current_state_and_ended_ones_make_no_series(make_model):
    a, gone = agent("a"), agent("gone", seen_s_ago=3600)
    chat, embed = make_model("chat"), make_model("embed")
    replica(chat, a, "ready")
    replica(chat, a, "starting")
    replica(embed, a, "ready")
    replica(embed, gone, "ready")  # its agent is lost: shown lost, as the next pass makes it
    for _ in range(5):
        replica(chat, a, "failed")
        replica(chat, a, "stopped")
    samples = scrape()
    assert named(samples, "llmgw_replicas") == {
        (("state", s.value),): {"ready": 2, "starting": 1, "lost": 1}.get(s.value, 0) for s in LIVE_STATES}
    assert named(samples, "llmgw_model_replicas") == {
        (("model", "chat"), ("state", "ready")): 1, (("model", "chat"), ("state", "starting")): 1,
        (("model", "embed"), ("state", "lost")): 1, (("model", "embed"), ("state", "ready")): 1}
    assert not any(dict(labels).get("state") in ("failed", "stopped")
                   for labels in [*named(samples, "llmgw_replicas"), *named(samples, "llmgw_model_replicas")])


def test_outdated_replicas_are_counted_per_model(make_model):
    a = agent("a")
    chat, embed = make_model("chat"), make_model("embed")
    current = spec_hash(chat, chat.profile)
    replica(chat, a, "ready", spec_hash=current)
    replica(chat, a, "ready", spec_hash="0" * 16)
    replica(chat, a, "draining", spec_hash="1" * 16)
    replica(chat, a, "failed", spec_hash="2" * 16)  # ended: not being replaced
    replica(embed, a, "ready", spec_hash="")  # no recorded hash: current
    assert named(scrape(), "llmgw_replicas_outdated") == {(("model", "chat"),): 2, (("model", "embed"),): 0}


def test_scaling_steps_of_the_last_hour_by_direction(make_model):
    chat = make_model("chat")
    make_model("embed")  # no steps: zeros
    now = timezone.now()
    for at, to in ((now, 2), (now - timedelta(minutes=10), 3), (now - timedelta(minutes=20), 2),
                   (now - timedelta(hours=2), 5)):
        ScalingEvent.objects.create(model=chat, at=at, from_replicas=2 if to == 3 else 1 if to == 2 else 4,
                                    to_replicas=to, reason="test")
    ScalingEvent.objects.create(model=chat, at=now, from_replicas=3, to_replicas=2, reason="quiet")
    assert named(scrape(), "llmgw_scaling_steps_last_hour") == {
        (("direction", "up"), ("model", "chat")): 3, (("direction", "down"), ("model", "chat")): 1,
        (("direction", "up"), ("model", "embed")): 0, (("direction", "down"), ("model", "embed")): 0}


def test_a_crash_loop_the_pass_found_is_one_and_its_failures_are_counted(make_model, settings):
    settings.LLMGW_BACKOFF_BASE_S = 600.0  # the next try is far off: the pass waits it out
    a = agent("a")
    broken = make_model("broken")
    make_model("fine", min_replicas=0, max_replicas=1)
    for _ in range(2):
        replica(broken, a, "failed", error="engine exited with code 1", spec_hash=spec_hash(broken, broken.profile))
    replica(broken, a, "failed", state_changed_at=timezone.now() - timedelta(hours=2))  # long ago: not counted
    reconcile()
    assert ModelState.objects.get(model=broken).reason.startswith("crash loop")
    samples = scrape()
    assert named(samples, "llmgw_model_crash_loop") == {(("model", "broken"),): 1, (("model", "fine"),): 0}
    assert named(samples, "llmgw_replica_failures_last_hour") == {(("model", "broken"),): 2, (("model", "fine"),): 0}


# --- agents and GPUs ---------------------------------------------------------------------------


def test_each_gpus_last_reading_by_agent_and_index_and_unknown_figures_are_absent(make_model):
    a, b, lost = agent("gpu-a"), agent("gpu-b", seen_s_ago=2), agent("gpu-lost", seen_s_ago=3600)
    Gpu.objects.create(agent=a, index=0, memory_total_mib=81559, memory_used_mib=40000, utilisation_pct=87.0,
                       temperature_c=64.0)
    Gpu.objects.create(agent=a, index=1, memory_total_mib=81559, memory_used_mib=0, utilisation_pct=None,
                       temperature_c=None)  # a simulated GPU, or a driver that refused
    Gpu.objects.create(agent=b, index=0, memory_total_mib=24576, memory_used_mib=1024, utilisation_pct=5.0,
                       temperature_c=40.0)
    Gpu.objects.create(agent=lost, index=0, memory_total_mib=24576, memory_used_mib=1, utilisation_pct=99.0,
                       temperature_c=90.0)
    samples = scrape()
    mib = 1024 * 1024
    assert named(samples, "llmgw_gpu_utilisation_ratio") == {(("agent", "gpu-a"), ("gpu", "0")): 0.87,
                                                             (("agent", "gpu-b"), ("gpu", "0")): 0.05}
    assert named(samples, "llmgw_gpu_temperature_celsius") == {(("agent", "gpu-a"), ("gpu", "0")): 64.0,
                                                               (("agent", "gpu-b"), ("gpu", "0")): 40.0}
    assert named(samples, "llmgw_gpu_memory_used_bytes") == {
        (("agent", "gpu-a"), ("gpu", "0")): 40000 * mib, (("agent", "gpu-a"), ("gpu", "1")): 0,
        (("agent", "gpu-b"), ("gpu", "0")): 1024 * mib}
    assert named(samples, "llmgw_gpu_memory_total_bytes")[(("agent", "gpu-b"), ("gpu", "0"))] == 24576 * mib
    # A lost agent's last reading is old news: no series (no alert on a figure nobody refreshes).
    assert not any(dict(labels).get("agent") == "gpu-lost"
                   for name in ("llmgw_gpu_utilisation_ratio", "llmgw_gpu_memory_used_bytes")
                   for labels in named(samples, name))


def test_every_agents_heartbeat_age_in_seconds(make_model):
    agent("fresh"), agent("quiet", seen_s_ago=45), agent("never", seen_s_ago=None)
    ages = named(scrape(), "llmgw_agent_heartbeat_age_seconds")
    assert set(ages) == {(("agent", "fresh"),), (("agent", "quiet"),)}  # never heard from: no age
    assert 0 <= ages[(("agent", "fresh"),)] < 10
    assert 45 <= ages[(("agent", "quiet"),)] < 60


def test_a_scrape_costs_the_same_queries_for_a_large_fleet_as_for_a_small_one(make_model):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            render()
        return len(captured.captured_queries)

    m = make_model("m")
    a = agent("a0")
    Gpu.objects.create(agent=a, index=0, memory_total_mib=1, utilisation_pct=1.0)
    replica(m, a, "ready")
    small = queries()
    for i in range(1, 12):
        more = agent(f"a{i}")
        for index in range(4):
            Gpu.objects.create(agent=more, index=index, memory_total_mib=1, utilisation_pct=1.0, temperature_c=30.0)
        replica(make_model(f"m{i}"), more, "ready", spec_hash="x" * 16)
        replica(m, more, "failed")
        ScalingEvent.objects.create(model=m, from_replicas=1, to_replicas=2, reason="busy")
    assert queries() == small <= 20, small


# --- gateway: tokens, held and queued ----------------------------------------------------------


def test_tokens_are_counted_by_model_team_and_key_name_labelled_at_scrape_time():
    team = Team.objects.create(name="research")
    in_team, _ = ApiKey.create_key("alice")
    ApiKey.objects.filter(pk=in_team.pk).update(team=team)
    alone, _ = ApiKey.create_key("bob")
    doomed, _ = ApiKey.create_key("carol")
    counts = TokenCounts()
    counts.add("chat", team.pk, in_team.pk, 10, 5)
    counts.add("chat", team.pk, in_team.pk, 2, 1)
    counts.add("chat", None, alone.pk, 7, None)  # completion unknown: nothing counted for it
    counts.add("embed", None, None, 3, 0)  # authentication off
    counts.add("chat", None, doomed.pk, 1, 1)
    counts.add("chat", None, alone.pk, None, None)  # a request that reached no engine: no series
    counts.add("chat", None, alone.pk, "abc", -1)  # not counts (a broken engine's usage): nothing, no error
    doomed.delete()
    families = {f.name: f for f in counts.collect()}
    tokens = {tuple(s.labels[k] for k in ("model", "team", "kind")): s.value for s in families["llmgw_tokens"].samples}
    assert tokens == {("chat", "research", "prompt"): 12, ("chat", "research", "completion"): 6,
                      ("chat", "none", "prompt"): 8, ("chat", "none", "completion"): 1,
                      ("embed", "none", "prompt"): 3, ("embed", "none", "completion"): 0}
    by_key = {(s.labels["key"], s.labels["kind"]): s.value for s in families["llmgw_key_tokens"].samples}
    assert by_key == {("alice", "prompt"): 12, ("alice", "completion"): 6, ("bob", "prompt"): 7,
                      ("bob", "completion"): 0, ("anonymous", "prompt"): 3, ("anonymous", "completion"): 0,
                      ("deleted", "prompt"): 1, ("deleted", "completion"): 1}
    assert all(s.name.endswith("_total") for f in families.values() for s in f.samples)
    prefixes = {s.labels["key"]: s.labels["key_prefix"] for s in families["llmgw_key_tokens"].samples}
    assert prefixes == {"alice": in_team.prefix, "bob": alone.prefix, "anonymous": "", "deleted": ""}


def test_a_keys_series_never_goes_down_when_a_key_of_the_same_name_is_renamed_or_deleted():
    """Keys may share a name; each keeps a series of its own (its prefix), so no series
    drops (Prometheus would read a counter reset), and ``sum by (key)`` still adds them up."""
    first, _ = ApiKey.create_key("ci")
    second, _ = ApiKey.create_key("ci")
    counts = TokenCounts()
    counts.add("chat", None, first.pk, 100, 0)
    counts.add("chat", None, second.pk, 50, 0)

    def series() -> dict[tuple[str, str], float]:
        family = {f.name: f for f in counts.collect()}["llmgw_key_tokens"]
        return {(s.labels["key"], s.labels["key_prefix"]): s.value for s in family.samples
                if s.labels["kind"] == "prompt"}

    assert series() == {("ci", first.prefix): 100, ("ci", second.prefix): 50}
    ApiKey.objects.filter(pk=second.pk).update(name="ci-old")
    assert series() == {("ci", first.prefix): 100, ("ci-old", second.prefix): 50}
    first.delete()
    assert series() == {("deleted", ""): 100, ("ci-old", second.prefix): 50}


def test_a_usage_record_counts_its_tokens_on_metrics(monkeypatch):
    monkeypatch.setattr(metrics, "TOKENS", TokenCounts())
    usage_records.add(at=timezone.now(), key_id=None, team_id=None, model_name="chat-x", replica_id=None,
                      path="/v1/chat/completions", status=200, upstream_status=200, stream=False, prompt_tokens=9,
                      completion_tokens=4, ttft_ms=1.0, total_ms=2.0, overhead_ms=0.1)
    usage_records.take()
    tokens = {(s.labels["model"], s.labels["kind"]): s.value
              for f in metrics.TOKENS.collect() if f.name == "llmgw_tokens" for s in f.samples}
    assert tokens == {("chat-x", "prompt"): 9, ("chat-x", "completion"): 4}


def test_a_hold_is_counted_while_it_lasts_and_its_time_observed():
    before = scrape()
    count_before = before.get(("llmgw_request_hold_seconds_count", (("model", "held-m"),)), 0)
    began = held.began_holding("held-m")
    during = scrape()
    assert during[("llmgw_requests_held", (("model", "held-m"),))] == 1
    assert during[("llmgw_requests_held_for_cold_start", ())] == before.get(
        ("llmgw_requests_held_for_cold_start", ()), 0) + 1
    held.ended_holding("held-m", began - 2.0)  # held two seconds
    after = scrape()
    assert after[("llmgw_requests_held", (("model", "held-m"),))] == 0
    assert after[("llmgw_request_hold_seconds_count", (("model", "held-m"),))] == count_before + 1
    assert after[("llmgw_request_hold_seconds_bucket", (("le", "1.0"), ("model", "held-m")))] == 0
    assert after[("llmgw_request_hold_seconds_bucket", (("le", "2.5"), ("model", "held-m")))] == count_before + 1


def test_the_admission_queue_depth_is_a_gauge_by_model_name(monkeypatch):
    told = []
    monkeypatch.setattr(queueing.live, "set_queued", lambda model_id, depth: told.append((model_id, depth)))
    monkeypatch.setitem(queueing._names, 4242, "queued-m")
    queueing._depth_changed(4242, 3)
    assert scrape()[("llmgw_requests_queued", (("model", "queued-m"),))] == 3
    queueing._depth_changed(4242, 0)
    assert scrape()[("llmgw_requests_queued", (("model", "queued-m"),))] == 0
    assert told == [(4242, 3), (4242, 0)]  # the scaler still hears of it
