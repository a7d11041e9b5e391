"""Breaker: agent reports vs replica states (database, no processes)."""
from __future__ import annotations

import pytest
from django.utils import timezone

from fleet.control import reconciler, reports
from fleet.models import Agent, Replica

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
    assert r.state != "placing", "a replica unacknowledged for 2 hours is still 'placing' with no reason given"


@pytest.mark.parametrize("bad", [
    {"replica_id": "X", "state": "ready"},
    {"replica_id": None, "state": "ready", "pid": "abc"},
])
def test_garbage_replica_ids_are_ignored(make_model, bad):
    a = agent()
    reports.record_status(a.pk, {"type": "status", "v": 1, "replicas": [bad]})


def test_a_non_numeric_pid_from_an_agent_does_not_break_the_report(make_model):
    a = agent()
    m = make_model("m", min_replicas=0, max_replicas=1)
    r = Replica.objects.create(model=m, profile=m.profile, agent=a, state="starting", cpu_cores=1, memory_mib=128)
    # A buggy/hostile agent: pid not a number. Expected: the field is ignored (or the
    # message refused with an 'error'), the rest of the report still applies.
    reports.record_status(a.pk, {"type": "status", "v": 1,
                                 "replicas": [{"replica_id": r.pk, "state": "ready", "pid": "abc", "port": 20001}]})
    assert Replica.objects.get(pk=r.pk).state == "ready"


def test_a_negative_port_from_an_agent_does_not_break_the_report(make_model):
    a = agent()
    m = make_model("m", min_replicas=0, max_replicas=1)
    r = Replica.objects.create(model=m, profile=m.profile, agent=a, state="starting", cpu_cores=1, memory_mib=128)
    reports.record_status(a.pk, {"type": "status", "v": 1,
                                 "replicas": [{"replica_id": r.pk, "state": "ready", "pid": 5, "port": -1}]})
    r.refresh_from_db()
    assert r.port is None or r.port > 0


def test_a_report_of_a_list_instead_of_a_dict_does_not_crash(make_model):
    a = agent()
    reports.record_status(a.pk, {"type": "status", "v": 1, "replicas": [[1, 2]]})
    reports.record_status(a.pk, {"type": "status", "v": 1, "replicas": "ready"})


def test_an_inventory_with_garbage_gpu_does_not_crash(make_model):
    a = agent()
    reports.record_status(a.pk, {"type": "status", "v": 1, "replicas": [],
                                 "inventory": {"gpus": [{"index": "zero"}], "cpu_cores": "many", "memory_mib": -5}})
