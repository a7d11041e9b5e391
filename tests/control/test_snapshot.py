"""Snapshot loading on the database (``fleet.control.snapshot``): the failures a model's
crash loop is counted from."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.rows import agent, replica

pytestmark = pytest.mark.django_db


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


def test_an_edit_that_fixes_a_crash_looping_spec_starts_without_its_backoff(make_model):
    """Backoff is per spec: the failures of a bad edit do not hold back the edit that fixes
    it (a model below its min would otherwise wait out up to LLMGW_BACKOFF_CAP)."""
    from fleet.control.snapshot import load_snapshot
    from fleet.control.specs import spec_hash

    a = agent("a")
    m = make_model("m", min_replicas=1)
    now = timezone.now()
    bad = spec_hash(m, m.profile)
    for seconds_ago in (30, 20, 10):
        replica(m, a, state="failed", state_changed_at=now - timedelta(seconds=seconds_ago), spec_hash=bad,
                error="engine exited with code 2\n--- last log lines ---\nerror: unrecognized arguments: --bogus")
    view = next(v for v in load_snapshot(now).models if v.id == m.id)
    assert len(view.failures) == 3 and view.last_error == ("engine exited with code 2: "
                                                            "error: unrecognized arguments: --bogus")
    m.profile.command += " --fixed"
    m.profile.save()
    view = next(v for v in load_snapshot(now).models if v.id == m.id)
    assert view.failures == () and view.last_error == ""


# --- spec hashes and deleted models (docs/architecture.md, R10; deletes drain) ---------------

def test_each_model_carries_its_current_spec_hash_and_each_replica_whether_it_is_outdated(make_model):
    from fleet.control.snapshot import load_snapshot
    from fleet.control.specs import spec_hash

    a = agent("a")
    m = make_model("m", min_replicas=1)
    current = replica(m, a, spec_hash=spec_hash(m, m.profile))
    old = replica(m, a, spec_hash="0" * 64)
    unknown = replica(m, a)  # from before hashes: current
    snapshot = load_snapshot(timezone.now())
    assert [v.spec_hash for v in snapshot.models] == [spec_hash(m, m.profile)]
    assert {r.id: r.outdated for r in snapshot.replicas} == {current.pk: False, old.pk: True, unknown.pk: False}


def test_the_spec_hash_moves_with_what_shapes_the_engine_and_nothing_else(make_model):
    from fleet.control.specs import spec_hash

    m = make_model("m", min_replicas=1)
    before = spec_hash(m, m.profile)
    m.aliases, m.idle_timeout_s, m.default_max_tokens, m.min_replicas, m.max_replicas, m.on_demand = (
        "x", 5, 9, 0, 4, True)
    assert spec_hash(m, m.profile) == before
    for field, value in (("command", "other {port}"), ("env", {"A": "1"}), ("cpu_cores", 2.0), ("memory_mib", 1),
                         ("readiness_path", "/health"), ("metrics_path", "/metrics")):
        setattr(m.profile, field, value)
        assert spec_hash(m, m.profile) != before, field
        before = spec_hash(m, m.profile)
    m.weights = "file:/dev/zero"
    assert spec_hash(m, m.profile) != before


def test_changing_only_the_routing_policy_leaves_the_spec_hash_and_outdates_no_replica(make_model):
    """Issue 17: the policy is the gateway's choice among replicas, not the engine's
    (``engine_spec`` leaves it out), so changing it restarts nothing."""
    from catalog.models import RoutingPolicy
    from fleet.control.snapshot import load_snapshot
    from fleet.control.specs import engine_spec, spec_hash

    a = agent("a")
    m = make_model("m", min_replicas=1)
    before = spec_hash(m, m.profile)
    running = replica(m, a, spec_hash=before)
    for policy in (RoutingPolicy.PREFIX_AFFINITY, RoutingPolicy.SESSION, RoutingPolicy.LEAST_LOADED):
        m.routing_policy = policy
        m.save(update_fields=["routing_policy", "updated_at"])
        assert "routing_policy" not in engine_spec(m, m.profile) and spec_hash(m, m.profile) == before, policy
        snapshot = load_snapshot(timezone.now())
        assert [v.spec_hash for v in snapshot.models] == [before]
        assert {r.id: r.outdated for r in snapshot.replicas} == {running.pk: False}


def test_a_deleted_models_replica_has_no_model_in_the_snapshot(make_model):
    from fleet.control.snapshot import load_snapshot

    a = agent("a")
    m = make_model("gone", min_replicas=1)
    r = replica(m, a)
    m.delete()
    snapshot = load_snapshot(timezone.now())
    assert snapshot.models == ()
    assert [(v.id, v.model_id, v.outdated) for v in snapshot.replicas] == [(r.pk, None, False)]


# --- load: requests queued at the gateways (fleet.models.QueueReport) ------------------------

def _metered(model):
    model.profile.metric_running, model.profile.metric_waiting = "running", "waiting"
    model.profile.save()


def test_fresh_queued_requests_add_to_a_known_load_and_stale_ones_or_an_unknown_load_do_not(make_model, settings):
    from fleet.control.snapshot import _loads
    from fleet.models import QueueReport
    from fleet.planning.scaling import Load

    settings.LLMGW_LOAD_STALE_S = 15.0
    m, quiet = make_model("m"), make_model("quiet")
    _metered(m)
    a = agent("a")
    now = timezone.now()
    replica(m, a, load_running=4, load_waiting=1, load_reported_at=now)
    replica(quiet, a, load_running=0, load_waiting=0, load_reported_at=now)
    QueueReport.objects.create(process="web:1", model=m, waiting=3, reported_at=now - timedelta(seconds=2))
    QueueReport.objects.create(process="web:2", model=m, waiting=2, reported_at=now)
    QueueReport.objects.create(process="gone:3", model=m, waiting=50, reported_at=now - timedelta(seconds=16))
    loads = _loads(now, {})
    assert loads[m.pk] == Load(1, 4, 1 + 3 + 2)  # the engine's one, and the two live processes' queues
    assert loads[quiet.pk] == Load(1, 0, 0)  # no queue: as before
    QueueReport.objects.create(process="web:1", model=quiet, waiting=4, reported_at=now)
    assert _loads(now, {})[quiet.pk] == Load(1, 0, 4)
    # An engine load gone stale stays unknown, queue or not: no step either way.
    m.replicas.update(load_reported_at=now - timedelta(seconds=16))
    assert _loads(now, {})[m.pk] == Load(1, None, None)


# --- warm before demand (R11) ------------------------------------------------------------------

def test_a_replica_records_its_cold_start_at_its_first_ready_and_never_again(make_model):
    from fleet.states import ReplicaState

    a = agent("a")
    m = make_model("m", min_replicas=1)
    r = replica(m, a, state="starting")
    r.created_at = timezone.now() - timedelta(seconds=42)
    type(r).objects.filter(pk=r.pk).update(created_at=r.created_at)
    assert r.transition(ReplicaState.READY)
    r.refresh_from_db()
    assert 41.5 <= r.cold_start_s <= 45
    first = r.cold_start_s
    assert r.transition(ReplicaState.STARTING) and r.transition(ReplicaState.READY)  # a readiness blip
    r.refresh_from_db()
    assert r.cold_start_s == first
    lost = replica(m, a, state="lost")  # a lost replica's return is not a start either
    assert lost.transition(ReplicaState.READY)
    lost.refresh_from_db()
    assert lost.cold_start_s is None


def test_the_snapshot_carries_each_models_measured_cold_start_and_the_default_otherwise(make_model):
    from fleet.control.snapshot import load_snapshot

    a = agent("a")
    m = make_model("m", min_replicas=1)
    make_model("fresh", min_replicas=1)
    for seconds in (30, 40, 50, 200):
        replica(m, a, state="stopped", cold_start_s=seconds)
    views = {v.name: v for v in load_snapshot(timezone.now()).models}
    assert views["m"].cold_start.samples == 4 and 50 < views["m"].cold_start.estimate_s < 200
    assert views["fresh"].cold_start is None  # the planner falls back to the cluster's default


def test_the_snapshot_names_the_next_window_to_start(make_model):
    from catalog.models import ClusterSettings, ScheduleWindow
    from fleet.control.snapshot import load_snapshot

    cluster = ClusterSettings.get_solo()
    cluster.time_zone = "Europe/Istanbul"
    cluster.save()
    m = make_model("m", min_replicas=1, max_replicas=3)
    now = timezone.now()
    local = now.astimezone(__import__("zoneinfo").ZoneInfo("Europe/Istanbul"))
    start = (local + timedelta(minutes=30)).time().replace(second=0, microsecond=0)
    end = (local + timedelta(minutes=90)).time().replace(second=0, microsecond=0)
    ScheduleWindow.objects.create(model=m, weekdays="daily", start=start, end=end, min_replicas=2)
    view = next(v for v in load_snapshot(now).models if v.id == m.id)
    assert view.next_window is not None and view.next_window.min_replicas == 2
    assert 28 * 60 <= (view.next_window.starts_at - now).total_seconds() <= 31 * 60
    assert view.next_window.label.startswith("mon,tue,wed,thu,fri,sat,sun")


def test_an_on_demand_models_profile_is_brought_up_to_now_with_its_latest_use(make_model):
    from fleet.control.snapshot import load_snapshot
    from fleet.models import ModelState
    from fleet.planning.warmth import ArrivalProfile, epoch_hour

    a = agent("a")
    m = make_model("od", on_demand=True)
    now = timezone.now()
    replica(m, a, last_used_at=now - timedelta(seconds=5))
    ModelState.objects.create(model=m, arrivals=ArrivalProfile(open_hour=epoch_hour(now) - 3).as_json())
    moved = {}
    load_snapshot(now, moved)
    assert set(moved) == {m.id}
    profile = moved[m.id]
    assert profile.open_hour == epoch_hour(now) and profile.open_asked  # used this hour
    assert sum(profile.seen) == 3.0 and sum(profile.asked) == 0.0  # three hours closed, none asked


def test_a_higher_window_opening_within_the_lead_after_a_lower_one_is_the_one_brought_forward(make_model):
    from catalog.models import ScheduleWindow
    from fleet.control.snapshot import load_snapshot

    a = agent("a")
    m = make_model("m", min_replicas=1, max_replicas=6)
    for seconds in (500, 500, 500):  # a cold start of 500 s: a lead of 625 s
        replica(m, a, state="stopped", cold_start_s=seconds)
    now = timezone.now()
    first = (now + timedelta(minutes=3)).replace(second=0, microsecond=0)
    second = first + timedelta(minutes=2)
    ScheduleWindow.objects.create(model=m, weekdays="daily", start=first.time(), end=second.time(), min_replicas=2)
    ScheduleWindow.objects.create(model=m, weekdays="daily", start=second.time(),
                                  end=(second + timedelta(minutes=30)).time(), min_replicas=5)
    view = next(v for v in load_snapshot(now).models if v.id == m.id)
    assert view.next_window.min_replicas == 5 and view.next_window.starts_at == second
