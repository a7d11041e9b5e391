"""Fleet's part of ``/metrics``, read from the database at scrape time through the cluster
read model (``fleet.ops.cluster``; registered on ``llmgw.metrics.REGISTRY`` by
``FleetConfig.ready``): replicas by their current state (overall and per model), outdated
replicas, scaling steps, crash loops and failures, agents alive and their heartbeat age,
each GPU's last reading, and models no pass has looked at yet.

Labels are bounded: models, agents and GPUs are rows of the catalog and the fleet, states
and directions are fixed sets; ended replicas (stopped, failed) are history and make no
series. A scrape costs about a dozen queries, whatever the size of the fleet. While the
database cannot be reached these series are left out (no stale figure is served) and the
scrape says so (``llmgw_metrics_database_up 0``, ``llmgw.metrics.read_database``)."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from fleet.ops import cluster as read
from fleet.states import LIVE, ReplicaState
from llmgw.metrics import REGISTRY, read_database

#: The states ``llmgw_replicas`` reports, zeros included, in the enum's order.
LIVE_STATES = tuple(s for s in ReplicaState if s in LIVE)

_REPLICAS = ("llmgw_replicas", ("Live replicas by state (ended ones, stopped or failed, are history and not counted; on "
             "a lost agent: the state the next reconcile pass gives them)."))
_MODEL_REPLICAS = ("llmgw_model_replicas", "Live replicas of each model by state (as llmgw_replicas).")
_OUTDATED = ("llmgw_replicas_outdated", "Live replicas started from a spec their model no longer has (being replaced).")
_SCALING = ("llmgw_scaling_steps_last_hour", ("Load-scaling steps of each model in the last hour, by direction (up, "
            "down)."))
_CRASH_LOOP = ("llmgw_model_crash_loop", ("1 while the last reconcile pass found the model in a crash loop (its "
               "replicas keep failing; the next start waits out a backoff), else 0."))
_FAILURES = ("llmgw_replica_failures_last_hour", "Replicas of each model that failed in the last hour.")
#: The name is kept for dashboards already scraping it; it counts *alive* agents.
_AGENTS = ("llmgw_agents_connected",
           "Agents alive: connected and heard from within LLMGW_AGENT_LOST_AFTER.")
_HEARTBEAT_AGE = ("llmgw_agent_heartbeat_age_seconds", "Seconds since the control plane last heard from the agent.")
_GPU_UTILISATION = ("llmgw_gpu_utilisation_ratio", ("The GPU's compute utilisation at its last reading (0-1), for "
                    "agents heard from."))
_GPU_MEMORY_USED = ("llmgw_gpu_memory_used_bytes", "The GPU's memory in use at its last reading.")
_GPU_MEMORY_TOTAL = ("llmgw_gpu_memory_total_bytes", "The GPU's memory.")
_GPU_TEMPERATURE = ("llmgw_gpu_temperature_celsius", "The GPU die's temperature at its last reading.")
_NOT_LOOKED_AT = ("llmgw_models_not_looked_at", "Catalog models no reconcile pass has looked at yet.")

MIB = 1024 * 1024
_GPU_LABELS = ["agent", "gpu"]


class FleetCollector:
    """Fleet gauges read at scrape time with the same definitions as ``status``, the
    dashboard and ``explain`` (see the module's docstring)."""

    def describe(self):
        # Registration asks for a description; answering without the database keeps the
        # import free of queries (it happens in async code).
        yield GaugeMetricFamily(*_REPLICAS, labels=["state"])
        yield GaugeMetricFamily(*_MODEL_REPLICAS, labels=["model", "state"])
        yield GaugeMetricFamily(*_OUTDATED, labels=["model"])
        yield GaugeMetricFamily(*_SCALING, labels=["model", "direction"])
        yield GaugeMetricFamily(*_CRASH_LOOP, labels=["model"])
        yield GaugeMetricFamily(*_FAILURES, labels=["model"])
        yield GaugeMetricFamily(*_AGENTS)
        yield GaugeMetricFamily(*_HEARTBEAT_AGE, labels=["agent"])
        for family in (_GPU_UTILISATION, _GPU_MEMORY_USED, _GPU_MEMORY_TOTAL, _GPU_TEMPERATURE):
            yield GaugeMetricFamily(*family, labels=_GPU_LABELS)
        yield GaugeMetricFamily(*_NOT_LOOKED_AT)

    def collect(self):
        # Read whole before yielding: a database lost halfway leaves out every fleet series,
        # never some of them.
        yield from read_database(lambda: list(self._read())) or ()

    def _read(self):
        at = read.moment()
        yield from self._replicas(at)
        since = at.now - read.METRICS_WINDOW
        yield _by_model(_OUTDATED, read.outdated_by_model())
        scaling = GaugeMetricFamily(*_SCALING, labels=["model", "direction"])
        for (model, direction), n in sorted(read.scaling_steps_by_model(since).items()):
            scaling.add_metric([model, direction], n)
        yield scaling
        loops = read.crash_loops_by_model()
        yield _by_model(_CRASH_LOOP, {m: int(looping) for m, looping in loops.items()})
        failures = dict.fromkeys(loops, 0)  # every catalog model, and deleted ones that failed lately
        failures.update(read.failures_by_model(since))
        yield _by_model(_FAILURES, failures)
        agents = GaugeMetricFamily(*_AGENTS)
        agents.add_metric([], read.agents_alive(at))
        yield agents
        ages = GaugeMetricFamily(*_HEARTBEAT_AGE, labels=["agent"])
        for agent, age_s in sorted(read.heartbeat_ages_s(at).items()):
            ages.add_metric([agent], round(age_s, 3))
        yield ages
        yield from self._gpus(at)
        not_looked_at = GaugeMetricFamily(*_NOT_LOOKED_AT)
        not_looked_at.add_metric([], read.models_not_looked_at())
        yield not_looked_at

    @staticmethod
    def _replicas(at: read.Moment):
        by_model = read.live_replicas_by_model(at)
        totals = dict.fromkeys(LIVE_STATES, 0)
        per_model = GaugeMetricFamily(*_MODEL_REPLICAS, labels=["model", "state"])
        for (model, state), n in sorted(by_model.items(), key=lambda item: (item[0][0], item[0][1].value)):
            totals[state] += n
            per_model.add_metric([model, state.value], n)
        replicas = GaugeMetricFamily(*_REPLICAS, labels=["state"])
        for state, n in totals.items():
            replicas.add_metric([state.value], n)
        yield replicas
        yield per_model

    @staticmethod
    def _gpus(at: read.Moment):
        families = {name: GaugeMetricFamily(*name, labels=_GPU_LABELS)
                    for name in (_GPU_UTILISATION, _GPU_MEMORY_USED, _GPU_MEMORY_TOTAL, _GPU_TEMPERATURE)}
        for gpu in read.gpu_readings(at):
            labels = [gpu.agent, str(gpu.index)]
            families[_GPU_MEMORY_USED].add_metric(labels, gpu.memory_used_mib * MIB)
            families[_GPU_MEMORY_TOTAL].add_metric(labels, gpu.memory_total_mib * MIB)
            if gpu.utilisation_pct is not None:  # unknown is absent, never 0
                families[_GPU_UTILISATION].add_metric(labels, gpu.utilisation_pct / 100)
            if gpu.temperature_c is not None:
                families[_GPU_TEMPERATURE].add_metric(labels, gpu.temperature_c)
        yield from families.values()


def _by_model(family: tuple[str, str], values: dict[str, float]) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(*family, labels=["model"])
    for model, value in sorted(values.items()):
        gauge.add_metric([model], value)
    return gauge


def register() -> None:
    """Add the collector to the registry once (``ready()`` may run twice in tests)."""
    global _registered
    if not _registered:
        REGISTRY.register(FleetCollector())
        _registered = True


_registered = False
