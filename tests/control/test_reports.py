"""Agent reports against replica states (``fleet.control.reports``, on the database, no
processes): stop reports lost, placings never acknowledged, garbage in reports and
inventories; a lost replica's engine reported again, duplicates stopped, and an agent back
without an engine it was stopping."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.control import reconciler, reports
from fleet.control.reconciler import reconcile
from fleet.models import Agent, Replica
from tests import rows

pytestmark = pytest.mark.django_db


def agent(name="cpu-1"):
    return Agent.objects.create(name=name, connected=True, last_seen_at=timezone.now(), cpu_cores=4,
                                memory_mib=8192, address="127.0.0.1")


def hello(replicas=()):
    return {"type": "hello", "v": 1, "name": "cpu-1", "version": "x", "address": "127.0.0.1",
            "inventory": {"gpus": [], "cpu_cores": 4, "memory_mib": 8192}, "replicas": list(replicas)}


def test_a_stopping_replica_whose_stop_report_was_lost_is_released_when_the_agent_says_hello(make_model):
    """The agent stopped the engine, but the websocket dropped before the one-shot
    'stopped' report went out (EngineManager.finished is cleared after a send). On
    reconnect its hello does not list the replica. forget_unreported only handles
    downloading/starting/ready/draining/lost, so the row stays 'stopping' forever and its
    cores stay held by the planner (HOLDS_RESOURCES)."""
    a = agent()
    m = make_model("m", min_replicas=0, max_replicas=1)
    r = Replica.objects.create(model=m, profile=m.profile, agent=a, state="stopping", cpu_cores=1, memory_mib=128)
    reports.record_hello(a.pk, hello([]))
    assert Replica.objects.get(pk=r.pk).state == "stopped"


def test_a_placing_replica_the_agent_never_acknowledges_does_not_block_the_model_forever(make_model):
    """An agent that is connected and heart-beating but never acts on an assignment (it
    crashed inside apply, or an old agent that ignores the message) leaves the replica in
    'placing' for ever: nothing in the planner ages it, and it counts towards desired, so
    no other agent is tried and nothing is reported."""
    from datetime import timedelta
    a = agent()
    m = make_model("m", min_replicas=1, max_replicas=1)
    reconciler.reconcile()
    r = Replica.objects.get(model=m)
    assert r.state == "placing"
    Replica.objects.filter(pk=r.pk).update(state_changed_at=timezone.now() - timedelta(hours=2))
    Agent.objects.filter(pk=a.pk).update(last_seen_at=timezone.now())
    reconciler.reconcile()
    r.refresh_from_db()
    # Failed with its reason (so the planner replaces it, with backoff), not left placing.
    assert r.state == "failed", "a replica unacknowledged for 2 hours is still 'placing' with no reason given"
    assert r.reason.startswith("agent cpu-1 did not take it up within "), r.reason


@pytest.mark.parametrize("bad", [
    {"replica_id": "X", "state": "ready"},
    {"replica_id": None, "state": "ready", "pid": "abc"},
])
def test_garbage_replica_ids_are_ignored(make_model, bad):
    a = agent()
    m = make_model("m", min_replicas=0, max_replicas=1)
    r = Replica.objects.create(model=m, profile=m.profile, agent=a, state="starting", cpu_cores=1, memory_mib=128)
    before = list(Replica.objects.values())
    reports.record_status(a.pk, {"type": "status", "v": 1, "replicas": [bad]})
    assert list(Replica.objects.values()) == before and Replica.objects.get(pk=r.pk).state == "starting"


def test_a_non_numeric_pid_from_an_agent_does_not_break_the_report(make_model):
    a = agent()
    m = make_model("m", min_replicas=0, max_replicas=1)
    r = Replica.objects.create(model=m, profile=m.profile, agent=a, state="starting", cpu_cores=1, memory_mib=128)
    # A buggy/hostile agent: pid not a number. Expected: the field is ignored (or the
    # message refused with an 'error'), the rest of the report still applies.
    reports.record_status(a.pk, {"type": "status", "v": 1,
                                 "replicas": [{"replica_id": r.pk, "state": "ready", "pid": "abc", "port": 20001}]})
    r.refresh_from_db()
    assert (r.state, r.pid, r.port) == ("ready", None, 20001)  # the pid skipped, the rest applied


def test_a_negative_port_from_an_agent_does_not_break_the_report(make_model):
    a = agent()
    m = make_model("m", min_replicas=0, max_replicas=1)
    r = Replica.objects.create(model=m, profile=m.profile, agent=a, state="starting", cpu_cores=1, memory_mib=128)
    reports.record_status(a.pk, {"type": "status", "v": 1,
                                 "replicas": [{"replica_id": r.pk, "state": "ready", "pid": 5, "port": -1}]})
    r.refresh_from_db()
    assert (r.state, r.pid, r.port) == ("ready", 5, None)  # the port skipped, the rest applied


def test_a_report_of_a_list_instead_of_a_dict_does_not_crash(make_model):
    a = agent()
    m = make_model("m", min_replicas=0, max_replicas=1)
    r = Replica.objects.create(model=m, profile=m.profile, agent=a, state="starting", cpu_cores=1, memory_mib=128)
    before = list(Replica.objects.values())
    reports.record_status(a.pk, {"type": "status", "v": 1, "replicas": [[r.pk, 2]]})
    reports.record_status(a.pk, {"type": "status", "v": 1, "replicas": "ready"})
    assert list(Replica.objects.values()) == before  # nothing read from either
    # The next well-formed report still applies.
    reports.record_status(a.pk, {"type": "status", "v": 1, "replicas": [{"replica_id": r.pk, "state": "ready"}]})
    assert Replica.objects.get(pk=r.pk).state == "ready"


def test_an_inventory_with_garbage_gpu_does_not_crash(make_model):
    """Malformed entries are skipped: a GPU without an index is no GPU, a count that is not
    a non-negative number is none (0), so nothing is placed on what cannot be read."""
    a = agent()
    reports.record_status(a.pk, {"type": "status", "v": 1, "replicas": [],
                                 "inventory": {"gpus": [{"index": "zero"}, {"index": 1, "memory_total_mib": "lots",
                                                                            "name": "H100"}],
                                               "cpu_cores": "many", "memory_mib": -5}})
    a.refresh_from_db()
    assert (a.cpu_cores, a.memory_mib) == (0, 0)
    assert list(a.gpus.values_list("index", "name", "memory_total_mib")) == [(1, "H100", 0)]


# --- an agent comes back ---------------------------------------------------------------------

def test_a_lost_replica_reported_ready_stays_lost_for_the_planner_to_decide(make_model):
    a = rows.agent("a")
    m = make_model("m", min_replicas=1)
    r = rows.replica(m, a, state="lost", ready_at=timezone.now() - timedelta(minutes=5))
    assert reports.record_replicas(a.pk, [{"replica_id": r.pk, "state": "ready", "pid": 7, "port": 20001}])
    r.refresh_from_db()
    assert r.state == "lost" and r.ready_at > r.state_changed_at
    # Still in the agent's desired set: the engine is not stopped before the planner decides.
    assert [x["replica_id"] for x in reports.desired_set(a.pk)["replicas"]] == [r.pk]


def test_a_returning_duplicate_is_stopped_and_the_successor_kept(make_model):
    a, b = rows.agent("a"), rows.agent("b")
    m = make_model("m", min_replicas=1)
    lost = rows.replica(m, a, state="lost", reason="agent a silent for 30 s")
    successor = rows.replica(m, b, state="ready")
    reports.record_replicas(a.pk, [{"replica_id": lost.pk, "state": "ready", "pid": 7, "port": 20001}])
    generation = Agent.objects.get(pk=a.pk).generation
    reconcile()
    lost.refresh_from_db()
    assert lost.state == "stopping" and "duplicate: agent a came back, 1 ready elsewhere" in lost.reason
    assert Replica.objects.get(pk=successor.pk).state == "ready"
    assert Agent.objects.get(pk=a.pk).generation > generation  # told to stop it
    assert reports.desired_set(a.pk)["replicas"] == []


def test_a_returning_replica_is_taken_back_while_its_successor_is_still_starting(make_model):
    a, b = rows.agent("a"), rows.agent("b")
    m = make_model("m", min_replicas=1)
    lost = rows.replica(m, a, state="lost")
    successor = rows.replica(m, b, state="starting")
    reports.record_replicas(a.pk, [{"replica_id": lost.pk, "state": "ready", "pid": 7, "port": 20001}])
    reconcile()
    assert Replica.objects.get(pk=lost.pk).state == "ready"
    assert Replica.objects.get(pk=successor.pk).state == "stopping"


def test_an_agent_back_without_an_engine_it_was_stopping_has_it_stopped(make_model):
    a = rows.agent("a")
    m = make_model("m", min_replicas=0)
    rows.replica(m, a, state="stopping")
    rows.replica(m, a, state="lost")
    assert reports.forget_unreported(a.pk, []) == 2  # its report of the stop went missing
    assert {r.state for r in Replica.objects.all()} == {"stopped"}


# -- issue 14: load is known when it is steady -------------------------------------------------

def _defaults():
    """The defaults as shipped (not the test settings): cluster scaling, the stale period,
    the agent's heartbeat and metrics cadence, the reconcile interval."""
    import llmgw.settings as project
    from catalog.models import ClusterSettings
    from fleet.agent.client import ClientOptions
    from fleet.agent.engines import AgentConfig

    field = ClusterSettings._meta.get_field
    return {
        "scale_up_after_s": field("scale_up_after_s").default,
        "scale_down_after_s": field("scale_down_after_s").default,
        "load_stale_s": project.LLMGW_LOAD_STALE_S,
        "heartbeat_s": ClientOptions.__dataclass_fields__["heartbeat_s"].default,
        "load_poll_s": AgentConfig.__dataclass_fields__["load_poll_s"].default,
        "reconcile_s": project.LLMGW_RECONCILE_INTERVAL_S,
    }


def _run(agent_row, replicas, load_of, seconds, settings):
    """Drive ``seconds`` of simulated time in steps of 1 s from now: the agent heartbeats
    every default heartbeat interval with ``load_of(t)`` for each replica ({} = none) through
    a web process's ``HeartbeatStamps`` (flushed at once), and a real reconcile pass runs
    every default reconcile interval with that clock. Returns the scale events as
    ``(t, from, to)``."""
    from fleet.live.watch import HeartbeatStamps
    from fleet.models import ScalingEvent

    d = _defaults()
    assert settings.LLMGW_LOAD_STALE_S == d["load_stale_s"]  # the test settings do not shrink it
    stamps = HeartbeatStamps()
    start = timezone.now()
    for t in range(int(seconds) + 1):
        now = start + timedelta(seconds=t)
        if t % d["heartbeat_s"] == 0:
            load = load_of(t)
            stamps.stamp(agent_row.pk, {r.pk: load for r in replicas} if load else {}, now=now)
            stamps.flush()
        if t % d["reconcile_s"] == 0:
            reconciler.run_pass(now)
    return [(round((e.at - start).total_seconds()), e.from_replicas, e.to_replicas)
            for e in ScalingEvent.objects.order_by("at")]


def _metered_model(make_model, **kw):
    m = make_model("m", **kw)
    m.profile.metric_running, m.profile.metric_waiting = "vllm:num_requests_running", "vllm:num_requests_waiting"
    m.profile.save()
    return m


def test_with_the_default_settings_a_steady_queue_scales_up_after_scale_up_after_s(make_model, settings):
    """Load on every heartbeat: a queue that never changes stays known, so the busy timer
    runs out (docs/architecture.md, R7). With a load sent once (the old agents: only on a
    change) it went stale after LLMGW_LOAD_STALE and the model never scaled."""
    d = _defaults()
    assert d["heartbeat_s"] + d["load_stale_s"] / 3 < d["load_stale_s"]  # a steady load never goes stale
    a = agent()
    m = _metered_model(make_model, min_replicas=1, max_replicas=2)
    r = Replica.objects.create(model=m, profile=m.profile, agent=a, state="ready", port=1, cpu_cores=1)
    steps = _run(a, [r], lambda t: (2, 3), d["scale_up_after_s"] + 4 * d["reconcile_s"], settings)
    assert len(steps) == 1 and steps[0][1:] == (1, 2)
    assert d["scale_up_after_s"] <= steps[0][0] <= d["scale_up_after_s"] + 2 * d["reconcile_s"]
    assert Replica.objects.filter(model=m).count() == 2


def test_a_load_sent_only_once_goes_stale_and_never_scales_up(make_model, settings):
    d = _defaults()
    a = agent()
    m = _metered_model(make_model, min_replicas=1, max_replicas=2)
    r = Replica.objects.create(model=m, profile=m.profile, agent=a, state="ready", port=1, cpu_cores=1)
    steps = _run(a, [r], lambda t: (2, 3) if t == 0 else None, d["scale_up_after_s"] + 4 * d["reconcile_s"],
                 settings)
    assert steps == [] and Replica.objects.filter(model=m).count() == 1
    assert Replica.objects.get(pk=r.pk).load_reported_at is not None  # it was known, once


@pytest.mark.parametrize("metrics", ["steady", "unknown"])
def test_with_the_default_settings_a_quiet_model_scales_down_after_scale_down_after_s(make_model, settings,
                                                                                     metrics):
    """Nothing waiting, reported on every heartbeat: one step down once quiet for
    ``scale_down_after_s``. An engine whose metrics cannot be read (its heartbeats carry no
    load for it) stays unknown: never scaled down."""
    from fleet.models import ModelState

    d = _defaults()
    a = agent()
    m = _metered_model(make_model, min_replicas=1, max_replicas=2)
    rs = [Replica.objects.create(model=m, profile=m.profile, agent=a, state="ready", port=p, cpu_cores=1)
          for p in (1, 2)]
    ModelState.objects.create(model=m, extra_replicas=1)
    steps = _run(a, rs, lambda t: (0, 0) if metrics == "steady" else None,
                 d["scale_down_after_s"] + 4 * d["reconcile_s"], settings)
    if metrics == "unknown":
        assert steps == [] and Replica.objects.filter(model=m, state="ready").count() == 2
        return
    assert len(steps) == 1 and steps[0][1:] == (2, 1)
    assert d["scale_down_after_s"] <= steps[0][0] <= d["scale_down_after_s"] + 2 * d["reconcile_s"]
    assert Replica.objects.filter(model=m, state="ready").count() == 1


def test_heartbeat_loads_are_read_leniently_and_a_bare_heartbeat_has_none():
    assert reports.heartbeat_loads({"type": "heartbeat", "v": 1}) == {}
    loads = [[7, 2, 3], [8, None, 1.0], [9, -1, "x"], ["x", 1, 1], [True, 1, 1], [10, 1]]
    assert reports.heartbeat_loads({"type": "heartbeat", "v": 1, "loads": loads}) == {
        7: (2, 3), 8: (None, 1), 9: (None, None)}


@pytest.mark.django_db
def test_an_engine_the_agent_stopped_after_its_restart_says_so_in_explain(make_model):
    """An agent killed while it stopped an engine finishes that stop when it comes back
    (fleet/agent/engines.py, adopt) and says why; the row keeps the planner's reason and the
    agent's words, and explain lists it among the recently stopped (issue 14: orphan-stopped
    replicas in words)."""
    from fleet.ops.explain import explain_model
    from tests.cli import llmgw

    m = make_model("chat")
    a = agent()
    r = rows.replica(m, a, state="stopping", reason="surplus: 2 running, 1 wanted")
    why = "stopped after the agent's restart: not assigned"
    reports.record_replicas(a.pk, [{"replica_id": r.pk, "state": "stopped", "error": why}])
    r.refresh_from_db()
    assert r.state == "stopped" and r.reason == f"surplus: 2 running, 1 wanted; {why}"
    info = explain_model(m)
    assert [s["id"] for s in info["recently_stopped"]] == [r.pk] and why in info["recently_stopped"][0]["reason"]
    assert all(x["id"] != r.pk for x in info["replicas"])
    code, out, _ = llmgw("explain", "chat")
    assert code == 0 and f"stopped {r.pk:>5} on cpu-1" in out and why in out


@pytest.mark.django_db
def test_the_context_length_an_agent_read_from_the_weights_is_stored_on_the_model_once(make_model):
    """A replica's report may carry ``weights_context_length`` (the GGUF header's). It is
    stored on the model by a conditional update: only when it changes, without touching
    ``updated_at`` and without outdating the replica (not part of the spec hash); a report
    without it, or with garbage, leaves the stored value alone."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from catalog.models import Model
    from fleet.control.specs import spec_hash
    from fleet.protocol import check_fields

    m = make_model("chat")
    a = agent()
    r = rows.replica(m, a, state="starting")
    updated_at, hash_before = m.updated_at, spec_hash(m, m.profile)
    report = {"replica_id": r.pk, "state": "starting", "weights_context_length": 32768}
    check_fields({"type": "status", "v": 1, "replicas": [report]})  # a valid report on the wire
    reports.record_replicas(a.pk, [report])
    m.refresh_from_db()
    assert m.weights_context_length == 32768 and m.updated_at == updated_at
    assert spec_hash(m, m.profile) == hash_before
    assert reports.store_weights_context_length(m.pk, 32768) is False  # the same value: nothing written
    with CaptureQueriesContext(connection) as queries:
        reports.record_replicas(a.pk, [report])
    assert not [q for q in queries if q["sql"].startswith("UPDATE") and "catalog_model" in q["sql"]]
    for garbage in (None, -1, "4096", 0, 10**12):
        reports.record_replicas(a.pk, [{"replica_id": r.pk, "state": "starting", "weights_context_length": garbage}])
    reports.record_replicas(a.pk, [{"replica_id": r.pk, "state": "ready"}])
    assert Model.objects.get(pk=m.pk).weights_context_length == 32768
    reports.record_replicas(a.pk, [{"replica_id": r.pk, "state": "ready", "weights_context_length": 8192}])
    assert Model.objects.get(pk=m.pk).weights_context_length == 8192


def test_a_report_with_a_non_integer_weights_context_length_is_refused_on_the_wire():
    from fleet.protocol import ProtocolError, check_fields

    with pytest.raises(ProtocolError, match="weights_context_length"):
        check_fields({"type": "status", "v": 1, "replicas": [{"replica_id": 1, "weights_context_length": "x"}]})
    check_fields({"type": "status", "v": 1, "replicas": [{"replica_id": 1, "weights_context_length": None}]})
