"""Rows for tests on the database: a connected agent heard from a given time ago, a
replica of a model on it (one core, 128 MiB, port 20001)."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from fleet.models import Agent, Replica


def agent(name: str, seen_s_ago: float = 0.5) -> Agent:
    """A connected agent named ``name`` (4 cores, 8192 MiB, on 127.0.0.1), last heard from
    ``seen_s_ago`` seconds ago."""
    return Agent.objects.create(name=name, connected=True, last_seen_at=timezone.now() - timedelta(seconds=seen_s_ago),
                                cpu_cores=4, memory_mib=8192, address="127.0.0.1")


def replica(model, on: Agent, state: str = "ready", **kw) -> Replica:
    """A replica of ``model`` on agent ``on`` in ``state`` (port 20001, 1 core, 128 MiB);
    ``kw`` sets any other field (``ready_at``, ``reason``, ...)."""
    return Replica.objects.create(model=model, profile=model.profile, agent=on, state=state, port=20001, cpu_cores=1,
                                  memory_mib=128, **kw)
