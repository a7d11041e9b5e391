"""Fleet's part of ``/metrics``: replicas by state and agents connected, read from the
database at scrape time (registered on ``llmgw.metrics.REGISTRY`` by ``FleetConfig.ready``)."""

from __future__ import annotations

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily

from fleet.models import Agent, Replica
from llmgw.metrics import REGISTRY


class FleetCollector:
    """Replicas by state and agents connected, read from the database at scrape time."""

    def describe(self):
        # Registration asks for a description; answering without the database keeps the
        # import free of queries (it happens in async code).
        yield GaugeMetricFamily("llmgw_replicas", "Replicas by state.", labels=["state"])
        yield GaugeMetricFamily("llmgw_agents_connected", "Agents with an open websocket.")

    def collect(self):
        replicas = GaugeMetricFamily("llmgw_replicas", "Replicas by state.", labels=["state"])
        counts = dict(Replica.objects.exclude(state="stopped").values_list("state").annotate(n=Count("id")))
        for state in ("placing", "downloading", "starting", "ready", "draining", "stopping", "failed", "lost"):
            replicas.add_metric([state], counts.get(state, 0))
        yield replicas
        agents = GaugeMetricFamily("llmgw_agents_connected", "Agents with an open websocket.")
        agents.add_metric([], Agent.objects.filter(connected=True).count())
        yield agents


def register() -> None:
    """Add the collector to the registry once (``ready()`` may run twice in tests)."""
    global _registered
    if not _registered:
        REGISTRY.register(FleetCollector())
        _registered = True


_registered = False
