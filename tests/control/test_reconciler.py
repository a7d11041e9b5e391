"""The reconciler's shell on the database: the pass lock, requests during a pass, what a
pass writes, and a usage report landing between two passes (an idle model kept, a request
in flight not stopped)."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from fleet.control import reconciler
from fleet.control.usage import record_report
from fleet.models import Agent, ModelState, PassLock, Replica, UsageReport

pytestmark = pytest.mark.django_db


def connected_agent(name="cpu-1", cores=4, memory=8192) -> Agent:
    return Agent.objects.create(name=name, connected=True, last_seen_at=timezone.now(), cpu_cores=cores,
                                memory_mib=memory, address="127.0.0.1")


def test_only_one_holder_gets_the_pass_lock():
    now = timezone.now()
    assert PassLock.try_acquire("worker-a", now, 60) is not None
    assert PassLock.try_acquire("worker-b", now, 60) is None
    assert PassLock.objects.get(pk=1).holder == "worker-a"
    assert PassLock.release_if_unchanged("worker-a", 0, now)
    assert PassLock.try_acquire("worker-b", now, 60) is not None
    assert PassLock.objects.get(pk=1).holder == "worker-b"


def test_an_expired_lock_is_taken_over():
    now = timezone.now()
    PassLock.try_acquire("crashed-worker", now - timedelta(seconds=120), 60)
    assert PassLock.try_acquire("worker-b", now, 60) is not None
    lock = PassLock.objects.get(pk=1)
    assert (lock.holder, lock.expires_at) == ("worker-b", now + timedelta(seconds=60))


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
    now = timezone.now()
    seen = PassLock.try_acquire("worker-a", now, 60)
    PassLock.request_pass()  # what worker-b's task was started for
    assert reconciler.reconcile("worker-b") == 0  # busy: the holder will see the request
    assert PassLock.objects.get(pk=1).holder == "worker-a"
    # The holder may not release after its pass: the request is still counted, so it runs again.
    assert not PassLock.release_if_unchanged("worker-a", seen, now)
    assert PassLock.objects.get(pk=1).requested == seen + 1


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


def test_engine_load_comes_from_metrics_and_goes_unknown_when_stale(make_model, settings):
    from datetime import timedelta

    from fleet.control.snapshot import _loads
    from fleet.planning.scaling import Load

    agent = connected_agent()
    m = make_model("m", min_replicas=1, max_replicas=3)
    m.profile.metric_running, m.profile.metric_waiting = "vllm:num_requests_running", "vllm:num_requests_waiting"
    m.profile.save()
    now = timezone.now()
    Replica.objects.create(model=m, profile=m.profile, agent=agent, state="ready", port=1,
                           load_running=3, load_waiting=5, load_reported_at=now)
    assert _loads(now, {})[m.pk] == Load(1, 3, 5)
    later = now + timedelta(seconds=settings.LLMGW_LOAD_STALE_S + 1)
    assert _loads(later, {})[m.pk] == Load(1, None, None)  # stale is unknown, never 0


def test_engines_without_metrics_fall_back_to_the_gateways_in_flight_counts(make_model):
    from fleet.control.snapshot import _loads
    from fleet.planning.scaling import Load

    agent = connected_agent()
    m = make_model("m", min_replicas=1, max_replicas=3)
    r = Replica.objects.create(model=m, profile=m.profile, agent=agent, state="ready", port=1)
    assert _loads(timezone.now(), {r.pk: 7})[m.pk] == Load(1, 7, 0)
    assert _loads(timezone.now(), {})[m.pk] == Load(1, None, 0)  # no fresh report: unknown


def test_a_scale_step_is_recorded_as_an_event(make_model, cluster):
    from datetime import timedelta

    from fleet.models import ScalingEvent

    cluster.scale_up_waiting = 1
    cluster.scale_up_after_s = 0
    cluster.save()
    agent = connected_agent()
    m = make_model("m", min_replicas=1, max_replicas=2)
    m.profile.metric_running, m.profile.metric_waiting = "r", "w"
    m.profile.save()
    Replica.objects.create(model=m, profile=m.profile, agent=agent, state="ready", port=1, cpu_cores=1,
                           load_running=4, load_waiting=3, load_reported_at=timezone.now())
    ModelState.objects.create(model=m, busy_since=timezone.now() - timedelta(seconds=1))
    reconciler.reconcile()
    event = ScalingEvent.objects.get(model=m)
    assert (event.from_replicas, event.to_replicas) == (1, 2) and "3.0 waiting per replica" in event.reason
    assert Replica.objects.filter(model=m).count() == 2
    state = ModelState.objects.get(model=m)
    assert state.extra_replicas == 1 and state.observed_per_replica == 4  # learned from the queue, kept


@pytest.mark.django_db(transaction=True)  # the watcher's flush writes from a worker thread
def test_requests_queued_at_the_gateway_scale_a_model_held_at_its_capacity_up(make_model, cluster):
    """The gateway holds a model's requests at its capacity: the engine runs its fill with
    nothing waiting, so only the gateway's queue, reported by the watcher, says it is busy."""
    import asyncio

    from fleet import live
    from fleet.control.snapshot import _loads
    from fleet.live.watch import process_id, queued, watcher
    from fleet.models import QueueReport, ScalingEvent
    from fleet.planning.scaling import Load

    cluster.scale_up_waiting = 1
    cluster.scale_up_after_s = 0
    cluster.save()
    agent = connected_agent()
    m = make_model("m", min_replicas=1, max_replicas=2)
    m.profile.metric_running, m.profile.metric_waiting = "r", "w"
    m.profile.save()
    Replica.objects.create(model=m, profile=m.profile, agent=agent, state="ready", port=1, cpu_cores=1,
                           load_running=4, load_waiting=0, load_reported_at=timezone.now())
    ModelState.objects.create(model=m, busy_since=timezone.now() - timedelta(seconds=1))
    try:
        live.set_queued(m.pk, 3)
        asyncio.run(watcher.flush_usage(force=True))
    finally:
        queued.depths.clear(), queued.written.clear()
    assert list(QueueReport.objects.values_list("process", "model_id", "waiting")) == [(process_id(), m.pk, 3)]
    assert _loads(timezone.now(), {})[m.pk] == Load(1, 4, 3)
    reconciler.reconcile()
    event = ScalingEvent.objects.get(model=m)
    assert (event.from_replicas, event.to_replicas) == (1, 2) and "3.0 waiting per replica" in event.reason
    assert Replica.objects.filter(model=m).count() == 2
    state = ModelState.objects.get(model=m)
    assert state.extra_replicas == 1 and state.observed_per_replica == 4  # full while the gateway queued


def test_old_queue_reports_are_forgotten_with_the_usage_reports(make_model):
    from fleet.models import QueueReport
    from fleet.tasks import forget_old_reports

    m = make_model("m")
    QueueReport.objects.create(process="gone:1", model=m, waiting=2, reported_at=timezone.now() - timedelta(hours=2))
    QueueReport.objects.create(process="here:2", model=m, waiting=1, reported_at=timezone.now())
    assert forget_old_reports() == 1
    assert list(QueueReport.objects.values_list("process", flat=True)) == ["here:2"]


def test_old_usage_reports_and_silent_control_planes_are_forgotten(make_model):
    from datetime import timedelta

    from fleet.models import ControlPlane, UsageReport
    from fleet.tasks import forget_old_reports

    agent = connected_agent()
    m = make_model("m")
    r = Replica.objects.create(model=m, profile=m.profile, agent=agent, state="ready", port=1)
    old = timezone.now() - timedelta(hours=2)
    UsageReport.objects.create(process="gone:1", replica=r, reported_at=old)
    UsageReport.objects.create(process="here:2", replica=r, reported_at=timezone.now())
    ControlPlane.objects.create(host="old", role="web", pid=1, last_seen_at=timezone.now() - timedelta(days=2))
    assert forget_old_reports() == 2
    assert list(UsageReport.objects.values_list("process", flat=True)) == ["here:2"]


def test_each_placed_replica_gets_an_engine_key_of_its_own(make_model):
    connected_agent(cores=8, memory=8192)
    model = make_model("twice", min_replicas=2, max_replicas=2)
    reconciler.reconcile()
    keys = list(Replica.objects.filter(model=model).values_list("engine_key", flat=True))
    assert len(keys) == 2 and len(set(keys)) == 2 and all(len(k) >= 40 for k in keys)


def test_the_migration_gives_every_existing_replica_a_key_of_its_own(make_model):
    """Replicas from before issue 12 had none; one default for all would be one key for all."""
    from importlib import import_module

    from django.apps import apps

    agent = connected_agent()
    model = make_model("old", min_replicas=0)
    for _ in range(3):
        Replica.objects.create(model=model, profile=model.profile, agent=agent, state="ready", port=1)
    Replica.objects.update(engine_key="")
    import_module("fleet.migrations.0009_replica_engine_key").give_each_replica_a_key(apps, None)
    keys = list(Replica.objects.values_list("engine_key", flat=True))
    assert len(set(keys)) == 3 and all(len(k) >= 40 for k in keys)


def test_the_gateway_reaches_an_engine_on_an_ipv6_advertised_address():
    from fleet.models import engine_url

    assert engine_url("fd00::5", 20001) == "http://[fd00::5]:20001"
    assert engine_url("10.0.0.5", 20001) == "http://10.0.0.5:20001"
    assert engine_url("", 20001) == "http://127.0.0.1:20001"


# --- usage reports landing between passes -----------------------------------------------

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


# --- Edits roll, deletes drain (docs/architecture.md, R10; "Replica state machine") ------------


def gpu_agent(name="gpu-1", gpus=1) -> Agent:
    from fleet.models import Gpu

    a = connected_agent(name)
    for i in range(gpus):
        Gpu.objects.create(agent=a, index=i, memory_total_mib=81920)
    return a


@pytest.fixture
def gpu_profile(db):
    from catalog.models import Profile

    profile = Profile(name="fake-gpu", engine=Profile.Engine.CUSTOM,
                      command="{python} tests/fake_engine.py --port {port} --api-key {api_key}",
                      gpus_needed=1, gpu_memory_mib=40960)
    profile.full_clean()
    profile.save()
    return profile


def mark_ready(replicas) -> None:
    for r in replicas:
        assert Replica.objects.get(pk=r.pk).transition("ready", port=20001)


def test_a_placed_replica_records_its_models_name_and_the_hash_of_its_spec(make_model):
    from fleet.control.specs import spec_hash

    connected_agent()
    m = make_model("m")
    reconciler.reconcile()
    r = Replica.objects.get(model=m)
    assert (r.model_name, r.spec_hash) == ("m", spec_hash(m, m.profile))
    assert len(r.spec_hash) == 64


def test_edits_that_do_not_shape_the_engine_restart_nothing(make_model):
    connected_agent()
    m = make_model("m", min_replicas=1, max_replicas=1)
    reconciler.reconcile()
    mark_ready(Replica.objects.filter(model=m))
    m.aliases, m.idle_timeout_s, m.default_max_tokens, m.max_replicas = "alias-1", 77, 64, 3
    m.full_clean()
    m.save()
    reconciler.reconcile()
    assert list(Replica.objects.values_list("state", flat=True)) == ["ready"]
    assert not reconciler.load_snapshot(timezone.now()).replicas[0].outdated


def test_rows_from_before_spec_hashes_count_as_current_so_an_upgrade_restarts_nothing(make_model):
    connected_agent()
    m = make_model("m")
    reconciler.reconcile()
    mark_ready(Replica.objects.filter(model=m))
    Replica.objects.update(spec_hash="")
    m.profile.command += " --verbose"
    m.profile.save()
    reconciler.reconcile()
    assert list(Replica.objects.values_list("state", flat=True)) == ["ready"]


def test_a_profile_command_edit_rolls_the_replica_surge_first(make_model):
    connected_agent(cores=4)
    m = make_model("m")
    reconciler.reconcile()
    old = Replica.objects.get(model=m)
    mark_ready([old])
    m.profile.command += " --new-flag"
    m.profile.save()
    reconciler.reconcile()
    surge = Replica.objects.exclude(pk=old.pk).get()
    assert surge.state == "placing" and Replica.objects.get(pk=old.pk).state == "ready"
    assert ModelState.objects.get(model=m).reason == f"replacing r{old.pk}: surge starting on cpu-1"
    snapshot = reconciler.load_snapshot(timezone.now())
    assert {r.id: r.outdated for r in snapshot.replicas} == {old.pk: True, surge.pk: False}
    mark_ready([surge])
    reconciler.reconcile()
    assert Replica.objects.get(pk=old.pk).state == "draining"
    assert Replica.objects.get(pk=surge.pk).state == "ready"


def test_a_weights_edit_without_room_replaces_in_place(make_model):
    connected_agent(cores=1)
    m = make_model("m")
    reconciler.reconcile()
    old = Replica.objects.get(model=m)
    mark_ready([old])
    m.weights = "file:/dev/zero"
    m.save()
    reconciler.reconcile()
    assert Replica.objects.get(pk=old.pk).state == "draining"
    assert Replica.objects.count() == 1
    assert ModelState.objects.get(model=m).reason == f"replacing r{old.pk} in place: no room for a surge"


def routing_table() -> dict[int, list[int]]:
    """The watcher's routing table as one refresh builds it: model id → replica ids."""
    from fleet.live import watch

    with mock.patch.object(watch, "close_old_connections"):  # the test's transaction holds the connection
        view, _ = watch._load_view([])
    return {model_id: [e.replica_id for e in routes] for model_id, routes in view.routes.items()}


def test_deleting_a_model_drains_its_ready_replica_and_keeps_its_gpu_taken(make_model, gpu_profile):
    from catalog.models import Model
    from fleet.control.reports import desired_set

    agent = gpu_agent(gpus=1)
    gone = make_model("gone", profile=gpu_profile)
    reconciler.reconcile()
    r = Replica.objects.get(model=gone)
    assert r.gpu_indices == [0]
    mark_ready([r])
    assert routing_table() == {gone.pk: [r.pk]}

    gone.delete()  # as the admin or REST would: the ORM's delete
    r.refresh_from_db()
    assert (r.model_id, r.model_name, r.state) == (None, "gone", "ready")
    assert routing_table() == {}  # out of routing at once, before any pass

    newcomer = make_model("newcomer", profile=gpu_profile)
    reconciler.reconcile()
    r.refresh_from_db()
    assert r.state == "draining" and "draining: its model was deleted" in r.reason
    assert not Replica.objects.filter(model=newcomer).exists()  # its GPU is still taken
    assert ModelState.objects.get(model=newcomer).reason.startswith("waiting for 1 replica on gpu-1 to stop")
    assert ModelState.objects.filter(model_id=gone.pk).count() == 0  # ModelState cascades
    assigned = desired_set(agent.pk)["replicas"]
    assert [(a["replica_id"], a["served_name"]) for a in assigned] == [(r.pk, "gone")]  # the agent keeps it

    Replica.objects.get(pk=r.pk).transition("stopping")
    reconciler.reconcile()
    assert not Replica.objects.filter(model=newcomer).exists()  # stopping still holds the GPU
    Replica.objects.get(pk=r.pk).transition("stopped")  # the agent reported the engine gone
    reconciler.reconcile()
    assert list(Replica.objects.filter(model=newcomer).values_list("gpu_indices", flat=True)) == [[0]]
    assert Replica.objects.filter(pk=r.pk, state="stopped", model=None).exists()  # kept for retention
    assert str(Replica.objects.get(pk=r.pk)) == f"r{r.pk} gone (deleted) on gpu-1"
    assert Model.objects.filter(name="gone").count() == 0


def test_deleting_a_model_whose_replica_is_still_starting_stops_it(make_model):
    connected_agent()
    m = make_model("m")
    reconciler.reconcile()
    r = Replica.objects.get(model=m)
    m.delete()
    reconciler.reconcile()
    r.refresh_from_db()
    assert r.state == "stopping" and "its model was deleted" in r.reason


def test_the_migration_copies_each_replicas_model_name_and_leaves_its_spec_unknown(make_model):
    """Rows from before issue 14: their name copied, no hash ("" = current, nothing restarts)."""
    from importlib import import_module

    from django.apps import apps

    agent = connected_agent()
    model = make_model("old", min_replicas=0)
    Replica.objects.create(model=model, profile=model.profile, agent=agent, state="ready", port=1)
    Replica.objects.update(model_name="")
    import_module("fleet.migrations.0010_replica_spec_hash_and_deletes_drain").copy_model_names(apps, None)
    assert list(Replica.objects.values_list("model_name", "spec_hash")) == [("old", "")]

@pytest.mark.django_db(transaction=True)
def test_a_pass_longer_than_a_third_of_the_lock_ttl_keeps_the_lock_extended(monkeypatch, settings):
    from tests.processes import wait_until

    settings.LLMGW_PASS_LOCK_TTL_S = 3.0
    taken = []

    def slow_pass(now):
        first = PassLock.objects.get(pk=1).expires_at
        taken.append(first)
        wait_until(lambda: PassLock.objects.get(pk=1).expires_at > first, timeout_s=60,
                   what="the holder to extend its lock")
        # Extended at about a third of the TTL: still live, so another worker cannot take it.
        assert PassLock.try_acquire("other:2", timezone.now(), 3.0) is None

    monkeypatch.setattr(reconciler, "run_pass", slow_pass)
    assert reconciler.reconcile("me:1") == 1
    lock = PassLock.objects.get(pk=1)
    assert taken and (lock.holder, lock.expires_at, lock.last_pass_holder) == ("", None, "me:1")


def test_a_stale_extension_of_a_released_lock_changes_nothing():
    now = timezone.now()
    PassLock.try_acquire("me:1", now, 10)
    PassLock.release_if_unchanged("me:1", 0, now)
    assert not PassLock.extend("me:1", now, 10)
    assert PassLock.objects.get(pk=1).expires_at is None


def test_the_watchdog_runs_a_pass_only_when_no_worker_leads(make_model):
    from fleet.models import LeaderLease
    from fleet.tasks import watchdog

    connected_agent()
    m = make_model("m", min_replicas=1)
    LeaderLease.take_or_renew("w1:1", timezone.now(), 60.0)
    assert watchdog() == 0 and not Replica.objects.filter(model=m).exists()
    LeaderLease.release("w1:1")
    assert watchdog() == 1 and Replica.objects.filter(model=m).count() == 1


# --- warm before demand (R11) ------------------------------------------------------------------

def _habit_now(weeks: int = 4):
    """An arrival profile asked for at this hour of the week for ``weeks`` weeks running,
    closed up to the hour before now (as passes would have left it)."""
    from datetime import UTC
    from zoneinfo import ZoneInfo

    from fleet.planning.warmth import ArrivalProfile, learn

    now = timezone.now()
    asked = [now - timedelta(days=7 * w) for w in range(1, weeks + 1)]
    return learn(ArrivalProfile(), asked, now.replace(minute=0, second=0, microsecond=0).astimezone(UTC),
                 ZoneInfo("UTC"))


def test_a_pass_keeps_an_on_demand_model_warm_on_its_habit_and_stores_why(make_model):
    from fleet.ops.explain import explain_model

    connected_agent()
    m = make_model("habit", on_demand=True, min_replicas=0, idle_timeout_s=600)
    ModelState.objects.create(model=m, arrivals=_habit_now().as_json())
    reconciler.run_pass()
    placed = Replica.objects.get(model=m)
    state = ModelState.objects.get(model=m)
    assert state.speculative and state.warm_ahead.startswith("kept warm: usually asked for")
    assert "warm until" in state.warm_ahead and state.warm_ahead in placed.reason + state.reason
    assert not state.unservable and state.wanted_at is None
    info = explain_model(m)["warmth"]
    assert info["speculative"] and info["now"] == state.warm_ahead
    assert info["prediction"]["usually_asked"] and info["prediction"]["now"].startswith("usually asked for")
    assert info["cold_start"]["samples"] == 0 and "not measured yet" in info["cold_start"]["text"]


def test_with_predictive_warmth_off_a_habit_places_nothing(make_model, cluster):
    cluster.predictive_warmth = False
    cluster.save()
    connected_agent()
    m = make_model("habit", on_demand=True, min_replicas=0)
    ModelState.objects.create(model=m, arrivals=_habit_now().as_json())
    reconciler.run_pass()
    assert not Replica.objects.filter(model=m).exists()
    assert not ModelState.objects.get(model=m).speculative


def test_a_pass_stores_the_profile_it_brought_up_to_now_and_the_measured_cold_start(make_model):
    from fleet.planning.warmth import ArrivalProfile, epoch_hour

    a = connected_agent()
    m = make_model("od", on_demand=True, min_replicas=0)
    for seconds in (20, 25, 30):
        Replica.objects.create(model=m, profile=m.profile, agent=a, state="stopped", cold_start_s=seconds,
                               cpu_cores=1, memory_mib=128)
    ModelState.objects.create(model=m, wanted_at=timezone.now())
    reconciler.run_pass()
    state = ModelState.objects.get(model=m)
    profile = ArrivalProfile.from_json(state.arrivals)
    assert profile.open_hour == epoch_hour(timezone.now()) and profile.open_asked
    assert state.cold_start_samples == 3 and 25 < state.cold_start_s <= 30
