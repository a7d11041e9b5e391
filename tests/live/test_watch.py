"""The web process's watcher on the database (``fleet.live.watch``): heartbeat stamps kept in
memory and written in batches, never backwards, kept through a failed write; a web process
registering again after a gap restarts its listening window."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.utils import timezone

from fleet.live.watch import HeartbeatStamps, register_web_process
from fleet.models import Agent, ControlPlane
from fleet.control.planes import listening_since
from tests.rows import agent

pytestmark = pytest.mark.django_db


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


# --- registering: a web process's listening window -----------------------------------------

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
