"""History retention: old usage records, scaling events, GPU samples and ended replicas are deleted;
live replicas, recent rows and a zero (keep forever) setting are left alone."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.utils import timezone

from catalog.models import ClusterSettings
from fleet.models import Agent, GpuSample, OperatorAction, Replica, ScalingEvent, UsageReport
from gateway.models import UsageRecord
from llmgw import retention

pytestmark = [pytest.mark.django_db]


@pytest.fixture
def history(make_model):
    now = timezone.now()
    old, recent = now - timedelta(days=31), now - timedelta(days=29)
    model = make_model("m")
    agent = Agent.objects.create(name="a")
    replicas = {}
    for label, state, at in [("old-stopped", "stopped", old), ("old-failed", "failed", old),
                             ("old-ready", "ready", old), ("new-stopped", "stopped", recent)]:
        replicas[label] = Replica.objects.create(model=model, profile=model.profile, agent=agent, state=state,
                                                 state_changed_at=at)
    UsageReport.objects.create(process="web:1", replica=replicas["old-stopped"], reported_at=now)
    for at in (old, old, recent):
        UsageRecord.objects.create(at=at, model_name="m", path="chat/completions", status=200, total_ms=1)
        ScalingEvent.objects.create(model=model, at=at, from_replicas=1, to_replicas=2, reason="busy")
        GpuSample.objects.create(agent=agent, agent_name="a", index=0, at=at, memory_used_mib=10,
                                 memory_total_mib=100, utilisation_pct=50.0)
        OperatorAction.objects.create(at=at, actor="root (CLI)", action="cordon", target="a")
    return now, replicas


def test_history_older_than_the_retention_is_deleted(history):
    now, replicas = history
    assert retention.prune_history(now) == {"usage_records": 2, "scaling_events": 2, "replicas": 2,
                                            "gpu_samples": 2, "operator_actions": 2}
    assert set(Replica.objects.values_list("pk", flat=True)) == {replicas["old-ready"].pk, replicas["new-stopped"].pk}
    assert UsageRecord.objects.count() == 1 and ScalingEvent.objects.count() == 1 and GpuSample.objects.count() == 1
    assert not UsageReport.objects.exists()  # went with its replica
    assert retention.prune_history(now) == {"usage_records": 0, "scaling_events": 0, "replicas": 0,
                                            "gpu_samples": 0, "operator_actions": 0}


def test_zero_days_keeps_everything(history):
    now, _ = history
    ClusterSettings.objects.filter(pk=ClusterSettings.get_solo().pk).update(history_retention_days=0)
    assert retention.prune_history(now + timedelta(days=3650)) == {"usage_records": 0, "scaling_events": 0,
                                                                  "replicas": 0, "gpu_samples": 0, "operator_actions": 0}
    assert UsageRecord.objects.count() == 3 and ScalingEvent.objects.count() == 3 and Replica.objects.count() == 4


def test_a_backlog_is_deleted_in_bounded_runs(make_model, monkeypatch):
    monkeypatch.setattr(retention, "BATCH_ROWS", 7)
    old = timezone.now() - timedelta(days=40)
    UsageRecord.objects.bulk_create([UsageRecord(at=old, model_name="m", path="completions", status=200, total_ms=1)
                                     for _ in range(25)])
    assert retention.prune_history(max_rows=20)["usage_records"] == 20
    assert retention.prune_history(max_rows=20)["usage_records"] == 5
    assert not UsageRecord.objects.exists()


def test_a_run_stops_at_its_time_budget_and_the_next_goes_on(make_model, monkeypatch):
    monkeypatch.setattr(retention, "BATCH_ROWS", 10)
    old = timezone.now() - timedelta(days=40)
    UsageRecord.objects.bulk_create([UsageRecord(at=old, model_name="m", path="completions", status=200, total_ms=1)
                                     for _ in range(30)])
    clock = itertools.count()  # every look at the clock: one second later
    monkeypatch.setattr(retention.time, "monotonic", lambda: float(next(clock)))
    # Clock reads: the deadline (0 s), scaling events (1 s), replicas (2 s), then one per
    # batch of usage records: 3 s and 4 s fit in a 4.5 s budget, 5 s does not.
    assert retention.prune_history(budget_s=4.5)["usage_records"] == 20
    assert retention.prune_history(budget_s=4.5)["usage_records"] == 10
    assert not UsageRecord.objects.exists()


def test_migrating_registers_the_hourly_schedule():
    from django_q.models import Schedule

    schedule = Schedule.objects.get(name=retention.SCHEDULE_NAME)
    assert schedule.func == "llmgw.retention.prune_history" and schedule.schedule_type == Schedule.HOURLY


def test_migrating_fleet_alone_on_a_new_database_does_not_trip_on_the_missing_schedule_table(tmp_path):
    """``migrate fleet`` sends fleet's post_migrate before django-q's tables may exist."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "LLMGW_DATA_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "llmgw.settings"}
    env.pop("LLMGW_DATABASE_URL", None)
    env.pop("LLMGW_SQLITE_PATH", None)
    for argv in (["migrate", "fleet"], ["migrate"]):
        done = subprocess.run([sys.executable, "manage.py", *argv], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
    # Once django-q's tables exist, the full migrate registers the schedule there.
    import sqlite3

    with sqlite3.connect(tmp_path / "llmgw.sqlite3") as db:
        rows = db.execute("SELECT func FROM django_q_schedule WHERE name = ?", (retention.SCHEDULE_NAME,)).fetchall()
    assert rows == [("llmgw.retention.prune_history",)]


def test_a_retention_beyond_a_century_is_refused_and_never_overflows():
    from django.core.exceptions import ValidationError

    cluster = ClusterSettings.get_solo()
    cluster.history_retention_days = 999_999
    with pytest.raises(ValidationError):
        cluster.full_clean()
    ClusterSettings.objects.filter(pk=cluster.pk).update(history_retention_days=999_999)  # set around the admin
    UsageRecord.objects.create(at=timezone.now() - timedelta(days=3650), model_name="m", path="chat/completions",
                               status=200, total_ms=1)
    assert retention.prune_history() == {"usage_records": 0, "scaling_events": 0, "replicas": 0, "gpu_samples": 0, "operator_actions": 0}
    assert UsageRecord.objects.count() == 1  # ten years old, inside a century: kept
