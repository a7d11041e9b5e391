"""Everything one reconcile pass needs, read from the database into the planner's plain
``Snapshot`` in a handful of queries (docs/architecture.md, "The reconcile pass").
"""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db.models import F, Q, Sum, Window
from django.db.models.functions import RowNumber

from catalog.models import Benchmark, ClusterSettings, Model, ScheduleWindow
from catalog.schedules import active_window, describe, next_start, starts_between
from fleet.control.planes import listening_since
from fleet.control.specs import is_outdated, spec_hash
from fleet.models import Agent, Gpu, ModelState, QueueReport, Replica, UsageReport
from fleet.planning import planner, warmth
from fleet.protocol import error_summary
from fleet.planning.scaling import Load, ScalingPolicy, Trend
from fleet.states import HOLDS_RESOURCES, ReplicaState

#: The measured cold starts this process read last, and when (``LLMGW_COLD_STARTS_CACHE``).
_cold_starts: tuple[float, dict[tuple[int, int | None], list[float]]] | None = None


def _policy(cluster: ClusterSettings, now: datetime | None = None) -> planner.Policy:
    scaling = ScalingPolicy(
        scale_up_waiting=cluster.scale_up_waiting,
        scale_up_after_s=float(cluster.scale_up_after_s),
        scale_down_after_s=float(cluster.scale_down_after_s),
        ramp=cluster.ramp_scaling,
    )
    return planner.Policy(
        scaling=scaling,
        stopped=cluster.stopped,
        default_idle_timeout_s=float(cluster.default_idle_timeout_s),
        min_idle_before_eviction_s=float(cluster.min_idle_before_eviction_s),
        drain_grace_s=settings.LLMGW_DRAIN_GRACE_S,
        agent_lost_after_s=settings.LLMGW_AGENT_LOST_AFTER_S,
        backoff_base_s=settings.LLMGW_BACKOFF_BASE_S,
        backoff_cap_s=settings.LLMGW_BACKOFF_CAP_S,
        placing_timeout_s=settings.LLMGW_PLACING_TIMEOUT_S,
        listening_since=listening_since(now) if now is not None else None,
        time_zone=cluster.time_zone,
        default_cold_start_s=float(cluster.default_cold_start_s),
        prewarm_windows=cluster.prewarm_windows,
        predictive_warmth=cluster.predictive_warmth,
    )


def recent_cold_starts(fresh: bool = False) -> dict[tuple[int, int | None], list[float]]:
    """(model id, profile id) → the measured cold starts (seconds) of its most recent
    replicas, newest first, at most ``warmth.RECENT_STARTS`` each (docs/architecture.md,
    R11). One query, reused for ``LLMGW_COLD_STARTS_CACHE`` in this process (``fresh``:
    read now)."""
    global _cold_starts
    ttl = settings.LLMGW_COLD_STARTS_CACHE_S
    if not fresh and _cold_starts is not None and time.monotonic() - _cold_starts[0] < ttl:
        return _cold_starts[1]
    rows = (Replica.objects.filter(cold_start_s__isnull=False, model__isnull=False)
            .annotate(rank=Window(RowNumber(), partition_by=[F("model_id"), F("profile_id")], order_by=F("id").desc()))
            .filter(rank__lte=warmth.RECENT_STARTS)
            .order_by("-id").values_list("model_id", "profile_id", "cold_start_s"))
    found: dict[tuple[int, int | None], list[float]] = defaultdict(list)
    for model_id, profile_id, seconds in rows:
        found[(model_id, profile_id)].append(seconds)
    _cold_starts = (time.monotonic(), dict(found))
    return _cold_starts[1]


def cold_start_of(model_id: int, profile_id: int | None, cluster: ClusterSettings,
                  recent: dict[tuple[int, int | None], list[float]] | None = None) -> warmth.ColdStart:
    """The model's cold-start estimate on its profile (R11): p90 of its recent starts, or
    the cluster's default."""
    starts = (recent if recent is not None else recent_cold_starts()).get((model_id, profile_id), [])
    return warmth.cold_start(starts, float(cluster.default_cold_start_s))


def fresh_in_flight(now: datetime) -> dict[int, int]:
    """Replica id → in-flight requests summed over the web processes' fresh reports.
    Replicas without a fresh report are absent: their count is unknown."""
    since = now - timedelta(seconds=settings.LLMGW_USAGE_REPORT_FRESH_S)
    rows = (
        UsageReport.objects.filter(reported_at__gte=since)
        .values("replica_id")
        .annotate(total=Sum("in_flight"))
    )
    return {row["replica_id"]: row["total"] for row in rows}


def in_flight_since_draining(now: datetime, draining: list[Replica]) -> dict[int, int]:
    """In-flight totals for draining replicas, counting only reports made after the drain
    began (an older 0 may predate a request routed just before): a replica that no web
    process has reported on since is absent, i.e. unknown, and waits for the grace."""
    if not draining:
        return {}
    since = now - timedelta(seconds=settings.LLMGW_USAGE_REPORT_FRESH_S)
    began = {r.pk: r.state_changed_at for r in draining}
    totals: dict[int, int] = {}
    stale: set[int] = set()
    for replica_id, flight, at in UsageReport.objects.filter(replica_id__in=began, reported_at__gte=since).values_list(
            "replica_id", "in_flight", "reported_at"):
        if at < began[replica_id]:
            stale.add(replica_id)
        else:
            totals[replica_id] = totals.get(replica_id, 0) + flight
    # One process's report from before the drain makes the sum unknown.
    return {rid: total for rid, total in totals.items() if rid not in stale}


def load_snapshot(now: datetime, arrivals: dict[int, warmth.ArrivalProfile] | None = None) -> planner.Snapshot:
    """Read everything one pass needs in a handful of queries. Each model carries its
    current spec hash and each replica whether it is outdated (docs/architecture.md, R10);
    a replica whose model was deleted has ``model_id`` None.

    Warm before demand (R11): each model carries its measured cold start and the next
    window to start; each on-demand model's arrival profile is brought up to ``now``
    (``warmth.observe``, with its latest request or use) and its prediction made from it
    (``warmth.predict``). Profiles that moved are put in ``arrivals`` (model id → profile)
    for the shell to store."""
    cluster = ClusterSettings.get_solo()
    tz = ZoneInfo(cluster.time_zone)
    recent = recent_cold_starts()
    last_used: dict[int, datetime] = {}
    gpus = defaultdict(list)
    for gpu in Gpu.objects.all():
        gpus[gpu.agent_id].append(planner.GpuView(gpu.index, gpu.memory_total_mib))
    agents = tuple(
        planner.AgentView(
            id=a.id, name=a.name, connected=a.connected, cordoned=a.cordoned,
            last_seen_at=a.last_seen_at, gpus=tuple(gpus[a.id]),
            cpu_cores=float(a.cpu_cores), memory_mib=a.memory_mib,
        )
        for a in Agent.objects.all()
    )
    # Replicas that run before the failures: each query sees the database as of its own
    # start, so a replica failing in between then shows as failed (counted for backoff)
    # rather than as missing from both (placed again at once).
    live_states = [s.value for s in HOLDS_RESOURCES] + [ReplicaState.LOST.value]
    replica_rows = list(Replica.objects.filter(state__in=live_states))
    for r in replica_rows:
        if r.model_id is not None and r.last_used_at is not None:
            last_used[r.model_id] = max(last_used.get(r.model_id, r.last_used_at), r.last_used_at)
    states = {s.model_id: s for s in ModelState.objects.all()}
    horizon = now - timedelta(hours=1)
    proved = proved_stable(now, horizon)
    failures: dict[int, list[Replica]] = defaultdict(list)
    for r in Replica.objects.filter(state=ReplicaState.FAILED.value, state_changed_at__gte=horizon).order_by("state_changed_at"):
        stable_at = proved.get(r.model_id)
        if stable_at is None or r.state_changed_at > stable_at:
            failures[r.model_id].append(r)
    in_flight = fresh_in_flight(now)
    windows = defaultdict(list)
    for w in ScheduleWindow.objects.all():
        windows[w.model_id].append(w.as_window())
    measured = {(b.model_id, b.profile_id): b.max_concurrency for b in Benchmark.objects.all()}
    loads = _loads(now, in_flight)
    models = []
    hashes: dict[int, str] = {}
    for m in Model.objects.select_related("profile"):
        window = active_window(windows[m.id], now, cluster.time_zone) if windows.get(m.id) else None
        p = m.profile
        profile = None
        if p is not None:
            profile = planner.ProfileView(p.id, p.gpus_needed, p.gpu_memory_mib, p.cpu_cores, p.memory_mib)
        state = states.get(m.id)
        hashes[m.id] = spec_hash(m, p)
        # Backoff is per spec (R9, R10): the failures of an edit that a later edit replaced
        # do not hold back the next spec's first try. Rows from before spec hashes ("") count.
        fails = [f for f in failures.get(m.id, []) if not f.spec_hash or f.spec_hash == hashes[m.id]]
        starts = recent.get((m.id, m.profile_id))
        start = warmth.cold_start(starts or [], float(cluster.default_cold_start_s))
        upcoming = _upcoming(windows.get(m.id), now, cluster.time_zone, warmth.lead_s(start))
        predicted = None
        if m.on_demand and not m.is_external:
            stored = warmth.ArrivalProfile.from_json(state.arrivals) if state else warmth.ArrivalProfile()
            asked = max((t for t in (state.wanted_at if state else None, last_used.get(m.id)) if t is not None),
                        default=None)
            seen = warmth.observe(stored, now, asked, tz)
            if arrivals is not None and (state is None or seen is not stored):
                arrivals[m.id] = seen
            if cluster.predictive_warmth:
                idle = float(m.idle_timeout_s or cluster.default_idle_timeout_s)
                predicted = warmth.predict(seen, now, tz, warmth.lead_s(start), idle)
        models.append(
            planner.ModelView(
                id=m.id, name=m.name, profile=profile, min_replicas=m.min_replicas,
                max_replicas=m.max_replicas, on_demand=m.on_demand,
                idle_timeout_s=float(m.idle_timeout_s) if m.idle_timeout_s else None,
                external=m.is_external, wanted_at=state.wanted_at if state else None,
                extra_replicas=state.extra_replicas if state else 0,
                busy_since=state.busy_since if state else None,
                quiet_since=state.quiet_since if state else None,
                observed_per_replica=state.observed_per_replica if state else None,
                crowded_since=state.crowded_since if state else None,
                window_min=window.min_replicas if window else None,
                window_max=window.max_replicas if window else None,
                load=loads.get(m.id),
                measured_per_replica=measured.get((m.id, m.profile_id)),
                failures=tuple(f.state_changed_at for f in fails[-10:]),
                last_error=error_summary(fails[-1].error)[:300] if fails else "",
                spec_hash=hashes[m.id],
                trend=Trend.from_json(state.trend) if state else None,
                cold_start=start if starts else None,
                next_window=(warmth.UpcomingWindow(upcoming[0], upcoming[1].min_replicas, upcoming[1].max_replicas,
                                                   describe(upcoming[1])) if upcoming else None),
                predicted=predicted,
                warm_evicted_at=state.warm_evicted_at if state else None,
            )
        )
    drained = in_flight_since_draining(now, [r for r in replica_rows if r.state == ReplicaState.DRAINING.value])
    replicas = tuple(
        planner.ReplicaView(
            id=r.id, model_id=r.model_id, agent_id=r.agent_id, state=ReplicaState(r.state),
            gpu_indices=tuple(r.gpu_indices or ()), cpu_cores=r.cpu_cores, memory_mib=r.memory_mib,
            state_changed_at=r.state_changed_at, last_used_at=r.last_used_at,
            in_flight=drained.get(r.id) if r.state == ReplicaState.DRAINING.value else in_flight.get(r.id),
            back=is_back(r),
            outdated=r.model_id in hashes and is_outdated(r.spec_hash, hashes[r.model_id]),
        )
        for r in replica_rows
    )
    return planner.Snapshot(_policy(cluster, now), agents, tuple(models), replicas)


def _upcoming(windows, now: datetime, tz_name: str, lead_s: float):
    """The window pre-warm looks at (R11): of those starting within the lead, the one with
    the highest min (a higher window opening soon after a lower one is brought forward in
    time too); else the next to start. (start, window), or None."""
    if not windows:
        return None
    soon = starts_between(windows, now, now + timedelta(seconds=lead_s), tz_name)
    if soon:
        return max(soon, key=lambda sw: (sw[1].min_replicas, -sw[0].timestamp()))
    return next_start(windows, now, tz_name)


def proved_stable(now: datetime, horizon: datetime) -> dict[int, datetime]:
    """Model id → when one of its replicas last proved it runs: ready for
    ``LLMGW_BACKOFF_RESET_AFTER`` without leaving ready. Failures since then are the crash
    loop whose backoff grows; earlier ones are forgiven. So an engine that dies soon after
    every start backs off like one that never starts (not merely the base each time)."""
    stable = timedelta(seconds=settings.LLMGW_BACKOFF_RESET_AFTER_S)
    out: dict[int, datetime] = {}
    rows = Replica.objects.filter(ready_at__isnull=False).filter(
        Q(state=ReplicaState.READY.value) | Q(state_changed_at__gte=horizon)
    ).values_list("model_id", "state", "ready_at", "state_changed_at")
    for model_id, state, ready_at, changed_at in rows:
        until = now if state == ReplicaState.READY.value else changed_at  # when it stopped serving
        if until - ready_at >= stable:
            out[model_id] = max(out.get(model_id, ready_at + stable), ready_at + stable)
    return out


def is_back(replica: Replica) -> bool:
    """A lost replica whose agent has reported its engine ready since it was lost: the
    report stamps ``ready_at`` and leaves the state to the planner (``fleet.control.reports``)."""
    return (
        replica.state == ReplicaState.LOST.value
        and replica.ready_at is not None
        and replica.ready_at > replica.state_changed_at
    )


def _loads(now: datetime, in_flight: dict[int, int]) -> dict[int, Load]:
    """Each model's load over its ready replicas. From the engines' metrics where the
    profile declares them (stale after LLMGW_LOAD_STALE → unknown); else the gateways'
    fresh in-flight counts as running with nothing known to wait. Any replica unknown →
    the model's load is unknown. Requests waiting in the gateways' admission queues (fresh
    ``QueueReport`` rows, summed) are added to a known ``waiting``: the engines never saw
    them, and without them a model held at its capacity would look merely full."""
    stale_before = now - timedelta(seconds=settings.LLMGW_LOAD_STALE_S)
    queued = QueueReport.objects.fresh(now).waiting_by_model()
    acc: dict[int, list] = {}
    for r in Replica.objects.filter(state=ReplicaState.READY.value).select_related("profile"):
        entry = acc.setdefault(r.model_id, [0, 0, 0])  # replicas, running, waiting (None = unknown)
        entry[0] += 1
        if r.profile.metric_running or r.profile.metric_waiting:
            fresh = r.load_reported_at is not None and r.load_reported_at >= stale_before
            running = r.load_running if fresh else None
            waiting = r.load_waiting if fresh else None
        else:
            running, waiting = in_flight.get(r.pk), 0
        entry[1] = None if entry[1] is None or running is None else entry[1] + running
        entry[2] = None if entry[2] is None or waiting is None else entry[2] + waiting
    return {
        model_id: Load(n, running, None if waiting is None else waiting + queued.get(model_id, 0))
        for model_id, (n, running, waiting) in acc.items()
    }
