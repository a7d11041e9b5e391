"""Control-plane processes on the database (``fleet.control.planes``, ``fleet.control.leader``):
silence counted only while the control plane could listen, so a database outage longer than
the grace loses no agent; the leader lease (one worker leads, the others stand by and take
over an expired or released lease), with an injected clock."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from fleet.control.leader import LeaderLoop
from fleet.control.planes import listening_since
from fleet.control.reconciler import reconcile
from fleet.models import ControlPlane, LeaderLease, Replica
from tests.processes import wait_until
from tests.rows import agent, replica

pytestmark = pytest.mark.django_db


# --- listening: silence the control plane itself caused ------------------------------------

def test_without_registered_web_processes_silence_always_counts():
    assert listening_since(timezone.now()) is None


def test_when_no_web_process_has_registered_lately_nobody_is_blamed(settings):
    settings.LLMGW_CONTROL_PLANE_HEARTBEAT_S = 1.0
    now = timezone.now()
    ControlPlane.objects.create(host="h", role="web", pid=1, started_at=now - timedelta(hours=1),
                                last_seen_at=now - timedelta(seconds=30))
    assert listening_since(now) == now


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


# --- the leader lease ----------------------------------------------------------------------

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_free_lease_is_taken_and_a_standby_cannot_take_it_while_it_lives():
    assert LeaderLease.take_or_renew("w1:1", at(0), 5.0)
    assert not LeaderLease.take_or_renew("w2:2", at(4.9), 5.0)
    lease = LeaderLease.objects.get(pk=1)
    assert (lease.holder, lease.expires_at, lease.since) == ("w1:1", at(5), at(0))
    assert LeaderLease.leader(at(4.9)) == "w1:1"


def test_only_the_holder_renews_and_renewing_keeps_its_since():
    LeaderLease.take_or_renew("w1:1", at(0), 5.0)
    assert LeaderLease.take_or_renew("w1:1", at(4), 5.0)
    assert not LeaderLease.take_or_renew("w2:2", at(8), 5.0)  # renewed at 4: lives until 9
    lease = LeaderLease.objects.get(pk=1)
    assert (lease.holder, lease.expires_at, lease.since) == ("w1:1", at(9), at(0))


def test_an_expired_lease_is_taken_by_a_standby():
    LeaderLease.take_or_renew("w1:1", at(0), 5.0)
    assert LeaderLease.leader(at(5.1)) == ""
    assert LeaderLease.take_or_renew("w2:2", at(5.1), 5.0)
    lease = LeaderLease.objects.get(pk=1)
    assert (lease.holder, lease.since) == ("w2:2", at(5.1))
    assert not LeaderLease.take_or_renew("w1:1", at(5.2), 5.0)  # the old leader, back: a standby now


def test_a_released_lease_is_taken_at_once_and_only_the_holder_releases():
    LeaderLease.take_or_renew("w1:1", at(0), 5.0)
    assert not LeaderLease.release("w2:2")
    assert LeaderLease.leader(at(1)) == "w1:1"
    assert LeaderLease.release("w1:1")
    assert LeaderLease.leader(at(1)) == ""
    assert LeaderLease.take_or_renew("w2:2", at(1), 5.0)


def test_the_loop_that_takes_the_lease_leads_and_the_other_stands_by_until_it_expires(settings):
    settings.LLMGW_LEADER_LEASE_S = 5.0
    clock = {"now": at(0)}
    a = LeaderLoop("w1:1", clock=lambda: clock["now"], run_pass=lambda: 0)
    b = LeaderLoop("w2:2", clock=lambda: clock["now"], run_pass=lambda: 0)
    assert a.step() and not b.step()
    clock["now"] = at(3)
    assert a.step() and not b.step()  # renewed: lives until 8
    clock["now"] = at(7.9)
    assert not b.step()
    clock["now"] = at(8.1)  # a stopped renewing at 3 (killed)
    assert b.step() and b.leading
    assert not a.step() and not a.leading
    assert LeaderLease.objects.get(pk=1).holder == "w2:2"


def test_a_loop_registers_its_worker_and_unregisters_and_releases_on_the_way_out(settings):
    loop = LeaderLoop("w1:1", run_pass=lambda: 0)
    assert loop.step()
    assert ControlPlane.objects.filter(role="worker").count() == 1
    loop.release()
    assert LeaderLease.leader(timezone.now()) == "" and not ControlPlane.objects.filter(role="worker").exists()


@pytest.mark.django_db(transaction=True)
def test_the_leader_runs_a_pass_at_once_and_then_on_the_cadence_a_standby_none(settings):
    settings.LLMGW_LEADER_RENEW_S = 0.05
    settings.LLMGW_RECONCILE_INTERVAL_S = 0.1
    passes = {"a": 0, "b": 0}

    def counting(name):
        def run_pass():
            passes[name] += 1
            return 1
        return run_pass

    a = LeaderLoop("w1:1", run_pass=counting("a"))
    b = LeaderLoop("w2:2", run_pass=counting("b"))
    assert a.step()  # a leads before either loop runs
    stop_a, stop_b = threading.Event(), threading.Event()
    threads = [threading.Thread(target=a.run, args=(stop_a,)), threading.Thread(target=b.run, args=(stop_b,))]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: passes["a"] >= 3, timeout_s=60, what="the leader's passes on the cadence")
        assert passes["b"] == 0 and not b.leading
        stop_a.set()  # a stops cleanly: releases the lease; b takes it at its next renewal
        threads[0].join(30)
        wait_until(lambda: passes["b"] >= 1, timeout_s=60, what="the standby to take over and run a pass")
        assert LeaderLease.leader(timezone.now()) == "w2:2"
    finally:
        stop_a.set()
        stop_b.set()
        for t in threads:
            t.join(30)
    assert LeaderLease.leader(timezone.now()) == ""
