"""A fleet simulator that drives the real planner: GPU-hours and SLO attainment from a trace.

Requests arrive from a trace (:mod:`fleet.simulation.traces`); simulated replicas start, serve and stop
on a simulated clock; the real ``fleet.planning.planner.plan()`` and load-scaling rules decide every
placement, eviction and scale step, called as the reconciler calls them. A day of a million
requests runs in well under a minute. Pure Python and numpy: no database (except
:func:`~fleet.simulation.catalog.catalog_from_db`), no processes, no GPUs.

    from fleet.simulation import SimConfig, parse_fleet, read_catalog, simulate
    from fleet.simulation.traces import read_trace

    report = simulate(read_catalog("catalog.json"), parse_fleet("8x8xH100-80G"), read_trace("day.jsonl"))
    report.totals["gpu_hours"], report.totals["slo_attainment"]

Parts: :mod:`.catalog` (models, latency model, cluster settings, fleet specs, catalog files),
:mod:`.engine` (the event loop and the in-memory shell, with :mod:`.runtime`, :mod:`.shortcuts`
and :mod:`.warming`), :mod:`.report` (report, baseline
comparison, plot), :mod:`.peers` (the policies of Ollama/llama-swap and Kubernetes' HPA with
KEDA, as controllers) and :mod:`.referee` (every policy on one trace). ``manage.py llmgw
simulate`` is the command line.
"""

from __future__ import annotations

from fleet.simulation.catalog import (
    AgentSpec,
    Catalog,
    ClusterSpec,
    LatencyModel,
    ModelSpec,
    catalog_from_db,
    catalog_from_dict,
    describe_fleet,
    fleet_from_db,
    grow_fleet,
    parse_fleet,
    peak_counts,
    read_catalog,
    static_catalog,
)
from fleet.simulation.config import SimConfig
from fleet.simulation.engine import Simulator
from fleet.simulation.report import Report, build_report, compare, plot
from fleet.simulation.traces import Trace

__all__ = [
    "AgentSpec", "Catalog", "ClusterSpec", "LatencyModel", "ModelSpec", "Report", "SimConfig", "Simulator",
    "baseline", "build_report", "catalog_from_db", "catalog_from_dict", "compare", "describe_fleet",
    "fleet_from_db", "grow_fleet", "parse_fleet", "peak_counts", "plot", "read_catalog", "simulate",
    "static_catalog",
]


def simulate(catalog: Catalog, fleet: tuple[AgentSpec, ...], trace: Trace, config: SimConfig = SimConfig(),
             label: str = "llmgw", history: Trace | None = None) -> Report:
    """Run ``trace`` through ``catalog`` on ``fleet``; the report (see :mod:`.report`).
    ``history``: requests before the trace, which the on-demand models' arrival profiles
    are learned from (predictive warmth, issue 18)."""
    return build_report(Simulator(catalog, fleet, trace, config, label, history=history).run())


def baseline(catalog: Catalog, fleet: tuple[AgentSpec, ...], trace: Trace, config: SimConfig = SimConfig(),
             count: int | None = None) -> Report:
    """The same trace on a static fleet: every model at ``count`` replicas, or (None) at
    the count its own peak needs (:func:`peak_counts`), never on demand, never scaled. The
    fleet grows by agents shaped like ``fleet``'s first ones until every replica fits."""
    counts = ({m.name: count for m in catalog.models} if count is not None else peak_counts(catalog, trace))
    static = static_catalog(catalog, counts)
    sized = grow_fleet(fleet, static.models, counts)
    label = f"static fleet of {count} per model" if count is not None else "static fleet sized for the peak"
    return simulate(static, sized, trace, config, label)
