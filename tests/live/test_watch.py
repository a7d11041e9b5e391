"""Lost and returning agents through the reconciler's shell and the report ingestion, on
the database: heartbeat stamps written in batches, silence counted only while the control
plane could listen, a lost replica's engine reported again, duplicates stopped."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.utils import timezone

from fleet.control import reports
from fleet.live.watch import HeartbeatStamps, register_web_process
from fleet.models import Agent, ControlPlane, Replica
from fleet.control.planes import listening_since
from fleet.control.reconciler import reconcile

pytestmark = pytest.mark.django_db


def agent(name: str, seen_s_ago: float = 0.5) -> Agent:
    return Agent.objects.create(name=name, connected=True, last_seen_at=timezone.now() - timedelta(seconds=seen_s_ago),
                                cpu_cores=4, memory_mib=8192, address="127.0.0.1")


def replica(model, on: Agent, state: str = "ready", **kw) -> Replica:
    return Replica.objects.create(model=model, profile=model.profile, agent=on, state=state, port=20001, cpu_cores=1,
                                  memory_mib=128, **kw)


# --- heartbeat stamps ----------------------------------------------------------------------

def test_heartbeats_are_stamped_on_arrival_and_written_in_one_batch(django_assert_max_num_queries):
    agents = [agent(f"a{i}", seen_s_ago=60) for i in range(20)]
    stamps = HeartbeatStamps()
    before = timezone.now()
    for a in agents:
        stamps.stamp(a.pk)
    with django_assert_max_num_queries(3):  # one UPDATE per distinct 0.1 s
        assert stamps.flush() == 20
    for a in Agent.objects.all():
        assert before - timedelta(seconds=0.11) <= a.last_seen_at <= timezone.now()
    assert stamps.flush() == 0


def test_a_stamp_never_moves_last_seen_backwards():
    a = agent("a", seen_s_ago=0)
    stamps = HeartbeatStamps()
    stamps.pending[a.pk] = timezone.now() - timedelta(seconds=30)  # a late stamp
    stamps.flush()
    assert Agent.objects.get(pk=a.pk).last_seen_at == a.last_seen_at and not stamps.pending


def test_stamps_that_cannot_be_written_are_kept_for_the_next_flush(monkeypatch):
    a = agent("a", seen_s_ago=60)
    stamps = HeartbeatStamps()
    stamps.stamp(a.pk)

    def database_away(*args, **kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr("django.db.models.query.QuerySet.update", database_away)
    with pytest.raises(OperationalError):
        stamps.flush()
    monkeypatch.undo()
    assert list(stamps.pending) == [a.pk]
    stamps.flush()
    assert timezone.now() - Agent.objects.get(pk=a.pk).last_seen_at < timedelta(seconds=5)


def test_a_stamp_is_only_kept_in_memory(django_assert_num_queries):
    from fleet.live.watch import heartbeats

    with django_assert_num_queries(0):
        heartbeats.stamp(42)
    assert 42 in heartbeats.pending
    heartbeats.pending.clear()


# --- listening: silence the control plane itself caused ------------------------------------

def test_without_registered_web_processes_silence_always_counts():
    assert listening_since(timezone.now()) is None


def test_when_no_web_process_has_registered_lately_nobody_is_blamed(settings):
    settings.LLMGW_CONTROL_PLANE_HEARTBEAT_S = 1.0
    now = timezone.now()
    ControlPlane.objects.create(host="h", role="web", pid=1, started_at=now - timedelta(hours=1),
                                last_seen_at=now - timedelta(seconds=30))
    assert listening_since(now) == now


def test_a_web_process_that_re_registers_after_a_gap_restarts_the_listening_window(settings):
    settings.LLMGW_CONTROL_PLANE_HEARTBEAT_S = 1.0
    import os

    long_ago = timezone.now() - timedelta(hours=1)
    ControlPlane.objects.create(host=socket.gethostname(), role="web", pid=os.getpid(), started_at=long_ago,
                                last_seen_at=long_ago + timedelta(minutes=50))  # then the database went away
    register_web_process()
    row = ControlPlane.objects.get(pid=os.getpid())
    assert timezone.now() - row.started_at < timedelta(seconds=5)
    assert listening_since(timezone.now()) == row.started_at
    register_web_process()  # no gap: the window stays
    assert ControlPlane.objects.get(pid=os.getpid()).started_at == row.started_at


def test_a_database_outage_longer_than_the_grace_loses_no_agent(make_model, settings):
    settings.LLMGW_AGENT_LOST_AFTER_S = 5.0
    settings.LLMGW_CONTROL_PLANE_HEARTBEAT_S = 1.0
    a = agent("a", seen_s_ago=30)  # its stamps could not be written for 30 s
    m = make_model("m", min_replicas=1)
    r = replica(m, a)
    now = timezone.now()
    ControlPlane.objects.create(host="h", role="web", pid=1, started_at=now - timedelta(seconds=2), last_seen_at=now)
    reconcile()
    assert Replica.objects.get(pk=r.pk).state == "ready"
    assert Replica.objects.filter(model=m).count() == 1


# --- an agent comes back ---------------------------------------------------------------------

def test_a_lost_replica_reported_ready_stays_lost_for_the_planner_to_decide(make_model):
    a = agent("a")
    m = make_model("m", min_replicas=1)
    r = replica(m, a, state="lost", ready_at=timezone.now() - timedelta(minutes=5))
    assert reports.record_replicas(a.pk, [{"replica_id": r.pk, "state": "ready", "pid": 7, "port": 20001}])
    r.refresh_from_db()
    assert r.state == "lost" and r.ready_at > r.state_changed_at
    # Still in the agent's desired set: the engine is not stopped before the planner decides.
    assert [x["replica_id"] for x in reports.desired_set(a.pk)["replicas"]] == [r.pk]


def test_a_returning_duplicate_is_stopped_and_the_successor_kept(make_model):
    a, b = agent("a"), agent("b")
    m = make_model("m", min_replicas=1)
    lost = replica(m, a, state="lost", reason="agent a silent for 30 s")
    successor = replica(m, b, state="ready")
    reports.record_replicas(a.pk, [{"replica_id": lost.pk, "state": "ready", "pid": 7, "port": 20001}])
    generation = Agent.objects.get(pk=a.pk).generation
    reconcile()
    lost.refresh_from_db()
    assert lost.state == "stopping" and "duplicate: agent a came back, 1 ready elsewhere" in lost.reason
    assert Replica.objects.get(pk=successor.pk).state == "ready"
    assert Agent.objects.get(pk=a.pk).generation > generation  # told to stop it
    assert reports.desired_set(a.pk)["replicas"] == []


def test_a_returning_replica_is_taken_back_while_its_successor_is_still_starting(make_model):
    a, b = agent("a"), agent("b")
    m = make_model("m", min_replicas=1)
    lost = replica(m, a, state="lost")
    successor = replica(m, b, state="starting")
    reports.record_replicas(a.pk, [{"replica_id": lost.pk, "state": "ready", "pid": 7, "port": 20001}])
    reconcile()
    assert Replica.objects.get(pk=lost.pk).state == "ready"
    assert Replica.objects.get(pk=successor.pk).state == "stopping"


def test_an_agent_back_without_an_engine_it_was_stopping_has_it_stopped(make_model):
    a = agent("a")
    m = make_model("m", min_replicas=0)
    replica(m, a, state="stopping")
    replica(m, a, state="lost")
    assert reports.forget_unreported(a.pk, []) == 2  # its report of the stop went missing
    assert {r.state for r in Replica.objects.all()} == {"stopped"}


# --- crash loops ---------------------------------------------------------------------------

def test_an_engine_dying_soon_after_each_start_stays_in_its_crash_loop(make_model, settings):
    from fleet.control.snapshot import load_snapshot

    settings.LLMGW_BACKOFF_RESET_AFTER_S = 60.0
    a = agent("a")
    m = make_model("m", min_replicas=1)
    now = timezone.now()
    for seconds_ago in (50, 30, 10):  # each was ready for 5 s, then died
        replica(m, a, state="failed", ready_at=now - timedelta(seconds=seconds_ago + 5),
                state_changed_at=now - timedelta(seconds=seconds_ago), error="engine exited with code -9")
    assert len(next(v for v in load_snapshot(now).models if v.id == m.id).failures) == 3


def test_a_replica_ready_for_the_reset_period_ends_the_crash_loop(make_model, settings):
    from fleet.control.snapshot import load_snapshot

    settings.LLMGW_BACKOFF_RESET_AFTER_S = 60.0
    a = agent("a")
    m = make_model("m", min_replicas=1)
    now = timezone.now()
    replica(m, a, state="failed", state_changed_at=now - timedelta(seconds=200))
    replica(m, a, state="failed", ready_at=now - timedelta(seconds=190),  # served 70 s: proved itself
            state_changed_at=now - timedelta(seconds=120))
    replica(m, a, state="failed", state_changed_at=now - timedelta(seconds=20))
    failures = next(v for v in load_snapshot(now).models if v.id == m.id).failures
    assert [round((now - f).total_seconds()) for f in failures] == [120, 20]
