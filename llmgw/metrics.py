"""The process's Prometheus registry, which ``/metrics`` renders.

Each app adds its own metrics to :data:`REGISTRY`: the gateway its request counters and
histograms (``gateway.metrics``), fleet a collector that reads the cluster at scrape time
(``fleet.ops.metrics``, registered when the app is ready). Neither imports the other.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

REGISTRY = CollectorRegistry(auto_describe=True)


def render() -> bytes:
    """Every registered metric in Prometheus' text format (the body of ``/metrics``)."""
    return generate_latest(REGISTRY)
