"""Ready-made scenarios: a catalog and a trace that belong together.

``diurnal_long_tail``: a working day on a shared cluster — a few heavily used models kept
running (more replicas in office hours, load scaling on top), a set of team models started
on demand (some kept warm in office hours), and a long tail of rarely used on-demand models,
more models than GPUs. The benchmark (``bench/simulate_day.py``) and the README's published
result use it; ``llmgw simulate --scenario diurnal-long-tail`` runs it.

``shared_prefixes``: one busy model whose tenants each send a long system prompt ahead of
every question (issue 17): the prefix-cache gain of ``prefix-affinity`` routing over
``least-loaded``, estimated before it is deployed. ``llmgw simulate --scenario
shared-prefixes`` runs it with prefix-affinity.
"""

from __future__ import annotations

from datetime import time, timedelta

import numpy as np

from catalog.schedules import Window
from fleet.simulation import traces
from fleet.planning.routing import PREFIX_AFFINITY
from fleet.simulation.catalog import Catalog, ClusterSpec, LatencyModel, ModelSpec

WEEKDAYS = (0, 1, 2, 3, 4)
SCENARIOS = ("diurnal-long-tail", "shared-prefixes")
#: Night traffic, relative to the office-hours peak.
NIGHT = 0.03


def diurnal_long_tail(models: int = 200, requests: int = 1_000_000, seed: int = 1,
                      head: int = 10, team: int = 20) -> tuple[Catalog, str, traces.Trace]:
    """(catalog, fleet spec, trace) of the diurnal long-tail day.

    * ``head`` models (the first 3 need 2 GPUs): min 1, max 8, min 2 on weekdays
      08:00–19:00; benchmarked (24–32 slots, TTFT SLO 1 s); 86% of requests (Zipf 0.8).
    * ``team`` models: on demand, idle timeout 10 min, max 2; the first third kept at min 1
      on weekdays 09:00–18:00; benchmarked (16 slots); 12% of requests (Zipf 1.0).
    * the rest, the long tail: on demand, idle timeout 5 min, max 1, no benchmark
      (defaults: 8 slots, TTFT SLO 1 s); visited in short sessions, 2 a day each on average.

    Traffic follows office hours 09:00–18:00 with nights at 3% of the peak. Fleet
    ``8x8xH100-80G`` (64 GPUs). The trace starts on a Monday at midnight UTC.
    """
    if models < head + team + 1:
        raise ValueError(f"the scenario needs more than {head + team} models")
    tail = models - head - team
    specs: list[ModelSpec] = []
    for i in range(head):
        big = i < 3
        specs.append(ModelSpec(
            name=f"head-{i + 1:02d}{'-70b' if big else '-8b'}", gpus_needed=2 if big else 1, gpu_memory_mib=81920,
            min_replicas=1, max_replicas=8, cold_start_s=150.0 if big else 60.0,
            windows=(Window(WEEKDAYS, time(8, 0), time(19, 0), 2, 8, 1),),
            latency=LatencyModel(slots=24 if big else 32, ttft_base_ms=120 if big else 60,
                                 prefill_ms_per_token=0.15 if big else 0.05, tpot_ms=40 if big else 22,
                                 slo_ttft_ms=1000, measured=True)))
    for i in range(team):
        warm = i < team // 3
        specs.append(ModelSpec(
            name=f"team-{i + 1:02d}", gpus_needed=1, gpu_memory_mib=40960, min_replicas=0, max_replicas=2,
            on_demand=True, idle_timeout_s=600.0, cold_start_s=60.0,
            windows=(Window(WEEKDAYS, time(9, 0), time(18, 0), 1, 2, 1),) if warm else (),
            latency=LatencyModel(slots=16, ttft_base_ms=60, prefill_ms_per_token=0.05, tpot_ms=25,
                                 slo_ttft_ms=1000, measured=True)))
    for i in range(tail):
        specs.append(ModelSpec(
            name=f"tail-{i + 1:03d}", gpus_needed=1, gpu_memory_mib=40960, min_replicas=0, max_replicas=1,
            on_demand=True, idle_timeout_s=300.0, cold_start_s=45.0))
    catalog = Catalog(tuple(specs), ClusterSpec())

    names = [s.name for s in specs]
    rare = traces.long_tail(names[head + team:], seed=seed + 1, sessions_per_day=2.0, requests_per_session=4.0,
                            night=NIGHT)
    weights = np.concatenate([0.86 * traces.zipf_weights(head, 0.8), 0.12 * traces.zipf_weights(team, 1.0)])
    busy = traces.diurnal(names[: head + team], max(0, requests - len(rare)), seed=seed, weights=weights,
                          night=NIGHT)
    trace = traces.merge(busy, rare, description=(
        f"diurnal long-tail day: {requests:,} requests, {models} models ({head} head, {team} team, "
        f"{tail} long tail), office hours 9–18 UTC"))
    return catalog, "8x8xH100-80G", trace


def diurnal_long_tail_history(models: int = 200, requests: int = 1_000_000, seed: int = 1, weeks: int = 4,
                              head: int = 10, team: int = 20) -> traces.Trace:
    """The on-demand models' requests over the ``weeks`` weeks before :func:`diurnal_long_tail`'s
    day — the same traffic shapes, drawn with other seeds — so a simulation can start from
    arrival profiles a running cluster would have learned (issue 18: ``Simulator(history=)``;
    predictive warmth knows nothing on a cluster's first day). Each weekday carries the
    team models' share of ``requests``; weekends run at the night level, as in the day's
    generator. Only the team and long-tail models appear (the head models are never on
    demand); ``t_s`` counts from the history's own start, ``weeks`` × 7 days before the day.
    """
    if models < head + team + 1:
        raise ValueError(f"the scenario needs more than {head + team} models")
    day_start = traces.DEFAULT_START
    start = day_start - timedelta(days=7 * weeks)
    names = [f"team-{i + 1:02d}" for i in range(team)] + [f"tail-{i + 1:03d}" for i in range(models - head - team)]
    weekday = traces.office_hours_rate(np.arange(0, 24, 1 / 60) + 1 / 120, np.zeros(1440), night=NIGHT).sum()
    weekend = NIGHT * 1440
    team_per_weekday = 0.12 * requests
    parts = []
    for day in range(7 * weeks):
        begins = start + timedelta(days=day)
        share = 1.0 if begins.weekday() < 5 else weekend / weekday
        part = traces.diurnal(names[:team], int(round(team_per_weekday * share)), seed=seed + 1000 + day,
                              weights=traces.zipf_weights(team, 1.0), night=NIGHT, start=begins)
        parts.append(traces.Trace(part.t_s + day * 86400.0, part.model, part.names, part.prompt_tokens,
                                  part.output_tokens, start, _sorted=True))
    parts.append(traces.long_tail(names[team:], seed=seed + 2000, sessions_per_day=2.0, requests_per_session=4.0,
                                  night=NIGHT, days=7.0 * weeks, start=start))
    return traces.merge(*parts, description=f"the {weeks} weeks before the diurnal long-tail day (on-demand models)")


def shared_prefixes(requests: int = 7200, seed: int = 1, tenants: int = 24, replicas: int = 4,
                    policy: str = PREFIX_AFFINITY, duration_s: float = 3600.0,
                    cache_slots: int = 4) -> tuple[Catalog, str, traces.Trace]:
    """(catalog, fleet spec, trace) of tenants sharing one model, each with its own system
    prompt.

    * one model, ``assistant-70b``: 2 GPUs, kept at ``replicas`` replicas (min = max, so
      the planner never moves them and only routing differs), 16 slots, TTFT 120 ms +
      0.15 ms per prompt token, 40 ms per output token, TTFT SLO 1 s; routed by
      ``policy``, ``cache_slots`` prefixes cached per replica.
    * ``requests`` requests at uniformly random times over ``duration_s``, each from one of
      ``tenants`` tenants (Zipf 1.0 by tenant: a few large ones, many small). A tenant's
      prefix (``tenant-NN``) is its system prompt, 1,000–6,000 tokens (drawn once per
      tenant); the question after it is log-normal around 150 tokens, the answer around 120.

    With fewer cache slots in the fleet than tenants, least-loaded routing scatters every
    tenant over every replica and finds its prompt cached rarely; prefix-affinity keeps a
    tenant on its replica. Fleet ``1x8xH100-80G``. Deterministic for a ``seed``.
    """
    rng = np.random.default_rng(seed)
    spec = ModelSpec(
        name="assistant-70b", gpus_needed=2, gpu_memory_mib=81920, min_replicas=replicas, max_replicas=replicas,
        cold_start_s=150.0, routing_policy=policy, prefix_cache_slots=cache_slots,
        latency=LatencyModel(slots=16, ttft_base_ms=120, prefill_ms_per_token=0.15, tpot_ms=40, slo_ttft_ms=1000,
                             measured=True))
    system_tokens = rng.integers(1000, 6001, tenants)
    tenant = rng.choice(tenants, size=requests, p=traces.zipf_weights(tenants, 1.0))
    question = np.clip(np.rint(rng.lognormal(np.log(150), 0.8, requests)), 1, 4096).astype(np.int32)
    answer = np.clip(np.rint(rng.lognormal(np.log(120), 0.8, requests)), 1, 2048).astype(np.int32)
    t = np.sort(rng.random(requests) * duration_s)
    trace = traces.Trace(
        t, np.zeros(requests, dtype=np.int32), [spec.name], system_tokens[tenant] + question, answer,
        description=f"shared prefixes: {requests:,} requests from {tenants} tenants' system prompts "
                    f"over {duration_s / 3600:g} h, {replicas} replicas, {policy}",
        prefix=tenant.astype(np.int32), prefix_tokens=system_tokens[tenant],
        prefix_ids=[f"tenant-{i + 1:02d}" for i in range(tenants)], _sorted=True)
    return Catalog((spec,), ClusterSpec()), "1x8xH100-80G", trace
