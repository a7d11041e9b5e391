"""The control plane's own processes, as the ``ControlPlane`` and ``PassLock`` rows see them:
each process's name on the pass lock, since when the web processes could hear agents, and
each web process's place among the live ones (how they split a model's capacity).

Web processes register every ``LLMGW_CONTROL_PLANE_HEARTBEAT`` (``fleet.live.watch``);
the worker reads the rows here for the lost-agent rule (docs/architecture.md, "Reconciler
rules": an agent is not blamed for a silence nobody could hear).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple

from django.conf import settings

from llmgw.process_name import process_name, this_process
from fleet.models import ControlPlane


def holder_id() -> str:
    """This process's name on the pass lock (``llmgw.process_name``: ``host:pid``, read per
    call, since django-q2 forks its workers after import)."""
    return process_name()


class WebPlane(NamedTuple):
    """One web process's ``ControlPlane`` row, as :func:`web_planes` reads it."""

    host: str
    pid: int
    started_at: datetime
    last_seen_at: datetime


def web_planes() -> list[WebPlane]:
    """Every registered web process (one query), for :func:`listening_since` and
    :func:`web_slot` to share in one refresh."""
    return [WebPlane(*row) for row in ControlPlane.objects.filter(role=ControlPlane.Role.WEB).values_list(
        "host", "pid", "started_at", "last_seen_at")]


def listening_since(now: datetime, rows: list[WebPlane] | None = None) -> datetime | None:
    """Since when the web processes could record heartbeats without a gap, for the
    lost-agent rule (``planner.Policy.listening_since``), from ``rows`` (default: read
    now, :func:`web_planes`).

    Each web process re-registers every ``LLMGW_CONTROL_PLANE_HEARTBEAT`` and restarts its
    row's ``started_at`` after a gap (``fleet.live.watch``). None when no web process ever
    registered; ``now`` when none has registered lately (all stalled, or the database was
    away): nobody could hear the agents, so nobody is blamed.
    """
    fresh_after = now - timedelta(seconds=control_plane_stall_s())
    rows = web_planes() if rows is None else rows
    if not rows:
        return None
    fresh = [row.started_at for row in rows if row.last_seen_at >= fresh_after]
    return max(fresh) if fresh else now


def control_plane_stall_s() -> float:
    """A control plane not heard from for this long was stalled (or is gone)."""
    return 2 * settings.LLMGW_CONTROL_PLANE_HEARTBEAT_S + 1.0


def web_slot(now: datetime, rows: list[WebPlane] | None = None, me: tuple[str, int] | None = None) -> tuple[int, int]:
    """``(index, count)`` of this web process (``me``, default ``this_process()``) among
    the live web processes, ordered by (host, pid): those of ``rows`` (default: read now,
    :func:`web_planes`) heard from within :func:`control_plane_stall_s`, the freshness
    that makes a control plane live for :func:`listening_since` and ``status``. A process
    not registered yet (its first refresh runs before its first registration), or whose
    row went stale, counts itself in at the place it will have, so ``count`` is at least 1."""
    me = me or this_process()
    fresh_after = now - timedelta(seconds=control_plane_stall_s())
    rows = web_planes() if rows is None else rows
    ordered = sorted({(row.host, row.pid) for row in rows if row.last_seen_at >= fresh_after} | {me})
    return ordered.index(me), len(ordered)
