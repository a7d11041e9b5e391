"""The reconciler's shell on the database: the pass lock, requests during a pass, and what
a pass writes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet import reconciler
from fleet.models import Agent, ModelState, PassLock, Replica

pytestmark = pytest.mark.django_db


def connected_agent(name="cpu-1", cores=4, memory=8192) -> Agent:
    return Agent.objects.create(name=name, connected=True, last_seen_at=timezone.now(), cpu_cores=cores,
                                memory_mib=memory, address="127.0.0.1")


def test_only_one_holder_gets_the_pass_lock():
    now = timezone.now()
    assert PassLock.try_acquire("worker-a", now, 60) is not None
    assert PassLock.try_acquire("worker-b", now, 60) is None
    assert PassLock.release_if_unchanged("worker-a", 0, now)
    assert PassLock.try_acquire("worker-b", now, 60) is not None


def test_an_expired_lock_is_taken_over():
    now = timezone.now()
    PassLock.try_acquire("crashed-worker", now - timedelta(seconds=120), 60)
    assert PassLock.try_acquire("worker-b", now, 60) is not None


def test_a_pass_requested_during_a_pass_is_run_by_the_holder(monkeypatch):
    calls = []

    def fake_pass(now=None):
        calls.append(now)
        if len(calls) == 1:
            PassLock.request_pass()  # a request lands while the first pass runs

    monkeypatch.setattr(reconciler, "run_pass", fake_pass)
    assert reconciler.reconcile("worker-a") == 2
    assert PassLock.objects.get(pk=1).holder == ""


def test_a_skipped_request_is_not_lost(monkeypatch):
    PassLock.try_acquire("worker-a", timezone.now(), 60)
    assert reconciler.reconcile("worker-b") == 0  # busy: the holder will see the request


def test_a_pass_places_min_replicas_and_says_why(make_model):
    agent = connected_agent()
    m = make_model("m", min_replicas=2, max_replicas=2)
    reconciler.reconcile()
    replicas = list(Replica.objects.filter(model=m))
    assert len(replicas) == 2 and {r.agent_id for r in replicas} == {agent.pk}
    assert all(r.state == "placing" and r.cpu_cores == 1 for r in replicas)
    assert Agent.objects.get(pk=agent.pk).generation > 0
    state = ModelState.objects.get(model=m)
    assert state.desired == 2 and not state.unservable and "placed on cpu-1" in state.reason


def test_a_pass_records_why_nothing_fits(make_model):
    connected_agent(cores=0, memory=0)
    m = make_model("m", min_replicas=1)
    reconciler.reconcile()
    state = ModelState.objects.get(model=m)
    assert state.unservable and "cpu-1: 0 CPU cores free" in state.reason
    assert not Replica.objects.exists()


def test_a_second_pass_changes_nothing(make_model):
    connected_agent()
    make_model("m", min_replicas=1)
    reconciler.reconcile()
    reconciler.reconcile()
    assert Replica.objects.count() == 1


def test_stopping_the_cluster_drains_ready_replicas(make_model, cluster):
    agent = connected_agent()
    m = make_model("m", min_replicas=1)
    Replica.objects.create(model=m, profile=m.profile, agent=agent, state="ready", port=1, cpu_cores=1)
    cluster.stopped = True
    cluster.save()
    reconciler.reconcile()
    assert Replica.objects.get().state == "draining"
