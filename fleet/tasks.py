"""django-q2 tasks: the self-re-enqueuing reconcile tick, immediate passes and the
one-minute watchdog that restarts the tick chain (docs/architecture.md, "Decisions":
cadence is a self-re-enqueuing task plus a watchdog)."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db import connections
from django.db.models import Q
from django.utils import timezone
from django_q.models import Schedule
from django_q.tasks import async_task

from fleet.models import ControlPlane, PassLock, UsageReport
from fleet.control.reconciler import reconcile

log = logging.getLogger(__name__)

WATCHDOG_NAME = "llmgw reconcile watchdog"


def reconcile_now() -> int:
    """An immediate pass (somebody is waiting). Returns the passes run. Also revives the
    tick chain if it is not running, so periodic passes never wait for the watchdog."""
    passes = reconcile()
    watchdog()
    return passes


def tick() -> None:
    """A pass, then re-enqueue after the interval. A second chain (the watchdog restarted
    one that was only slow) notices the fresh ``last_tick_at`` and ends itself."""
    interval = settings.LLMGW_RECONCILE_INTERVAL_S
    now = timezone.now()
    PassLock.ensure()
    mine = PassLock.objects.filter(pk=1).filter(
        Q(last_tick_at__isnull=True) | Q(last_tick_at__lte=now - timedelta(seconds=interval * 0.5))
    ).update(last_tick_at=now)
    if not mine:
        return
    try:
        ControlPlane.heartbeat("worker")
        reconcile()
    finally:
        if not settings.Q_CLUSTER.get("sync"):  # inline tasks (tests) would chain forever
            time.sleep(interval)
            async_task("fleet.tasks.tick")


def forget_old_reports() -> int:
    """Drop usage reports of web processes gone for an hour and control planes silent for a
    day (every restart registers under a new pid). Returns the rows deleted."""
    now = timezone.now()
    gone, _ = UsageReport.objects.filter(reported_at__lt=now - timedelta(hours=1)).delete()
    silent, _ = ControlPlane.objects.filter(last_seen_at__lt=now - timedelta(days=1)).delete()
    return gone + silent


def watchdog() -> None:
    """Start the tick chain if it has not ticked for three intervals (and tidy up)."""
    forget_old_reports()
    PassLock.ensure()
    last = PassLock.objects.values_list("last_tick_at", flat=True).get(pk=1)
    late = timedelta(seconds=3 * settings.LLMGW_RECONCILE_INTERVAL_S + 5)
    if last is None or timezone.now() - last > late:
        log.info("reconcile tick chain not running: starting it")
        async_task("fleet.tasks.tick")


def schedules_table_ready(using: str = "default") -> bool:
    """Whether django-q's schedule table exists: ``migrate fleet`` alone on a new database
    (or ``migrate django_q zero``) sends fleet's post_migrate without it."""
    return Schedule._meta.db_table in connections[using].introspection.table_names()


def register_schedules(using: str = "default", **kwargs) -> None:
    """Create or update the watchdog schedule (connected to post_migrate)."""
    if not schedules_table_ready(using):
        return
    Schedule.objects.using(using).update_or_create(
        name=WATCHDOG_NAME,
        defaults={
            "func": "fleet.tasks.watchdog",
            "schedule_type": Schedule.MINUTES,
            "minutes": 1,
            "repeats": -1,
        },
    )
