"""django-q2 tasks: immediate passes, and the one-minute watchdog that tidies up and runs a
pass when no worker leads (docs/architecture.md, "Decisions": the leader is a lease; the
cadence itself is the leader loop's, ``fleet.control.leader``)."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import connections
from django.utils import timezone
from django_q.models import Schedule

from fleet.models import ControlPlane, LeaderLease, QueueReport, UsageReport
from fleet.control.reconciler import reconcile

log = logging.getLogger(__name__)

WATCHDOG_NAME = "llmgw reconcile watchdog"


def reconcile_now() -> int:
    """An immediate pass (somebody is waiting). Returns the passes run (0 when another
    process holds the pass lock: it sees the request and runs again)."""
    return reconcile()


def forget_old_reports() -> int:
    """Drop usage and queue reports of web processes gone for an hour and control planes
    silent for a day (every restart registers under a new pid). Returns the rows deleted."""
    now = timezone.now()
    gone, _ = UsageReport.objects.filter(reported_at__lt=now - timedelta(hours=1)).delete()
    queues, _ = QueueReport.objects.filter(reported_at__lt=now - timedelta(hours=1)).delete()
    silent, _ = ControlPlane.objects.filter(last_seen_at__lt=now - timedelta(days=1)).delete()
    return gone + queues + silent


def watchdog() -> int:
    """Once a minute: forget old rows, and run a pass if no worker holds the leader lease
    (workers started as plain ``qcluster``, without ``llmgw worker``'s leader loop, still
    get a pass a minute and a warning). Returns the passes run."""
    forget_old_reports()
    if LeaderLease.leader(timezone.now()):
        return 0
    log.warning("no worker holds the leader lease (is every worker started with `llmgw worker`?): running a pass")
    return reconcile()


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
