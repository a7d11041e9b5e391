"""Breaker: a request served just before the idle timeout does not keep the model."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.control import reconciler
from fleet.models import Agent, ModelState, Replica, UsageReport
from fleet.control.usage import record_report

pytestmark = pytest.mark.django_db


def test_a_request_routed_just_before_the_idle_timeout_keeps_the_model(make_model, cluster):
    a = Agent.objects.create(name="cpu-1", connected=True, last_seen_at=timezone.now(), cpu_cores=4,
                             memory_mib=8192, address="127.0.0.1")
    m = make_model("od", min_replicas=0, max_replicas=1, on_demand=True, idle_timeout_s=60)
    now = timezone.now()
    r = Replica.objects.create(model=m, profile=m.profile, agent=a, state="ready", port=20001,
                               cpu_cores=1, memory_mib=128, ready_at=now - timedelta(minutes=5),
                               last_used_at=now - timedelta(seconds=61))
    ModelState.objects.create(model=m, wanted_at=now - timedelta(seconds=61))
    # The web process's last flushed report (fresh): nothing in flight.
    UsageReport.objects.create(process="web:1", replica=r, in_flight=0, reported_at=now,
                               last_used_at=now - timedelta(seconds=61))
    # A request is routed to the ready replica at `used` (the gateway routes a ready replica
    # without calling want()); its usage report is flushed up to a second later ...
    used = timezone.now()
    # ... but a pass runs in between:
    reconciler.reconcile()
    # ... and now the report lands: one in flight, used just now.
    record_report("web:1", {r.pk: (1, used)})
    reconciler.reconcile()
    r.refresh_from_db()
    state = ModelState.objects.get(model=m)
    # Correct: use at `used` is the last request; the idle timeout counts from it, so the
    # model stays wanted and its replica keeps serving.
    assert state.wanted_at is not None, "the request's use was dropped: demand stays forgotten"
    assert r.state == "ready", f"replica is {r.state}: drained right after serving a request"


def test_a_replica_with_a_request_in_flight_is_not_stopped_by_two_quick_passes(make_model, cluster):
    """Same start; a second pass runs before the web process's next usage flush (the
    reconciler loops while passes are requested, e.g. by an agent report). The draining
    replica is judged by the fresh-but-outdated report (0 in flight) and moves to
    'stopping' -> the agent SIGTERMs the engine under the in-flight request."""
    a = Agent.objects.create(name="cpu-1", connected=True, last_seen_at=timezone.now(), cpu_cores=4,
                             memory_mib=8192, address="127.0.0.1")
    m = make_model("od", min_replicas=0, max_replicas=1, on_demand=True, idle_timeout_s=60)
    now = timezone.now()
    r = Replica.objects.create(model=m, profile=m.profile, agent=a, state="ready", port=20001,
                               cpu_cores=1, memory_mib=128, ready_at=now - timedelta(minutes=5),
                               last_used_at=now - timedelta(seconds=61))
    ModelState.objects.create(model=m, wanted_at=now - timedelta(seconds=61))
    UsageReport.objects.create(process="web:1", replica=r, in_flight=0, reported_at=now,
                               last_used_at=now - timedelta(seconds=61))
    # request routed now (in flight in the gateway's memory, not yet flushed)
    reconciler.reconcile()
    reconciler.reconcile()
    r.refresh_from_db()
    # Still draining: a report from before the drain began says nothing about in flight since.
    assert r.state == "draining", f"replica is {r.state}: stopped with a request in flight (report not flushed yet)"
