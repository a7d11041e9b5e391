"""Usage reports: forwards only, absent keeps its time, never told is not idle, and use
keeps an on-demand model's demand alive."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone as tz

import pytest
from django.utils import timezone

from catalog.models import Model
from fleet.models import Agent, ModelState, Replica, UsageReport
from fleet.control.snapshot import fresh_in_flight
from fleet.control.usage import advance, merge_last_used, record_report

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=tz.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_late_report_never_moves_a_time_backwards():
    assert advance(at(10), at(5)) == at(10)
    assert advance(at(10), at(15)) == at(15)


def test_a_duplicate_report_changes_nothing():
    state = merge_last_used({1: at(10)}, {1: at(10)})
    assert merge_last_used(state, {1: at(10)}) == {1: at(10)}


def test_a_replica_absent_from_a_report_keeps_its_time():
    assert merge_last_used({1: at(10), 2: at(20)}, {1: at(30)}) == {1: at(30), 2: at(20)}


def test_a_restarted_router_that_reports_nothing_changes_nothing():
    assert merge_last_used({1: at(10), 2: None}, {}) == {1: at(10), 2: None}


def test_never_told_stays_distinct_from_idle():
    assert merge_last_used({1: None}, {1: None}) == {1: None}
    assert merge_last_used({1: None}, {1: at(1)}) == {1: at(1)}


@pytest.fixture
def replica(make_model):
    m = make_model("od", min_replicas=0, on_demand=True)
    agent = Agent.objects.create(name="a", connected=True)
    return Replica.objects.create(model=m, profile=m.profile, agent=agent, state="ready", port=1)


def test_reports_in_the_database_only_move_forwards(replica):
    now = timezone.now()
    record_report("web-1", {replica.pk: (0, now)})
    record_report("web-2", {replica.pk: (0, now - timedelta(seconds=30))})  # late, from another process
    replica.refresh_from_db()
    assert replica.last_used_at == now


def test_use_keeps_a_wanted_models_demand_alive(replica):
    first = timezone.now() - timedelta(minutes=5)
    ModelState.objects.create(model=replica.model, wanted_at=first)
    later = timezone.now()
    record_report("web-1", {replica.pk: (1, later)})
    assert ModelState.objects.get(model=replica.model).wanted_at == later


def test_use_of_a_warm_on_demand_replica_is_demand_even_after_a_pass_ended_it(replica):
    ModelState.objects.create(model=replica.model, wanted_at=None)  # a pass just judged it idle
    used = timezone.now()
    record_report("web-1", {replica.pk: (0, used)})  # ... but it served a request meanwhile
    assert ModelState.objects.get(model=replica.model).wanted_at == used


def test_use_does_not_make_an_ordinary_model_on_demand(replica):
    Model.objects.filter(pk=replica.model_id).update(on_demand=False, min_replicas=1)
    ModelState.objects.create(model=replica.model, wanted_at=None)
    record_report("web-1", {replica.pk: (0, timezone.now())})
    assert ModelState.objects.get(model=replica.model).wanted_at is None


def test_in_flight_is_the_sum_of_fresh_reports_and_unknown_without_one(replica, settings):
    now = timezone.now()
    record_report("web-1", {replica.pk: (2, now)})
    record_report("web-2", {replica.pk: (3, None)})
    assert fresh_in_flight(timezone.now()) == {replica.pk: 5}
    UsageReport.objects.update(reported_at=now - timedelta(seconds=settings.LLMGW_USAGE_REPORT_FRESH_S + 1))
    assert fresh_in_flight(timezone.now()) == {}


# --- admission-queue depths ------------------------------------------------------------------

@pytest.mark.django_db
def test_queue_depths_are_upserted_per_process_and_an_empty_queue_deletes_its_row(make_model,
                                                                                 django_assert_max_num_queries):
    from fleet.control.usage import record_queue_report
    from fleet.models import QueueReport

    a, b = make_model("a"), make_model("b")
    record_queue_report("web:1", {a.pk: 3, b.pk: 1})
    record_queue_report("web:2", {a.pk: 2})
    first = QueueReport.objects.get(process="web:1", model=a).reported_at
    with django_assert_max_num_queries(3):  # the models that exist, one upsert, one delete
        record_queue_report("web:1", {a.pk: 5, b.pk: 0, 999_999: 7})  # 999999: deleted meanwhile
    rows = sorted(QueueReport.objects.values_list("process", "model_id", "waiting"))
    assert rows == [("web:1", a.pk, 5), ("web:2", a.pk, 2)]
    assert QueueReport.objects.get(process="web:1", model=a).reported_at >= first
    assert QueueReport.objects.waiting_by_model() == {a.pk: 7}
