"""Fleet's part of ``/metrics``: replicas by state, agents alive and models no pass has
looked at yet, read from the database at scrape time through the cluster read model
(``fleet.ops.cluster``; registered on ``llmgw.metrics.REGISTRY`` by ``FleetConfig.ready``)."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from fleet.ops import cluster as read
from llmgw.metrics import REGISTRY

_REPLICAS = ("llmgw_replicas", "Replicas by state (on a lost agent: the state the next reconcile pass gives them).")
#: The name is kept for dashboards already scraping it; it counts *alive* agents.
_AGENTS = ("llmgw_agents_connected",
           "Agents alive: connected and heard from within LLMGW_AGENT_LOST_AFTER.")
_NOT_LOOKED_AT = ("llmgw_models_not_looked_at", "Catalog models no reconcile pass has looked at yet.")


class FleetCollector:
    """Replicas by shown state, agents alive and models not looked at yet, read at scrape
    time with the same definitions as ``status``, the dashboard and ``explain``."""

    def describe(self):
        # Registration asks for a description; answering without the database keeps the
        # import free of queries (it happens in async code).
        yield GaugeMetricFamily(*_REPLICAS, labels=["state"])
        yield GaugeMetricFamily(*_AGENTS)
        yield GaugeMetricFamily(*_NOT_LOOKED_AT)

    def collect(self):
        at = read.moment()
        replicas = GaugeMetricFamily(*_REPLICAS, labels=["state"])
        for state, n in read.replicas_by_state(at).items():
            replicas.add_metric([state.value], n)
        yield replicas
        agents = GaugeMetricFamily(*_AGENTS)
        agents.add_metric([], read.agents_alive(at))
        yield agents
        not_looked_at = GaugeMetricFamily(*_NOT_LOOKED_AT)
        not_looked_at.add_metric([], read.models_not_looked_at())
        yield not_looked_at


def register() -> None:
    """Add the collector to the registry once (``ready()`` may run twice in tests)."""
    global _registered
    if not _registered:
        REGISTRY.register(FleetCollector())
        _registered = True


_registered = False
