"""The control plane's own processes, as the ``ControlPlane`` and ``PassLock`` rows see them:
each process's name on the pass lock, and since when the web processes could hear agents.

Web processes register every ``LLMGW_CONTROL_PLANE_HEARTBEAT`` (``fleet.live.watch``);
the worker reads the rows here for the lost-agent rule (docs/architecture.md, "Reconciler
rules": an agent is not blamed for a silence nobody could hear).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from llmgw.process_name import process_name
from fleet.models import ControlPlane


def holder_id() -> str:
    """This process's name on the pass lock (``llmgw.process_name``: ``host:pid``, read per
    call, since django-q2 forks its workers after import)."""
    return process_name()


def listening_since(now: datetime) -> datetime | None:
    """Since when the web processes could record heartbeats without a gap, for the
    lost-agent rule (``planner.Policy.listening_since``).

    Each web process re-registers every ``LLMGW_CONTROL_PLANE_HEARTBEAT`` and restarts its
    row's ``started_at`` after a gap (``fleet.live.watch``). None when no web process ever
    registered; ``now`` when none has registered lately (all stalled, or the database was
    away): nobody could hear the agents, so nobody is blamed.
    """
    fresh_after = now - timedelta(seconds=control_plane_stall_s())
    rows = list(ControlPlane.objects.filter(role=ControlPlane.Role.WEB).values_list("started_at", "last_seen_at"))
    if not rows:
        return None
    fresh = [started for started, seen in rows if seen >= fresh_after]
    return max(fresh) if fresh else now


def control_plane_stall_s() -> float:
    """A control plane not heard from for this long was stalled (or is gone)."""
    return 2 * settings.LLMGW_CONTROL_PLANE_HEARTBEAT_S + 1.0
