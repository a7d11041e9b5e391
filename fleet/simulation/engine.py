"""The simulator's event loop: an in-memory shell around the real ``plan()``.

It plays the parts the real cluster splits between processes, on a simulated clock:

* **gateway** — routes each arriving request to the ready replica with the fewest requests
  in flight (ties: the first), or, for a request with a prefix, by the model's routing
  policy with ties rotating per model, as ``fleet.live.route`` does (:mod:`.prefixes`); with none ready it holds the request for an on-demand model
  (``want``: demand now, unservable forgotten, a pass requested at once) or for a model
  with a replica coming up, and otherwise answers 503 (*rejected: unservable*). A held
  request is answered 503 when a pass finds its model unservable, or after the cluster's
  cold-start timeout (*rejected: cold-start timeout*).
* **engines** — each replica has ``slots`` concurrent slots (the benchmarked max
  concurrency); a request beyond them waits at the engine, first come first served. See
  :class:`~fleet.simulation.catalog.LatencyModel` for TTFT and duration.
  A replica's prefix cache (:mod:`.prefixes`) spares a request the prefill of a prefix
  it holds.
* **reconciler** — a pass every ``reconcile_interval_s`` on a fixed grid, and an extra one
  when a request wants a cold on-demand model or an agent reports a replica stopped (as the
  real shell requests them), never two closer than ``pass_gap_s``. Each pass builds a
  ``planner.Snapshot`` exactly as ``fleet.control.snapshot.load_snapshot`` does (load over ready
  replicas from engine metrics or in-flight counts, as the report path delivers them —
  :mod:`fleet.simulation.loads`: polled, reported on heartbeats, stale after
  ``load_stale_s``; last use and in-flight per replica as the gateway reports them; demand
  kept alive by use; the window in force), calls the real ``plan()`` and applies it:
  places, drains, stops, and stores ``outcome.scaling``.
* **agents** — placing → starting after ``ack_s``, → ready ``cold_start_s`` after the
  placement; stopping → stopped after ``stop_s`` (requests still in flight are cut off);
  engine loads read every ``load_poll_s`` and reported as ``load_reports`` says.

Two shortcuts keep a day of a million requests within seconds; both are exact, and
``check_pruning`` proves it pass by pass (it also plans on the full snapshot and fails on
any difference):

* models a pass provably leaves alone (cold on-demand models nobody wants; fixed-size
  models that have all their replicas and cannot scale) are left out of the snapshot's
  models — their replicas stay in it, so free room is the same;
* a pass in which nothing can move — no draining replica may stop, and for every model in
  the snapshot the planner's own ``base_replicas``, ``desired_replicas`` and
  ``scaling.evaluate`` find its replicas as desired and its scaling memory unchanged — is
  not planned (it would return no action and store nothing new). A model's verdict is
  reused until its inputs change or one of its timers (idle timeout, busy or quiet since)
  comes due.

One modelling choice: a held request for a model whose replica is already on its way
requests no pass (the real gateway's ``want`` would, and that pass would decide nothing
for the model); the next tick comes within the interval anyway.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time as wallclock
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo


from catalog.schedules import active_window, describe, window_interval
from fleet.planning import planner, warmth
from fleet.planning.routing import RouteKeys, choose
from fleet.planning.scaling import Load, ScalingPolicy
from fleet.simulation.catalog import AgentSpec, Catalog
from fleet.simulation.config import SimConfig
from fleet.simulation.loads import POLL, LoadReports
from fleet.simulation.prefixes import prefix_hash
from fleet.simulation.runtime import INF, SimModel, SimReplica
from fleet.simulation.shortcuts import Shortcuts
from fleet.simulation.warming import WARMTH, Warming
from fleet.states import COMING_UP, COUNTS_TOWARDS_DESIRED, ReplicaState, check_transition
from fleet.simulation.traces import Trace

S = ReplicaState
_ACK, _READY, _STOPPED = 0, 1, 2


class Simulator(Shortcuts, Warming):
    """One simulation of ``trace`` on ``fleet`` with ``catalog``; :meth:`run` returns the
    raw results (see :mod:`fleet.simulation.report` for the report built from them)."""

    def __init__(self, catalog: Catalog, fleet: tuple[AgentSpec, ...], trace: Trace,
                 config: SimConfig = SimConfig(), label: str = "llmgw", history: Trace | None = None,
                 controller=None) -> None:
        if not fleet:
            raise ValueError("the simulation needs a fleet (at least one agent)")
        self.catalog = catalog
        #: A peer's policy deciding instead of llmgw's planner (``fleet.simulation.peers``):
        #: its ``plan`` runs every pass, without the shortcuts, which are llmgw's rules.
        self.controller = controller
        self.fleet = fleet
        self.trace = trace
        self.config = config
        self.label = label
        cluster = catalog.cluster
        self.tz = cluster.time_zone
        self.start: datetime = trace.start
        self.start_ts = trace.start.timestamp()
        self.policy = planner.Policy(
            default_idle_timeout_s=cluster.default_idle_timeout_s,
            min_idle_before_eviction_s=cluster.min_idle_before_eviction_s,
            drain_grace_s=cluster.drain_grace_s,
            agent_lost_after_s=cluster.agent_lost_after_s,
            scaling=ScalingPolicy(cluster.scale_up_waiting, cluster.scale_up_after_s, cluster.scale_down_after_s,
                                  ramp=config.ramp_scaling),
            time_zone=cluster.time_zone,
            prewarm_windows=config.prewarm_windows,
            predictive_warmth=config.predictive_warmth,
        )
        self.zone = ZoneInfo(cluster.time_zone)
        self.cold_start_timeout_s = cluster.cold_start_timeout_s
        self.models = [SimModel(i, spec) for i, spec in enumerate(catalog.models)]
        self.by_id = {m.id: m for m in self.models}
        by_name = {m.spec.name: m for m in self.models}
        # Trace model index → simulated model (None: not in the catalog; the gateway 404s).
        self.trace_models = [by_name.get(name) for name in trace.names]
        #: Trace prefix index → routing key (empty without prefixes).
        self.prefix_keys = [prefix_hash(pid) for pid in trace.prefix_ids]
        last = trace.duration_s
        self.end = config.duration_s if config.duration_s is not None else max(3600.0, -(-last // 3600) * 3600)
        self._gpu_lists = {i + 1: tuple(planner.GpuView(g, a.gpu_memory_mib) for g in range(a.gpus))
                           for i, a in enumerate(fleet)}
        self._agents: tuple[planner.AgentView, ...] = ()
        self._agents_seen = -INF
        self.live: dict[int, SimReplica] = {}
        self._rid = itertools.count(1)
        self._seq = itertools.count()
        self.completions: list = []  # (t, seq, replica)
        self.control: list = []  # (t, seq, kind, replica)
        self.next_tick = 0.0
        self.requested = INF
        self.last_pass = -INF
        self.holding: set[SimModel] = set()
        #: Models a pass may have to decide something for (the others are provably left alone).
        self.hot: set[SimModel] = set(self.models)
        self.draining: dict[int, SimReplica] = {}
        # Fleet-wide results.
        self.gpus_held = 0
        self.gpu_timeline: list[tuple[float, int]] = [(0.0, 0)]
        self.unknown_model = 0
        self.unfinished = 0
        self.after_end = 0  # arrivals after the simulated end (not simulated)
        self.passes = 0
        self.pass_models = 0
        self.quiet_passes = 0
        self.plan_wall_s = 0.0
        self.events: list[dict] = []  # evictions and idle stops, in order
        #: Requests that met their SLO, by the hour they arrived in (the report's slo_by_hour).
        self.met_by_hour = [0] * (int(self.end // 3600) + 2)
        self.loads = LoadReports(self)
        self._prepare_windows()
        if config.predictive_warmth:
            self._learn_history(history)

    # --- Clock ----------------------------------------------------------------------------

    def at(self, t: float) -> datetime:
        """The wall-clock instant of simulated second ``t``."""
        return self.start + timedelta(seconds=t)

    def _prepare_windows(self) -> None:
        """Every instant a window opens or closes over the simulated span (and 0 s), and —
        with pre-warm — every instant a window's lead begins, so a pass asks
        ``active_window`` only for the models whose answer may have changed; and each
        model's window starts in order, for its ``next_window``."""
        zone = ZoneInfo(self.tz)
        first = self.start.astimezone(zone).date() - timedelta(days=1)
        last = self.at(self.end).astimezone(zone).date() + timedelta(days=2)
        edges: set[tuple[float, int]] = set()
        self.window_starts: dict[int, list[tuple[float, warmth.UpcomingWindow]]] = {}
        for m in self.models:
            if not m.spec.windows:
                continue
            edges.add((0.0, m.index))
            lead = warmth.lead_s(m.cold_start)
            starts = []
            day = first
            while day <= last:
                for w in m.spec.windows:
                    if day.weekday() in w.weekdays:
                        opens, closes = window_interval(w, day, zone)
                        at = (opens - self.start).total_seconds()
                        starts.append((at, warmth.UpcomingWindow(opens, w.min_replicas, w.max_replicas, describe(w))))
                        for edge in (at, (closes - self.start).total_seconds(), at - lead):
                            if edge > 0:
                                edges.add((edge, m.index))
                day += timedelta(days=1)
            self.window_starts[m.index] = sorted(starts, key=lambda x: x[0])
        self.window_edges = sorted(edges)
        self.edge_i = 0

    def _windows_due(self, t: float, now: datetime) -> None:
        edges = self.window_edges
        while self.edge_i < len(edges) and edges[self.edge_i][0] <= t:
            m = self.models[edges[self.edge_i][1]]
            self.edge_i += 1
            w = active_window(m.spec.windows, now, self.tz)
            m.window_min = w.min_replicas if w else None
            m.window_max = w.max_replicas if w else None
            m.next_window = self._upcoming(m, t)
            self.hot.add(m)

    def _upcoming(self, m: SimModel, t: float) -> warmth.UpcomingWindow | None:
        """``fleet.control.snapshot._upcoming``: of the windows starting within the lead,
        the highest; else the next to start."""
        lead = warmth.lead_s(m.cold_start)
        starts = [(at, up) for at, up in self.window_starts[m.index] if at > t]
        soon = [(at, up) for at, up in starts if at <= t + lead]
        if soon:
            return max(soon, key=lambda x: (x[1].min_replicas, -x[0]))[1]
        return starts[0][1] if starts else None

    # --- The loop -------------------------------------------------------------------------

    def run(self) -> RawResult:
        """Simulate from 0 to ``end`` seconds; returns the raw counters and timelines."""
        started = wallclock.perf_counter()
        trace = self.trace
        ts = trace.t_s.tolist()
        ms = [self.trace_models[i] for i in trace.model.tolist()]
        ps = trace.prompt_tokens.tolist()
        os_ = trace.output_tokens.tolist()
        n = len(ts)
        keys = self.prefix_keys
        if trace.has_prefixes:
            pre = [None if x < 0 else (keys[x], k)
                   for x, k in zip(trace.prefix.tolist(), trace.prefix_tokens.tolist())]
        else:
            pre = [None] * n
        end = self.end
        completions, control = self.completions, self.control
        heappush, heappop = heapq.heappush, heapq.heappop
        seq = self._seq
        self.loads.start()
        met_by_hour = self.met_by_hour
        cfg_predict = self.config.predictive_warmth
        i = 0
        while True:
            ta = ts[i] if i < n else INF
            tc = completions[0][0] if completions else INF
            tk = control[0][0] if control else INF
            tp = min(self.requested, self.next_tick)
            if tc <= tk and tc <= tp and tc <= ta:
                if tc > end:
                    break
                t, _, r = heappop(completions)
                if not r.alive:
                    continue
                # A request finished: free its slot for the next one waiting at the engine.
                r.in_flight -= 1
                r.last_used = t
                m = r.model
                m.served += 1
                q = r.queue
                if q:
                    arrival, ttft_s, dur = q.popleft()
                    x = t - arrival + ttft_s
                    m.ttft.append(x)
                    if x <= m.slo_s:
                        m.slo_met += 1
                        met_by_hour[int(arrival // 3600)] += 1
                    heappush(completions, (t + dur, next(seq), r))
                else:
                    r.running -= 1
            elif tk <= tp and tk <= ta:
                if tk > end:
                    break
                t, _, kind, r = heappop(control)
                if kind == WARMTH:
                    if r.predicted_until_s <= t:
                        self._predict(r, t)
                elif kind >= POLL:
                    self.loads.on_event(kind, t)
                elif kind == _READY:
                    self._ready(t, r)
                elif kind == _STOPPED:
                    self._stopped(t, r)
                elif r.state == S.PLACING:
                    check_transition(r.state, S.STARTING)
                    r.state = S.STARTING
                    r.changed_dt = self.at(t)
            elif tp <= ta:
                if tp > end:
                    break
                self._pass(tp)
            else:
                if ta > end:
                    break
                m = ms[i]
                p, o, prefix = ps[i], os_[i], pre[i]
                i += 1
                if m is None:
                    self.unknown_model += 1
                    continue
                m.requests += 1
                if m.spec.on_demand and cfg_predict:
                    self._asked(m, ta)
                ttft_s = m.ttft_base_s + p * m.prefill_s
                dur = ttft_s + o * m.tpot_s
                if m.ready:
                    self._route(m, ta, ta, ttft_s, dur, prefix)
                else:
                    self._no_ready_replica(m, ta, ttft_s, dur, prefix)
        self.after_end = n - i
        self._finish(end)
        return RawResult(self, wallclock.perf_counter() - started)

    def _route(self, m: SimModel, t: float, arrival: float, ttft_s: float, dur: float,
               prefix: tuple[int, int] | None = None) -> None:
        """Send a request to a ready replica: without a ``prefix`` (``(hash, tokens)``) the one
        with the fewest in flight (ties: the first), else by the model's policy
        (``routing.choose``, ties rotating per model as the gateway's do), with its prefix
        cache consulted and updated (module docstring)."""
        if m.wanted_s is None and m.spec.on_demand:
            # fleet.control.usage.keep_demand_alive: use of a ready replica of an on-demand
            # model nobody wanted (kept warm on a prediction, or just done with) wants it
            # again — at once here, within a usage flush there.
            m.wanted_s, m.wanted_dt = t, None
            self.hot.add(m)
        ready = m.ready
        r = ready[0]
        if prefix is None:
            if len(ready) > 1:
                least = r.in_flight
                for x in ready:
                    if x.in_flight < least:
                        r, least = x, x.in_flight
        else:
            key, tokens = prefix
            chosen = choose(m.policy, [(x.id, x.in_flight) for x in ready], RouteKeys(blocks=(key,)),
                            m.recent, next(m.turns)).replica_id
            r = next(x for x in ready if x.id == chosen)
            m.prefix_routed += 1
            if r.cache.use(key):
                m.prefix_hits += 1
                m.prefill_tokens_saved += tokens
                saved_s = tokens * m.prefill_s
                ttft_s -= saved_s
                dur -= saved_s
        r.in_flight += 1
        r.last_used = t
        if r.running < m.slots:
            r.running += 1
            x = t - arrival + ttft_s
            m.ttft.append(x)
            if x <= m.slo_s:
                m.slo_met += 1
                self.met_by_hour[int(arrival // 3600)] += 1
            heapq.heappush(self.completions, (t + dur, next(self._seq), r))
        else:
            r.queue.append((arrival, ttft_s, dur))

    def _no_ready_replica(self, m: SimModel, t: float, ttft_s: float, dur: float,
                          prefix: tuple[int, int] | None) -> None:
        """The gateway's cold path: hold (and want, for an on-demand model) or answer 503."""
        if m.spec.on_demand:
            self._hold(m, t, ttft_s, dur, prefix)
            self._want(m, t)
        elif m.coming_up:
            self._hold(m, t, ttft_s, dur, prefix)
        else:
            m.rejected_unservable += 1

    def _hold(self, m: SimModel, t: float, ttft_s: float, dur: float, prefix: tuple[int, int] | None) -> None:
        m.held.append((t, ttft_s, dur, prefix))
        m.held_count += 1
        self.holding.add(m)
        self.hot.add(m)

    def _want(self, m: SimModel, t: float) -> None:
        """``fleet.control.demand.want``: wanted now, a failed placement forgotten, a pass at once.
        While a replica of the model is already on its way, the pass this would request
        decides nothing new for it, so the simulator leaves it to the next tick."""
        m.wanted_s = t
        m.wanted_dt = None
        self.hot.add(m)
        if m.unservable or not m.coming_up:
            m.unservable = False
            self._request_pass(t)

    def _request_pass(self, t: float) -> None:
        when = max(t, self.last_pass + self.config.pass_gap_s)
        self.requested = min(self.requested, when)

    # --- Agents ---------------------------------------------------------------------------

    def _ready(self, t: float, r: SimReplica) -> None:
        if r.state not in COMING_UP:
            return  # stopped before it became ready
        check_transition(r.state, S.READY)
        r.state = S.READY
        r.changed_dt = self.at(t)
        m = r.model
        m.coming_up -= 1
        m.ready.append(r)
        self.loads.ready(t, r)
        timeout = self.cold_start_timeout_s
        held = m.held
        while held:
            arrival, ttft_s, dur, prefix = held.popleft()
            if t >= arrival + timeout:
                m.rejected_timeout += 1
                continue
            m.hold_s.append(t - arrival)
            self._route(m, t, arrival, ttft_s, dur, prefix)
        self.holding.discard(m)

    def _stopped(self, t: float, r: SimReplica) -> None:
        check_transition(r.state, S.STOPPED)
        r.state = S.STOPPED
        m = r.model
        del self.live[r.id]
        m.reps.remove(r)
        self.loads.gone(r)
        self._release(t, r)
        self._request_pass(t)  # fleet.control.reports: a stopped replica frees room, so a pass runs

    def _release(self, t: float, r: SimReplica) -> None:
        m = r.model
        held_s = t - r.placed_at
        m.gpu_s += held_s * m.spec.gpus_needed
        m.replica_s += held_s
        self.gpus_held -= m.spec.gpus_needed
        self.gpu_timeline.append((t, self.gpus_held))

    def _cut_off(self, r: SimReplica) -> None:
        """The engine stops: whatever is still in flight there is lost."""
        r.model.cut_off += r.in_flight
        r.alive = False
        r.in_flight = r.running = 0
        r.queue.clear()

    # --- Passes ---------------------------------------------------------------------------

    def _pass(self, t: float) -> None:
        cfg = self.config
        if t >= self.next_tick:
            # The tick grid is k × interval; a requested pass does not move it.
            interval = cfg.reconcile_interval_s
            self.next_tick = (math.floor(t / interval + 1e-9) + 1) * interval
        if self.requested <= t:
            self.requested = INF
        self.last_pass = t
        now = self.at(t)
        self._expire_held(t)
        self._windows_due(t, now)
        included = self._included(t)
        self.passes += 1
        self.pass_models += len(included)
        if self.controller is None and self._quiet(included, now):
            self.quiet_passes += 1
            if cfg.check_pruning:
                self._check(t, now, None, included)
            return
        snapshot = self._snapshot(t, now, included)
        began = wallclock.perf_counter()
        result = planner.plan(snapshot, now) if self.controller is None else self.controller.plan(snapshot, now)
        self.plan_wall_s += wallclock.perf_counter() - began
        if cfg.check_pruning and self.controller is None:
            self._check(t, now, result, included)
        self._apply(result, t, now, included)

    def _expire_held(self, t: float) -> None:
        timeout = self.cold_start_timeout_s
        for m in list(self.holding):
            held = m.held
            while held and t >= held[0][0] + timeout:
                held.popleft()
                m.rejected_timeout += 1
            if not held:
                self.holding.discard(m)

    def _load(self, m: SimModel) -> tuple[int, int | None, int | None] | None:
        """``fleet.control.snapshot._loads`` at this pass: over ready replicas, from engine
        metrics when the profile declares them, else in-flight counts as running with
        nothing waiting — as the report path delivers them (:mod:`.loads`)."""
        return self.loads.load(m, self.last_pass)

    def _model_view(self, m: SimModel) -> planner.ModelView:
        if m.wanted_s is not None and m.wanted_dt is None:
            m.wanted_dt = self.at(m.wanted_s)
        load = self._load(m)
        predicted = m.predicted if self.policy.predictive_warmth else None
        key = (m.wanted_dt, m.window_min, m.window_max, m.extra, m.busy_since, m.quiet_since, m.observed,
               m.crowded_since, load, m.trend, m.next_window, predicted, m.warm_evicted_dt)
        if key != m.view_key:
            spec = m.spec
            m.view = planner.ModelView(
                id=m.id, name=spec.name, profile=m.profile, min_replicas=spec.min_replicas,
                max_replicas=spec.max_replicas, on_demand=spec.on_demand, idle_timeout_s=spec.idle_timeout_s,
                wanted_at=m.wanted_dt, window_min=m.window_min, window_max=m.window_max,
                extra_replicas=m.extra, busy_since=m.busy_since, quiet_since=m.quiet_since,
                observed_per_replica=m.observed, crowded_since=m.crowded_since, load=Load(*load) if load else None,
                measured_per_replica=spec.latency.slots if spec.latency.measured else None,
                trend=m.trend, cold_start=m.cold_start, next_window=m.next_window, predicted=predicted,
                warm_evicted_at=m.warm_evicted_dt,
            )
            m.view_key = key
        return m.view

    def _replica_view(self, r: SimReplica, t: float, fresh: bool) -> planner.ReplicaView:
        """As the gateway reports it: last use (``now`` while requests are in flight; None if
        never used) and the in-flight count. A replica of a model left out of the pass only
        needs its state and resources right, so its view is rebuilt when the state moves."""
        if not fresh and r.view is not None and r.view.state == r.state:
            return r.view
        flight = r.in_flight
        used = t if flight else r.last_used
        key = (r.state, r.changed_dt, used, flight)
        if key != r.view_key:
            r.view = planner.ReplicaView(
                id=r.id, model_id=r.model.id, agent_id=r.agent_id, state=r.state, gpu_indices=r.gpus,
                cpu_cores=r.cpu_cores, memory_mib=r.memory_mib, state_changed_at=r.changed_dt,
                last_used_at=None if used is None else self.at(used), in_flight=flight,
            )
            r.view_key = key
        return r.view

    def _agent_views(self, t: float) -> tuple[planner.AgentView, ...]:
        if t - self._agents_seen >= self.config.heartbeat_s:
            self._agents_seen = t
            seen = self.at(t)
            self._agents = tuple(
                planner.AgentView(id=i + 1, name=a.name, connected=True, last_seen_at=seen,
                                  gpus=self._gpu_lists[i + 1], cpu_cores=a.cpu_cores, memory_mib=a.memory_mib)
                for i, a in enumerate(self.fleet))
        return self._agents

    def _snapshot(self, t: float, now: datetime, included: list[SimModel], full: bool = False) -> planner.Snapshot:
        """``fleet.control.snapshot.load_snapshot`` for ``included`` models (every model if
        ``full``) and every replica holding resources."""
        models = self.models if full else included
        fresh = {m.id for m in models}
        replicas = tuple(self._replica_view(r, t, full or r.model.id in fresh or r.state == S.DRAINING)
                         for r in self.live.values())
        return planner.Snapshot(self.policy, self._agent_views(t), tuple(self._model_view(m) for m in models),
                                replicas)

    def _apply(self, result: planner.Plan, t: float, now: datetime, included: list[SimModel]) -> None:
        """``fleet.control.reconciler.apply_plan`` in memory."""
        warm = self.config.warm_start and t == 0.0
        for action in result.actions:
            if isinstance(action, planner.Place):
                m = self.by_id[action.model_id]
                r = SimReplica(next(self._rid), m, action, t, now)
                self.live[r.id] = r
                m.reps.append(r)
                m.coming_up += 1
                m.active += 1
                m.placements += 1
                m.max_active = max(m.max_active, m.active)
                m.timeline.append((t, m.active))
                self.gpus_held += m.spec.gpus_needed
                self.gpu_timeline.append((t, self.gpus_held))
                if warm:
                    heapq.heappush(self.control, (t, next(self._seq), _READY, r))
                else:
                    heapq.heappush(self.control, (t + self.config.ack_s, next(self._seq), _ACK, r))
                    heapq.heappush(self.control, (t + m.spec.cold_start_s, next(self._seq), _READY, r))
            else:
                self._move(action, t, now)
        for m in included:
            outcome = result.models.get(m.id)
            if outcome is None:
                continue
            m.extra = outcome.scaling.extra
            m.busy_since = outcome.scaling.busy_since
            m.quiet_since = outcome.scaling.quiet_since
            m.observed = outcome.scaling.observed_per_replica
            m.crowded_since = outcome.scaling.crowded_since
            m.trend = outcome.scaling.trend
            m.unservable = outcome.unservable
            if outcome.warm_evicted:
                m.warm_evicted_dt = now
            if outcome.forget_demand:
                m.wanted_s = m.wanted_dt = None
            if outcome.scaled is not None:
                self._record_step(m, t, outcome.scaled)
            if m.held and (outcome.unservable or (not m.spec.on_demand and not m.coming_up and not m.ready)):
                # The gateway answers a held request 503 once a pass after its want says so.
                m.rejected_unservable += len(m.held)
                m.held.clear()
                self.holding.discard(m)

    def _move(self, action: planner.Move, t: float, now: datetime) -> None:
        r = self.live.get(action.replica_id)
        if r is None:
            return
        old, new = r.state, action.to
        check_transition(old, new)
        m = r.model
        r.state = new
        r.changed_dt = now
        if old == S.READY:
            m.ready.remove(r)
        if old in COMING_UP:
            m.coming_up -= 1
        if old in COUNTS_TOWARDS_DESIRED and new not in COUNTS_TOWARDS_DESIRED:
            m.active -= 1
            m.timeline.append((t, m.active))
        if old == S.DRAINING:
            del self.draining[r.id]
        if new == S.DRAINING:
            self.draining[r.id] = r
            why = action.reason
            if action.cause == planner.MoveCause.EVICTION:
                m.evictions += 1
                kind = "eviction"
            elif action.cause == planner.MoveCause.IDLE:
                m.idle_stops += 1
                kind = "idle"
            else:
                m.scale_downs += 1
                kind = "surplus"
            self.events.append({"t_s": round(t, 3), "kind": kind, "model": m.spec.name, "replica": r.id,
                                "last_used_s": None if r.last_used is None else round(r.last_used, 3),
                                "reason": why})
        elif new in (S.STOPPING, S.LOST):
            if r.in_flight:
                self._cut_off(r)
            r.alive = False
            heapq.heappush(self.control, (t + self.config.stop_s, next(self._seq), _STOPPED, r))
            if new == S.LOST:
                r.state = S.STOPPING  # nothing goes silent here; treat it as a stop

    def _record_step(self, m: SimModel, t: float, scaled: tuple[int, int, str]) -> None:
        before, after, why = scaled
        if m.steps:
            last_t, last_from, last_to, _ = m.steps[-1]
            if (after - before) * (last_to - last_from) < 0 and t - last_t <= self.config.oscillation_window_s:
                m.oscillations += 1
        m.steps.append((t, before, after, why))

    def _finish(self, end: float) -> None:
        """Close the books at ``end``: held requests that never got a replica timed out or
        are unfinished, as are requests still at an engine; replicas still up are billed."""
        for m in self.models:
            for arrival, *_ in m.held:
                if end >= arrival + self.cold_start_timeout_s:
                    m.rejected_timeout += 1
                else:
                    self.unfinished += 1
            m.held.clear()
        for r in list(self.live.values()):
            if r.alive:
                self.unfinished += r.in_flight
            self._release(end, r)
        self.gpu_timeline.append((end, self.gpus_held))


class RawResult:
    """What one run produced: the simulator's models and fleet counters, and its wall time."""

    def __init__(self, sim: Simulator, wall_s: float) -> None:
        self.sim = sim
        self.wall_s = wall_s
