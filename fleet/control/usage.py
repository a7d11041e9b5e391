"""Usage reports from the web processes: last use (forwards only) and in-flight counts;
and their admission queues' depths (``QueueReport``).

The rules of docs/architecture.md, R6: a late or duplicate report never moves a time backwards; a
replica missing from a report keeps its time; never told (None) is not idle; use keeps an
on-demand model's demand alive, so its idle timeout counts from the last request.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from catalog.models import Model
from fleet.models import ModelState, QueueReport, Replica, UsageReport
from fleet.states import ReplicaState


def advance(current: datetime | None, reported: datetime | None) -> datetime | None:
    """The later of two last-use times; ``None`` (never told) only while nothing was told."""
    if reported is None:
        return current
    if current is None or reported > current:
        return reported
    return current


def merge_last_used(current: dict[int, datetime | None], report: dict[int, datetime | None]) -> dict[int, datetime | None]:
    """Pure form of the rule the database applies: every replica keeps its time unless the
    report moves it forwards; replicas absent from the report are untouched."""
    merged = dict(current)
    for replica_id, reported in report.items():
        if replica_id in merged:
            merged[replica_id] = advance(merged[replica_id], reported)
    return merged


def record_report(process: str, report: dict[int, tuple[int, datetime | None]]) -> None:
    """Store one web process's report: ``{replica_id: (in_flight, last_used_at or None)}``."""
    now = timezone.now()
    existing = set(Replica.objects.filter(pk__in=report).values_list("pk", flat=True))
    latest_by_model: dict[int, tuple[datetime, int]] = {}
    model_of = dict(Replica.objects.filter(pk__in=existing).values_list("pk", "model_id"))
    with transaction.atomic():
        for replica_id, (in_flight, last_used) in report.items():
            if replica_id not in existing:
                continue
            UsageReport.objects.update_or_create(
                process=process, replica_id=replica_id,
                defaults={"in_flight": in_flight, "reported_at": now,
                          **({"last_used_at": last_used} if last_used else {})},
            )
            if last_used is not None:
                record_last_use(replica_id, last_used)
                model_id = model_of[replica_id]
                if model_id not in latest_by_model or last_used > latest_by_model[model_id][0]:
                    latest_by_model[model_id] = (last_used, replica_id)
        for model_id, (used, replica_id) in latest_by_model.items():
            keep_demand_alive(model_id, used, replica_id)


def record_last_use(replica_id: int, used_at: datetime) -> bool:
    """Move a replica's last use forwards to ``used_at``; never backwards."""
    return bool(
        Replica.objects.filter(pk=replica_id)
        .filter(Q(last_used_at__isnull=True) | Q(last_used_at__lt=used_at))
        .update(last_used_at=used_at)
    )


def keep_demand_alive(model_id: int, used_at: datetime, replica_id: int | None = None) -> bool:
    """Use of a wanted model moves its ``wanted_at`` forwards. A model whose demand a pass
    has just ended is wanted again if a replica still ready or draining served a request:
    it was routed before the drain (reports land up to a flush interval late), so the idle
    verdict was made without it — and the planner cancels the drain."""
    moved = ModelState.objects.filter(model_id=model_id, wanted_at__isnull=False, wanted_at__lt=used_at).update(
        wanted_at=used_at)
    if moved or replica_id is None:
        return bool(moved)
    warm = Replica.objects.filter(pk=replica_id, model__on_demand=True).in_states(
        {ReplicaState.READY, ReplicaState.DRAINING}).exists()
    if not warm:
        return False
    return bool(ModelState.objects.filter(model_id=model_id, wanted_at__isnull=True).update(wanted_at=used_at))


def record_queue_report(process: str, depths: dict[int, int]) -> None:
    """Store one web process's admission-queue depths, ``{model_id: waiting}``, stamped now:
    a non-zero depth is written (one upsert for them all), a zero deletes the row; models
    deleted meanwhile are skipped. Three queries at most, however many models."""
    now = timezone.now()
    busy = [model_id for model_id, depth in depths.items() if depth > 0]
    empty = [model_id for model_id, depth in depths.items() if depth <= 0]
    existing = set(Model.objects.filter(pk__in=busy).values_list("pk", flat=True)) if busy else set()
    waiting = [QueueReport(process=process, model_id=model_id, waiting=depths[model_id], reported_at=now)
               for model_id in busy if model_id in existing]
    if waiting:
        QueueReport.objects.bulk_create(waiting, update_conflicts=True, unique_fields=["process", "model"],
                                        update_fields=["waiting", "reported_at"])
    if empty:
        QueueReport.objects.filter(process=process, model_id__in=empty).delete()
