"""What the simulator simulates: models with their latency model, cluster settings, a fleet.

Catalog file (JSON, or YAML when PyYAML is installed) — a list of models, or an object::

    {"cluster": {"time_zone": "Europe/Istanbul", "default_idle_timeout_s": 600, ...},
     "fleet": "8x8xH100-80G",
     "models": [
       {"name": "llama-3-70b", "gpus_needed": 2, "gpu_memory_mib": 81920,
        "min": 1, "max": 6, "on_demand": false, "idle_timeout_s": null, "cold_start_s": 120,
        "windows": [{"weekdays": "mon-fri", "start": "09:00", "end": "18:00", "min": 2, "max": 6}],
        "benchmark": {"max_concurrency": 16, "slo_ttft_p95_ms": 800, "slo_tpot_p95_ms": 40},
        "latency": {"ttft_base_ms": 60, "prefill_ms_per_token": 0.08, "tpot_ms": 35},
        "engine_metrics": true, "routing_policy": "prefix-affinity", "prefix_cache_slots": 4}]}

Only ``name`` is required. ``cluster`` keys are :class:`ClusterSpec`'s fields. Without a
``benchmark`` a model gets the stated defaults of :class:`LatencyModel` and the planner
gets no measured capacity (as for a model never benchmarked).

Prefix caches (issue 17; they matter only for a trace whose requests carry prefixes, see
:mod:`fleet.simulation.traces`): ``routing_policy`` is how the simulated gateway chooses
among a model's ready replicas — ``least-loaded`` (the default), ``prefix-affinity`` or
``session``, the names of ``fleet.planning.routing`` and ``catalog.models.RoutingPolicy``
(from the database, ``Model.routing_policy``). ``prefix_cache_slots`` is how many prefixes
one replica keeps cached, least recently used out first (default
:data:`PREFIX_CACHE_SLOTS`; 0: no cache). A request whose prefix its replica holds skips
the prefix's prefill: its TTFT and duration shrink by ``prefix_tokens ×
prefill_ms_per_token`` (:class:`LatencyModel`).

Fleet spec: ``AxGxNAME-MEM`` — A agents with G GPUs of MEM each (``8x8xH100-80G``: 8 agents
of 8 × 80 GiB; the name is a label and may be left out: ``2x4x48G``); ``AxcpuC-MEM`` — A
CPU-only agents with C cores and MEM of RAM (``2xcpu16-64G``). Join specs with ``+``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, fields, replace
from datetime import time
from pathlib import Path

import numpy as np

from catalog.schedules import Window, parse_weekdays
from fleet.planning.routing import LEAST_LOADED, POLICIES
from fleet.planning.scaling import SCALE_DOWN_HEADROOM

#: Prefixes one simulated replica keeps in its prefix cache unless the catalog says: a
#: handful of long system prompts fit beside the running requests' KV on one engine.
PREFIX_CACHE_SLOTS = 4

#: Defaults of ``catalog.models.ClusterSettings`` and the settings the reconciler reads
#: (tests assert they agree), so a file that states nothing simulates a default cluster.
CLUSTER_DEFAULTS = {
    "default_idle_timeout_s": 600.0,
    "min_idle_before_eviction_s": 60.0,
    "scale_up_waiting": 1.0,
    "scale_up_after_s": 30.0,
    "scale_down_after_s": 300.0,
    "cold_start_timeout_s": 300.0,
}


@dataclass(frozen=True)
class LatencyModel:
    """How one replica serves, in milliseconds: a request waits for one of ``slots``
    concurrent slots (the benchmarked max concurrency), then its first token comes after
    ``ttft_base_ms + prompt_tokens × prefill_ms_per_token`` and each further token after
    ``tpot_ms``. The SLO is TTFT ≤ ``slo_ttft_ms``. ``measured``: the slots come from a
    stored Benchmark, which the planner then uses as ``measured_per_replica``. A request
    whose prefix is in its replica's prefix cache skips ``prefix_tokens ×
    prefill_ms_per_token`` of it (the module docstring); without prefixes nothing changes."""

    slots: int = 8
    ttft_base_ms: float = 50.0
    prefill_ms_per_token: float = 0.1
    tpot_ms: float = 30.0
    slo_ttft_ms: float = 1000.0
    measured: bool = False


@dataclass(frozen=True)
class ModelSpec:
    """One catalog model as the simulator needs it. Durations in seconds, memory in MiB."""

    name: str
    gpus_needed: int = 1
    gpu_memory_mib: int = 40960
    cpu_cores: float = 0.0
    memory_mib: int = 0
    min_replicas: int = 0
    max_replicas: int = 1
    on_demand: bool = False
    idle_timeout_s: float | None = None
    windows: tuple[Window, ...] = ()
    #: Placement to ready: weights load and engine start.
    cold_start_s: float = 60.0
    #: The engine reports running/waiting (vLLM, SGLang, llama-server); else the reconciler
    #: only knows in-flight counts, read as running with nothing waiting.
    engine_metrics: bool = True
    latency: LatencyModel = LatencyModel()
    #: How the simulated gateway chooses a ready replica: one of ``fleet.planning.routing.POLICIES``.
    routing_policy: str = LEAST_LOADED
    #: Prefixes one replica keeps cached (LRU); 0: none. Only traces with prefixes use it.
    prefix_cache_slots: int = PREFIX_CACHE_SLOTS


@dataclass(frozen=True)
class ClusterSpec:
    """The cluster's settings that matter to a simulation (ClusterSettings + settings)."""

    time_zone: str = "UTC"
    default_idle_timeout_s: float = CLUSTER_DEFAULTS["default_idle_timeout_s"]
    min_idle_before_eviction_s: float = CLUSTER_DEFAULTS["min_idle_before_eviction_s"]
    scale_up_waiting: float = CLUSTER_DEFAULTS["scale_up_waiting"]
    scale_up_after_s: float = CLUSTER_DEFAULTS["scale_up_after_s"]
    scale_down_after_s: float = CLUSTER_DEFAULTS["scale_down_after_s"]
    cold_start_timeout_s: float = CLUSTER_DEFAULTS["cold_start_timeout_s"]
    drain_grace_s: float = 30.0
    agent_lost_after_s: float = 20.0


@dataclass(frozen=True)
class AgentSpec:
    """One simulated machine."""

    name: str
    gpus: int = 0
    gpu_memory_mib: int = 0
    cpu_cores: float = 0.0
    memory_mib: int = 0


@dataclass(frozen=True)
class Catalog:
    models: tuple[ModelSpec, ...]
    cluster: ClusterSpec = ClusterSpec()
    #: The fleet the file names, if any (``--fleet`` overrides it).
    fleet: tuple[AgentSpec, ...] = field(default=())

    def by_name(self) -> dict[str, ModelSpec]:
        return {m.name: m for m in self.models}


# --- Fleet ----------------------------------------------------------------------------------

_GPU_SPEC = re.compile(r"^(\d+)x(\d+)x(?:([A-Za-z][\w.]*)-)?(\d+(?:\.\d+)?)(G|GB|GiB|M|MiB)?$")
_CPU_SPEC = re.compile(r"^(\d+)xcpu(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)(G|GB|GiB|M|MiB)?$", re.IGNORECASE)


def _mib(amount: str, unit: str | None) -> int:
    value = float(amount)
    return int(round(value if unit in ("M", "MiB") else value * 1024))


def parse_fleet(spec: str) -> tuple[AgentSpec, ...]:
    """``"8x8xH100-80G"`` → 8 agents of 8 GPUs with 81,920 MiB each (see the module
    docstring). Raises ValueError with an example when the spec is not understood."""
    agents: list[AgentSpec] = []
    for part in (p.strip() for p in spec.replace(",", "+").split("+")):
        if not part:
            continue
        gpu, cpu = _GPU_SPEC.match(part), _CPU_SPEC.match(part)
        if gpu:
            count, per, label, amount, unit = gpu.groups()
            label = (label or "gpu").lower()
            for _ in range(int(count)):
                agents.append(AgentSpec(f"{label}-{len(agents) + 1:03d}", gpus=int(per),
                                        gpu_memory_mib=_mib(amount, unit)))
        elif cpu:
            count, cores, amount, unit = cpu.groups()
            for _ in range(int(count)):
                agents.append(AgentSpec(f"cpu-{len(agents) + 1:03d}", cpu_cores=float(cores),
                                        memory_mib=_mib(amount, unit)))
        else:
            raise ValueError(f"'{part}' is not a fleet spec: use AGENTSxGPUSxNAME-MEMORY like 8x8xH100-80G, "
                             "or AGENTSxcpuCORES-MEMORY like 2xcpu16-64G; join several with +")
    if not agents:
        raise ValueError("the fleet spec names no agents")
    return tuple(agents)


def describe_fleet(fleet: tuple[AgentSpec, ...]) -> str:
    """``"8 agents, 64 GPUs"`` style summary."""
    gpus = sum(a.gpus for a in fleet)
    cores = sum(a.cpu_cores for a in fleet)
    text = f"{len(fleet)} agent{'s' if len(fleet) != 1 else ''}, {gpus} GPU{'s' if gpus != 1 else ''}"
    return text + (f", {cores:g} CPU cores" if cores else "")


def grow_fleet(fleet: tuple[AgentSpec, ...], models: tuple[ModelSpec, ...], counts: dict[str, int]) -> tuple[AgentSpec, ...]:
    """``fleet`` plus as many agents shaped like its first GPU agent as it takes for
    ``counts[name]`` replicas of every model to fit (first fit, biggest first): the static
    fleet a baseline needs. CPU-only models are packed onto CPU agents the same way."""
    specs = {m.name: m for m in models}
    agents = list(fleet)
    template_gpu = next((a for a in fleet if a.gpus), AgentSpec("gpu", gpus=8, gpu_memory_mib=81920))
    template_cpu = next((a for a in fleet if a.cpu_cores), AgentSpec("cpu", cpu_cores=16, memory_mib=65536))
    free = [[a.gpu_memory_mib] * a.gpus for a in agents]
    cores = [[a.cpu_cores, a.memory_mib] for a in agents]
    wanted = sorted(((specs[n], c) for n, c in counts.items() if c > 0),
                    key=lambda sc: (-sc[0].gpus_needed, -sc[0].gpu_memory_mib, sc[0].name))
    for spec, count in wanted:
        for _ in range(count):
            placed = False
            for i, a in enumerate(agents):
                if spec.gpus_needed:
                    fit = [g for g in free[i] if g >= spec.gpu_memory_mib]
                    if len(fit) >= spec.gpus_needed:
                        for g in fit[: spec.gpus_needed]:
                            free[i].remove(g)
                        placed = True
                elif cores[i][0] >= spec.cpu_cores and cores[i][1] >= spec.memory_mib:
                    cores[i][0] -= spec.cpu_cores
                    cores[i][1] -= spec.memory_mib
                    placed = True
                if placed:
                    break
            if placed:
                continue
            template = template_gpu if spec.gpus_needed else template_cpu
            if spec.gpus_needed and (template.gpus < spec.gpus_needed or template.gpu_memory_mib < spec.gpu_memory_mib):
                raise ValueError(f"{spec.name} needs {spec.gpus_needed} GPUs of {spec.gpu_memory_mib} MiB: "
                                 "no agent of this fleet's shape can hold it")
            new = replace(template, name=f"{'static' if spec.gpus_needed else 'static-cpu'}-{len(agents) + 1:03d}")
            agents.append(new)
            free.append([new.gpu_memory_mib] * new.gpus)
            cores.append([new.cpu_cores, new.memory_mib])
            if spec.gpus_needed:
                for _ in range(spec.gpus_needed):
                    free[-1].remove(new.gpu_memory_mib)
            else:
                cores[-1][0] -= spec.cpu_cores
                cores[-1][1] -= spec.memory_mib
    return tuple(agents)


# --- Catalog files ----------------------------------------------------------------------------

_MODEL_KEYS = {"name", "gpus_needed", "gpu_memory_mib", "cpu_cores", "memory_mib", "min", "min_replicas", "max",
               "max_replicas", "on_demand", "idle_timeout_s", "windows", "cold_start_s", "engine_metrics",
               "benchmark", "latency", "profile", "aliases", "weights", "notes", "routing_policy",
               "prefix_cache_slots"}
_WINDOW_KEYS = {"weekdays", "start", "end", "min", "min_replicas", "max", "max_replicas"}
_BENCH_KEYS = {"max_concurrency", "slo_ttft_p95_ms", "slo_tpot_p95_ms"}
_LATENCY_KEYS = {f.name for f in fields(LatencyModel)} - {"measured"}


def _clock(value, where: str) -> time:
    if isinstance(value, time):
        return value
    if isinstance(value, int):  # YAML reads 09:00 as minutes since midnight (sexagesimal)
        return time(value // 60 % 24, value % 60)
    try:
        return time.fromisoformat(str(value))
    except ValueError:
        raise ValueError(f"{where}: '{value}' is not a time like 09:00") from None


def _seconds(value, where: str) -> float:
    """A finite number of seconds ≥ 0 (ValueError naming ``where`` otherwise)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {value!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{where}: {value!r} is not a number of seconds ≥ 0")
    return seconds


def _check_keys(obj: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(allowed))})")


def latency_from(benchmark: dict | None, latency: dict | None, where: str = "model") -> LatencyModel:
    """A latency model from a stored benchmark's figures and optional explicit overrides."""
    lat = LatencyModel()
    if benchmark:
        _check_keys(benchmark, _BENCH_KEYS, f"{where}: benchmark")
        lat = replace(lat, slots=int(benchmark["max_concurrency"]), measured=True,
                      slo_ttft_ms=float(benchmark.get("slo_ttft_p95_ms") or lat.slo_ttft_ms))
        if benchmark.get("slo_tpot_p95_ms"):
            # The engine met this at full concurrency: a conservative time per token.
            lat = replace(lat, tpot_ms=float(benchmark["slo_tpot_p95_ms"]))
    if latency:
        _check_keys(latency, _LATENCY_KEYS, f"{where}: latency")
        lat = replace(lat, **{k: (int(v) if k == "slots" else float(v)) for k, v in latency.items()})
    if lat.slots < 1:
        raise ValueError(f"{where}: a replica needs at least one slot (max_concurrency ≥ 1)")
    return lat


def model_from_dict(obj: dict, default_cold_start_s: float = 60.0) -> ModelSpec:
    """One model entry of a catalog file (see the module docstring)."""
    if not isinstance(obj, dict) or not obj.get("name"):
        raise ValueError(f"every model needs a name: {obj!r}")
    name = str(obj["name"])
    _check_keys(obj, _MODEL_KEYS, f"model {name}")
    windows = []
    for i, w in enumerate(obj.get("windows") or []):
        where = f"model {name}: window {i + 1}"
        _check_keys(w, _WINDOW_KEYS, where)
        top = w.get("max", w.get("max_replicas"))
        windows.append(Window(parse_weekdays(str(w.get("weekdays", "mon-fri"))), _clock(w["start"], where),
                              _clock(w["end"], where), int(w.get("min", w.get("min_replicas", 1))),
                              int(top) if top is not None else None, i + 1))
    low = int(obj.get("min", obj.get("min_replicas", 0)))
    high = int(obj.get("max", obj.get("max_replicas", max(1, low))))
    if high < low:
        raise ValueError(f"model {name}: max ({high}) is below min ({low})")
    gpus = int(obj.get("gpus_needed", 1))
    idle = obj.get("idle_timeout_s")
    policy = str(obj.get("routing_policy", LEAST_LOADED))
    if policy not in POLICIES:
        raise ValueError(f"model {name}: routing_policy '{policy}' is not one of {', '.join(POLICIES)}")
    cache_slots = obj.get("prefix_cache_slots", PREFIX_CACHE_SLOTS)
    # Only a whole number: int() would read true as 1 and 1.7 as 1 without a word.
    if isinstance(cache_slots, bool) or not isinstance(cache_slots, int) or cache_slots < 0:
        raise ValueError(f"model {name}: prefix_cache_slots must be an integer ≥ 0 (0: no prefix cache), "
                         f"not {cache_slots!r}")
    return ModelSpec(
        name=name, gpus_needed=gpus,
        gpu_memory_mib=int(obj.get("gpu_memory_mib", 40960 if gpus else 0)),
        cpu_cores=float(obj.get("cpu_cores", 0 if gpus else 1)),
        memory_mib=int(obj.get("memory_mib", 0)),
        min_replicas=low, max_replicas=high, on_demand=bool(obj.get("on_demand", False)),
        idle_timeout_s=float(idle) if idle else None, windows=tuple(windows),
        cold_start_s=_seconds(obj.get("cold_start_s", default_cold_start_s), f"model {name}: cold_start_s"),
        engine_metrics=bool(obj.get("engine_metrics", True)),
        latency=latency_from(obj.get("benchmark"), obj.get("latency"), f"model {name}"),
        routing_policy=policy, prefix_cache_slots=cache_slots,
    )


def catalog_from_dict(data, default_cold_start_s: float = 60.0) -> Catalog:
    """A catalog from parsed JSON/YAML: a list of models or ``{cluster, fleet, models}``."""
    if isinstance(data, list):
        data = {"models": data}
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise ValueError("a catalog is a list of models, or an object with a 'models' list")
    _check_keys(data, {"cluster", "fleet", "models", "description"}, "catalog")
    cluster_data = data.get("cluster") or {}
    known = {f.name for f in fields(ClusterSpec)}
    _check_keys(cluster_data, known, "cluster")
    cluster = ClusterSpec(**{k: (str(v) if k == "time_zone" else float(v)) for k, v in cluster_data.items()})
    models = tuple(model_from_dict(m, default_cold_start_s) for m in data["models"])
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ValueError("model names must be unique in a catalog")
    fleet = parse_fleet(data["fleet"]) if data.get("fleet") else ()
    return Catalog(models, cluster, fleet)


def read_catalog(path: str | Path, default_cold_start_s: float = 60.0) -> Catalog:
    """Read a catalog file: ``.json``, or ``.yaml``/``.yml`` (needs PyYAML)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        import yaml  # lazy: PyYAML is optional (YAML catalogs only)

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    try:
        return catalog_from_dict(data, default_cold_start_s)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: {exc!r}") from None


def catalog_to_dict(catalog: Catalog) -> dict:
    """The inverse of :func:`catalog_from_dict` (for ``--save-catalog`` and tests)."""
    models = []
    for m in catalog.models:
        entry = {"name": m.name, "gpus_needed": m.gpus_needed, "gpu_memory_mib": m.gpu_memory_mib,
                 "min": m.min_replicas, "max": m.max_replicas, "on_demand": m.on_demand,
                 "cold_start_s": m.cold_start_s, "engine_metrics": m.engine_metrics}
        if not m.gpus_needed:
            entry.update(cpu_cores=m.cpu_cores, memory_mib=m.memory_mib)
        if m.idle_timeout_s:
            entry["idle_timeout_s"] = m.idle_timeout_s
        if m.windows:
            entry["windows"] = [{"weekdays": ",".join(("mon", "tue", "wed", "thu", "fri", "sat", "sun")[d] for d in w.weekdays),
                                 "start": w.start.strftime("%H:%M"), "end": w.end.strftime("%H:%M"),
                                 "min": w.min_replicas, **({"max": w.max_replicas} if w.max_replicas else {})}
                                for w in m.windows]
        lat = m.latency
        if lat.measured:
            entry["benchmark"] = {"max_concurrency": lat.slots, "slo_ttft_p95_ms": lat.slo_ttft_ms}
        entry["latency"] = {"ttft_base_ms": lat.ttft_base_ms, "prefill_ms_per_token": lat.prefill_ms_per_token,
                            "tpot_ms": lat.tpot_ms, **({} if lat.measured else {"slots": lat.slots,
                                                                                  "slo_ttft_ms": lat.slo_ttft_ms})}
        if m.routing_policy != LEAST_LOADED:
            entry["routing_policy"] = m.routing_policy
        if m.prefix_cache_slots != PREFIX_CACHE_SLOTS:
            entry["prefix_cache_slots"] = m.prefix_cache_slots
        models.append(entry)
    out: dict = {"cluster": {f.name: getattr(catalog.cluster, f.name) for f in fields(ClusterSpec)}, "models": models}
    return out


def static_catalog(catalog: Catalog, counts: dict[str, int]) -> Catalog:
    """Every model pinned at ``counts[name]`` replicas (min = max, not on demand, no
    windows, no load scaling): the static fleet a baseline runs."""
    return replace(catalog, models=tuple(
        replace(m, min_replicas=counts.get(m.name, 0), max_replicas=counts.get(m.name, 0), on_demand=False,
                windows=(), idle_timeout_s=None)
        for m in catalog.models))


def peak_counts(catalog: Catalog, trace, bucket_s: float = 300.0, headroom: float = SCALE_DOWN_HEADROOM) -> dict[str, int]:
    """Replicas per model for a static fleet sized for the trace's peak: the busiest
    ``bucket_s`` window's offered concurrency (arrival rate × mean service time, Little's
    law) over ``headroom`` of a replica's slots (by default the 70% the planner keeps when
    it scales down), rounded up; at least 1 for every model in the catalog (a static fleet
    runs everything it offers)."""
    specs = catalog.by_name()
    counts = {m.name: 1 for m in catalog.models}
    if not len(trace):
        return counts
    bucket = (trace.t_s // bucket_s).astype(np.int64)
    for idx, name in enumerate(trace.names):
        spec = specs.get(name)
        if spec is None:
            continue
        mask = trace.model == idx
        if not mask.any():
            continue
        lat = spec.latency
        service_s = (lat.ttft_base_ms + trace.prompt_tokens[mask] * lat.prefill_ms_per_token
                     + trace.output_tokens[mask] * lat.tpot_ms) / 1000.0
        per_bucket = np.bincount(bucket[mask], weights=service_s)  # busy seconds offered per bucket
        peak_concurrency = float(per_bucket.max()) / bucket_s
        counts[name] = max(1, math.ceil(peak_concurrency / (lat.slots * headroom) - 1e-9))
    return counts


# --- From the database --------------------------------------------------------------------------


def catalog_from_db(default_cold_start_s: float = 60.0) -> Catalog:
    """The catalog the cluster runs: every model with a profile (external ones are served
    elsewhere and skipped), its windows, benchmark and routing policy, its cold start as the
    fleet measured it (the 90th percentile of its recent starts, as the last reconcile pass
    stored it; ``default_cold_start_s`` for a model never started), and the cluster's
    settings (prefix cache slots: :data:`PREFIX_CACHE_SLOTS`, the database has none). Needs
    Django set up; imports the ORM here so the rest of the simulator does not."""
    # lazy: the simulator runs without Django (bench/simulate_day.py); only the *_from_db
    # readers need the ORM, and they need Django set up first.
    from django.conf import settings

    from catalog.models import Benchmark, ClusterSettings, Model, ScheduleWindow
    from fleet.models import ModelState

    cluster_row = ClusterSettings.get_solo()
    cluster = ClusterSpec(
        time_zone=cluster_row.time_zone,
        default_idle_timeout_s=float(cluster_row.default_idle_timeout_s),
        min_idle_before_eviction_s=float(cluster_row.min_idle_before_eviction_s),
        scale_up_waiting=float(cluster_row.scale_up_waiting),
        scale_up_after_s=float(cluster_row.scale_up_after_s),
        scale_down_after_s=float(cluster_row.scale_down_after_s),
        cold_start_timeout_s=float(cluster_row.cold_start_timeout_s),
        drain_grace_s=float(settings.LLMGW_DRAIN_GRACE_S),
        agent_lost_after_s=float(settings.LLMGW_AGENT_LOST_AFTER_S),
    )
    windows: dict[int, list[Window]] = {}
    for w in ScheduleWindow.objects.all():
        windows.setdefault(w.model_id, []).append(w.as_window())
    benchmarks = {(b.model_id, b.profile_id): b for b in Benchmark.objects.all()}
    measured = dict(ModelState.objects.filter(cold_start_s__isnull=False).values_list("model_id", "cold_start_s"))
    models = []
    for m in Model.objects.select_related("profile").order_by("name"):
        p = m.profile
        if m.is_external or p is None:
            continue
        b = benchmarks.get((m.id, p.id))
        bench = None
        if b is not None:
            bench = {"max_concurrency": b.max_concurrency, "slo_ttft_p95_ms": b.slo_ttft_p95_ms,
                     "slo_tpot_p95_ms": b.slo_tpot_p95_ms}
        models.append(ModelSpec(
            name=m.name, gpus_needed=p.gpus_needed, gpu_memory_mib=p.gpu_memory_mib, cpu_cores=p.cpu_cores,
            memory_mib=p.memory_mib, min_replicas=m.min_replicas, max_replicas=m.max_replicas,
            on_demand=m.on_demand, idle_timeout_s=float(m.idle_timeout_s) if m.idle_timeout_s else None,
            windows=tuple(windows.get(m.id, ())), cold_start_s=measured.get(m.id, default_cold_start_s),
            engine_metrics=bool(p.metric_running or p.metric_waiting),
            latency=latency_from(bench, None, f"model {m.name}"),
            routing_policy=m.routing_policy if m.routing_policy in POLICIES else LEAST_LOADED,
        ))
    return Catalog(tuple(models), cluster)


def fleet_from_db() -> tuple[AgentSpec, ...]:
    """The registered agents (not cordoned) with the GPUs, cores and RAM they reported."""
    from fleet.models import Agent  # lazy: the simulator runs without Django (see catalog_from_db)

    agents = []
    for a in Agent.objects.filter(cordoned=False).prefetch_related("gpus").order_by("name"):
        gpus = list(a.gpus.all())
        memory = min((g.memory_total_mib for g in gpus), default=0)
        agents.append(AgentSpec(a.name, gpus=len(gpus), gpu_memory_mib=memory, cpu_cores=float(a.cpu_cores),
                                memory_mib=a.memory_mib))
    return tuple(agents)
