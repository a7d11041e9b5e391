"""How long history is kept: usage records (``gateway``), scaling events and replicas that
ended (``fleet``). Lives in the project package because it touches both apps, which import
nothing from each other. Run hourly by django-q (:func:`register_schedule`)."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.db import models
from django.utils import timezone
from django_q.models import Schedule

from catalog.models import ClusterSettings
from fleet.models import GpuSample, OperatorAction, Replica, ScalingEvent
from fleet.states import ENDED
from fleet.tasks import schedules_table_ready
from gateway.models import UsageRecord

log = logging.getLogger(__name__)

SCHEDULE_NAME = "llmgw history retention"
#: Rows deleted per statement: short transactions, so SQLite's single writer (the web
#: process's usage flush, agent reports) never waits long behind a prune.
BATCH_ROWS = 2000
#: Seconds one run may spend deleting, inside django-q's 60 s task timeout; a backlog
#: larger than that (millions of rows) is worked off over the next hourly runs.
TIME_BUDGET_S = 40.0


def _delete_in_batches(queryset: models.QuerySet, deadline: float, limit: int | None) -> int:
    deleted = 0
    while (limit is None or deleted < limit) and time.monotonic() < deadline:
        size = BATCH_ROWS if limit is None else min(BATCH_ROWS, limit - deleted)
        pks = list(queryset.order_by().values_list("pk", flat=True)[:size])
        if not pks:
            break
        queryset.model.objects.filter(pk__in=pks).delete()
        deleted += len(pks)
    return deleted


def prune_history(now: datetime | None = None, max_rows: int | None = None,
                  budget_s: float = TIME_BUDGET_S) -> dict[str, int]:
    """Delete history older than ``ClusterSettings.history_retention_days`` (0 keeps all),
    in batches, for at most ``budget_s`` seconds (and ``max_rows`` per table, if given).

    Returns ``{"usage_records": n, "scaling_events": n, "replicas": n, "gpu_samples": n,
    "operator_actions": n}``, rows deleted. Only
    replicas that ended (stopped, failed) go; the reconciler looks back one hour for crash
    loops, far inside the shortest retention (one day)."""
    days = ClusterSettings.get_solo().history_retention_days
    counts = {"usage_records": 0, "scaling_events": 0, "replicas": 0, "gpu_samples": 0, "operator_actions": 0}
    if not days:
        return counts
    cutoff = (now or timezone.now()) - timedelta(days=min(days, 36500))  # a century: nothing to prune
    deadline = time.monotonic() + budget_s
    # Scaling events and replicas first: few rows; usage records may be millions.
    counts["scaling_events"] = _delete_in_batches(ScalingEvent.objects.filter(at__lt=cutoff), deadline, max_rows)
    counts["replicas"] = _delete_in_batches(
        Replica.objects.in_states(ENDED).filter(state_changed_at__lt=cutoff), deadline, max_rows)
    counts["usage_records"] = _delete_in_batches(UsageRecord.objects.filter(at__lt=cutoff), deadline, max_rows)
    counts["gpu_samples"] = _delete_in_batches(GpuSample.objects.filter(at__lt=cutoff), deadline, max_rows)
    counts["operator_actions"] = _delete_in_batches(OperatorAction.objects.filter(at__lt=cutoff), deadline, max_rows)
    if any(counts.values()):
        log.info("history older than %d days deleted: %s", days, counts)
    return counts


def register_schedule(using: str = "default", **kwargs) -> None:
    """Create or update the hourly retention schedule (connected to post_migrate)."""
    if not schedules_table_ready(using):
        return
    Schedule.objects.using(using).update_or_create(
        name=SCHEDULE_NAME,
        defaults={"func": "llmgw.retention.prune_history", "schedule_type": Schedule.HOURLY, "repeats": -1},
    )
