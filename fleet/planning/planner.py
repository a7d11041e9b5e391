"""The reconciler's pure core: ``plan(snapshot, now)`` → actions and explanations.

No ORM, no I/O, no clock of its own: everything it knows comes in the snapshot and ``now``
(DESIGN, Reconciler rules). The shell in ``fleet.control.reconciler`` loads the snapshot from the
database, applies the actions and stores the explanations.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from enum import Enum
from datetime import datetime

from fleet.planning.scaling import Load, ScalingPolicy, ScalingState, evaluate
from fleet.states import COMING_UP, COUNTS_TOWARDS_DESIRED, HOLDS_RESOURCES, ReplicaState

S = ReplicaState


# --- Snapshot ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """Cluster-wide rules for one pass; durations in seconds."""

    stopped: bool = False
    default_idle_timeout_s: float = 600.0
    min_idle_before_eviction_s: float = 60.0
    drain_grace_s: float = 30.0
    agent_lost_after_s: float = 20.0
    backoff_base_s: float = 5.0
    backoff_cap_s: float = 300.0
    #: A replica its agent has not taken up (still placing) this long is failed and replaced.
    placing_timeout_s: float = 120.0
    scaling: ScalingPolicy = ScalingPolicy()
    #: Since when the control plane could record heartbeats without a gap (None: always).
    #: An agent's silence is counted from the later of its last message and this instant,
    #: so a control plane (or database) that stalled does not blame the agents for it.
    listening_since: datetime | None = None


@dataclass(frozen=True)
class GpuView:
    index: int
    memory_total_mib: int


@dataclass(frozen=True)
class AgentView:
    """An agent as the pass sees it. ``last_seen_at`` is when its last message arrived."""

    id: int
    name: str
    connected: bool = True
    cordoned: bool = False
    last_seen_at: datetime | None = None
    gpus: tuple[GpuView, ...] = ()
    cpu_cores: float = 0.0
    memory_mib: int = 0


@dataclass(frozen=True)
class ProfileView:
    """Resources one replica needs: ``gpus_needed`` GPUs of ``gpu_memory_mib`` each, or
    (``gpus_needed == 0``) ``cpu_cores`` and ``memory_mib`` of the machine."""

    id: int
    gpus_needed: int = 0
    gpu_memory_mib: int = 0
    cpu_cores: float = 0.0
    memory_mib: int = 0

    def describe(self) -> str:
        if self.gpus_needed:
            gib = self.gpu_memory_mib / 1024
            return f"{self.gpus_needed} free GPU{'s' if self.gpus_needed > 1 else ''} of {gib:g} GiB"
        return f"{self.cpu_cores:g} free CPU cores and {self.memory_mib} MiB RAM"


@dataclass(frozen=True)
class ModelView:
    """A catalog model plus the fleet's memory of it.

    ``wanted_at``: last time a request asked for it (moved forward by use); ``window_min``
    / ``window_max``: the schedule window in force now, if any; ``extra_replicas``: what load
    scaling added; ``failures``: when its recent replicas failed, oldest first.
    """

    id: int
    name: str
    profile: ProfileView | None
    min_replicas: int = 0
    max_replicas: int = 1
    on_demand: bool = False
    idle_timeout_s: float | None = None
    external: bool = False
    wanted_at: datetime | None = None
    window_min: int | None = None
    window_max: int | None = None
    extra_replicas: int = 0
    busy_since: datetime | None = None
    quiet_since: datetime | None = None
    #: Capacity per replica learned from load, and since when fewer replicas would be too
    #: full (``fleet.planning.scaling.ScalingState``).
    observed_per_replica: int | None = None
    crowded_since: datetime | None = None
    #: Load over its ready replicas (None: unknown) and measured capacity per replica.
    load: Load | None = None
    measured_per_replica: int | None = None
    failures: tuple[datetime, ...] = ()
    last_error: str = ""


@dataclass(frozen=True)
class ReplicaView:
    """A replica. ``last_used_at`` None = never told; ``in_flight`` None = unknown;
    ``back``: it is lost, but its agent has since reported the engine ready again."""

    id: int
    model_id: int
    agent_id: int
    state: ReplicaState
    gpu_indices: tuple[int, ...] = ()
    cpu_cores: float = 0.0
    memory_mib: int = 0
    state_changed_at: datetime | None = None
    last_used_at: datetime | None = None
    in_flight: int | None = None
    back: bool = False


@dataclass(frozen=True)
class Snapshot:
    policy: Policy
    agents: tuple[AgentView, ...]
    models: tuple[ModelView, ...]
    replicas: tuple[ReplicaView, ...]


# --- Result --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    """Create a replica of ``model_id`` on ``agent_id`` holding these resources."""

    model_id: int
    agent_id: int
    gpu_indices: tuple[int, ...]
    cpu_cores: float
    memory_mib: int
    reason: str


class MoveCause(str, Enum):
    """Why a replica is moved, for programs (the simulator's counts, metrics); ``Move.reason``
    says the same for people, with the figures."""

    AGENT_SILENT = "agent_silent"      # its agent went quiet: lost, or stopped if draining
    NOT_TAKEN_UP = "not_taken_up"      # placed, but the agent never started it
    DRAINED = "drained"                # draining and nothing in flight any more
    DRAIN_GRACE_OVER = "drain_grace_over"
    WANTED_AGAIN = "wanted_again"      # a draining replica serves again
    IDLE = "idle"                      # on-demand model unused for its idle timeout
    CLUSTER_STOPPED = "cluster_stopped"
    SURPLUS = "surplus"                # more running than wanted (load, schedule, catalog)
    EVICTION = "eviction"              # making room for another model
    AGENT_BACK = "agent_back"          # a lost replica's agent returned with it ready
    DUPLICATE = "duplicate"            # came back, but enough run elsewhere


@dataclass(frozen=True)
class Move:
    """Move replica ``replica_id`` to state ``to`` (drain, stop, mark lost), for ``cause``;
    ``reason`` is the sentence shown to operators."""

    replica_id: int
    to: ReplicaState
    reason: str
    cause: MoveCause


@dataclass
class ModelOutcome:
    """What the pass concluded for one model, for the admin, ``explain`` and the gateway."""

    desired: int = 0
    active: int = 0
    ready: int = 0
    reason: str = ""
    #: Could not place what it needs; ``reason`` says why (the gateway answers 503 with it).
    unservable: bool = False
    #: Its on-demand demand is over (idle, or evicted to make room): clear ``wanted_at``.
    forget_demand: bool = False
    #: Load-scaling memory to store, and the step taken this pass (from, to, why) if any.
    scaling: ScalingState = field(default_factory=ScalingState)
    scaled: tuple[int, int, str] | None = None


@dataclass
class Plan:
    actions: list[Place | Move] = field(default_factory=list)
    models: dict[int, ModelOutcome] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def places(self) -> list[Place]:
        return [a for a in self.actions if isinstance(a, Place)]

    @property
    def moves(self) -> list[Move]:
        return [a for a in self.actions if isinstance(a, Move)]


# --- Rules ---------------------------------------------------------------------------------


def idle_timeout_s(model: ModelView, policy: Policy) -> float:
    """A model's own idle timeout, else the cluster default (seconds)."""
    return model.idle_timeout_s if model.idle_timeout_s else policy.default_idle_timeout_s


def base_replicas(model: ModelView, policy: Policy, now: datetime) -> int:
    """Replicas a model runs without load: the window's min (else its own min); an
    on-demand model with that at 0 runs one while wanted within its idle timeout."""
    if model.external:
        return 0
    low = min_replicas_now(model)
    if not model.on_demand or low > 0:
        return low
    if model.wanted_at is None:
        return 0
    if (now - model.wanted_at).total_seconds() > idle_timeout_s(model, policy):
        return 0
    return 1


def min_replicas_now(model: ModelView) -> int:
    """The floor eviction must respect: the window's min, else the model's min."""
    return model.window_min if model.window_min is not None else model.min_replicas


def desired_replicas(model: ModelView, policy: Policy, now: datetime) -> int:
    """DESIGN ``desired(model)``: 0 when stopped or external; else base plus the
    load-scaling extra, capped at max(window max or model max, base)."""
    if policy.stopped or model.external:
        return 0
    base = base_replicas(model, policy, now)
    if base == 0:
        return 0
    ceiling = model.window_max if model.window_max else model.max_replicas
    return min(base + model.extra_replicas, max(ceiling, base))


def backoff_remaining_s(model: ModelView, policy: Policy, now: datetime) -> float:
    """Seconds before a model with recently failed replicas may be placed again:
    ``base · 2^(n-1)`` after the n-th consecutive failure, capped."""
    if not model.failures:
        return 0.0
    n = len(model.failures)
    wait = min(policy.backoff_base_s * 2 ** (n - 1), policy.backoff_cap_s)
    elapsed = (now - model.failures[-1]).total_seconds()
    return max(0.0, wait - elapsed)


def _age_s(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else (now - then).total_seconds()


def silent_for_s(agent: AgentView, policy: Policy, now: datetime) -> float | None:
    """Seconds an agent has been silent that count against it: since its last message, or
    since the control plane could listen again if that is later. None: never heard from
    (and no listening window to count from)."""
    heard = agent.last_seen_at
    if policy.listening_since is not None and (heard is None or heard < policy.listening_since):
        heard = policy.listening_since
    return _age_s(now, heard)


def _fmt_s(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


# --- Capacity bookkeeping --------------------------------------------------------------------


@dataclass
class _Room:
    """Free resources on one agent during a pass (mutated as the pass places)."""

    agent: AgentView
    free_gpus: dict[int, int]  # index -> memory_total_mib
    free_cores: float
    free_memory_mib: int

    def fit(self, profile: ProfileView) -> tuple[tuple[int, ...], str | None]:
        """GPU indices (or ``()`` for CPU) if ``profile`` fits here, else the reason."""
        name = self.agent.name
        if profile.gpus_needed:
            if not self.agent.gpus:
                return (), f"{name}: no GPUs"
            big_enough = sorted(
                (mem, idx) for idx, mem in self.free_gpus.items() if mem >= profile.gpu_memory_mib
            )
            if len(big_enough) >= profile.gpus_needed:
                return tuple(sorted(idx for _, idx in big_enough[: profile.gpus_needed])), None
            if len(self.free_gpus) < profile.gpus_needed:
                return (), f"{name}: {len(self.free_gpus)} free"
            largest = max(self.free_gpus.values(), default=0)
            return (), f"{name}: {len(big_enough)} free with {profile.gpu_memory_mib} MiB (largest {largest} MiB)"
        if self.free_cores + 1e-9 < profile.cpu_cores:
            return (), f"{name}: {self.free_cores:g} CPU cores free"
        if self.free_memory_mib < profile.memory_mib:
            return (), f"{name}: {self.free_memory_mib} MiB RAM free"
        return (), None

    def take(self, gpus: tuple[int, ...], profile: ProfileView) -> None:
        for idx in gpus:
            self.free_gpus.pop(idx, None)
        if not profile.gpus_needed:
            self.free_cores -= profile.cpu_cores
            self.free_memory_mib -= profile.memory_mib

    def give_back(self, replica: ReplicaView) -> None:
        by_index = {g.index: g.memory_total_mib for g in self.agent.gpus}
        for idx in replica.gpu_indices:
            if idx in by_index:
                self.free_gpus[idx] = by_index[idx]
        self.free_cores += replica.cpu_cores
        self.free_memory_mib += replica.memory_mib


def _group_reasons(reasons: list[str], limit: int = 6) -> str:
    """Join per-agent reasons, grouping identical causes ("12 agents: not connected")."""
    by_cause: dict[str, list[str]] = defaultdict(list)
    for reason in reasons:
        name, _, cause = reason.partition(": ")
        by_cause[cause or name].append(name)
    parts = []
    for cause, names in by_cause.items():
        if len(names) == 1:
            parts.append(f"{names[0]}: {cause}")
        else:
            shown = ", ".join(names[:3]) + ("…" if len(names) > 3 else "")
            parts.append(f"{len(names)} agents ({shown}): {cause}")
    text = "; ".join(parts[:limit])
    if len(parts) > limit:
        text += f"; and {len(parts) - limit} more causes"
    return text


# --- The pass --------------------------------------------------------------------------------


def plan(snapshot: Snapshot, now: datetime) -> Plan:
    """One reconcile pass: which replicas to place, drain, stop or mark lost, and why.

    Deterministic for a given snapshot and ``now``. Rules, in order:

    1. Agents silent for ``agent_lost_after_s`` lose their replicas (→ lost) — unless more
       than half the agents went silent together, which means this control plane stalled:
       then nothing is marked lost (DESIGN, "Lost agents vs a stalled control plane").
       Silence is counted from ``policy.listening_since`` at the earliest.
    2. Draining replicas stop when their in-flight count is known to be 0 or the drain
       grace has passed.
    3. Per model (fixed-min models first, then on-demand ones by when they were wanted):
       place missing replicas (spread across agents, then pack), making room for a wanted
       on-demand model by evicting idle replicas of other on-demand models, least recently
       used first; surplus replicas drain (ready) or stop (not yet ready). Lost replicas
       whose agent is heard from again are duplicates if the model's other replicas are
       ready in the numbers wanted: they stop first. Otherwise a lost replica reported
       ready is taken back (→ ready) and the others, not ready yet, are the surplus.
    """
    policy = snapshot.policy
    result = Plan()
    agents = {a.id: a for a in snapshot.agents}
    states: dict[int, ReplicaState] = {r.id: r.state for r in snapshot.replicas}

    # 1. Lost agents.
    silence = {a.id: silent_for_s(a, policy, now) for a in snapshot.agents}
    stale = {
        a.id
        for a in snapshot.agents
        if silence[a.id] is None or silence[a.id] > policy.agent_lost_after_s
    }
    with_replicas = {r.agent_id for r in snapshot.replicas if r.state in HOLDS_RESOURCES}
    stale_with_work = stale & with_replicas
    recently_alive = {
        a.id for a in snapshot.agents if a.last_seen_at is not None and a.id in with_replicas
    }
    storm = len(recently_alive) >= 3 and len(stale_with_work) * 2 > len(recently_alive)
    if storm:
        result.notes.append(
            f"{len(stale_with_work)} of {len(recently_alive)} agents went silent at once: "
            "assuming the control plane stalled; marking none lost"
        )
    else:
        for r in snapshot.replicas:
            if r.agent_id in stale and r.state in HOLDS_RESOURCES:
                age = silence[r.agent_id]
                heard = "never heard from" if age is None else f"silent for {_fmt_s(age)}"
                if r.state in COUNTS_TOWARDS_DESIRED:
                    result.actions.append(Move(r.id, S.LOST, f"agent {agents[r.agent_id].name} {heard}",
                                               MoveCause.AGENT_SILENT))
                    states[r.id] = S.LOST
                elif r.state == S.DRAINING:  # on its way out anyway: never to run again
                    result.actions.append(Move(r.id, S.STOPPING, f"agent {agents[r.agent_id].name} {heard}",
                                               MoveCause.AGENT_SILENT))
                    states[r.id] = S.STOPPING
                # stopping: the agent stops it when back, or reconnects without it (fleet.control.reports)

    usable: dict[int, str | None] = {}
    for a in snapshot.agents:
        if a.id in stale and not storm:
            usable[a.id] = f"{a.name}: not heard from"
        elif not a.connected:
            usable[a.id] = f"{a.name}: not connected"
        elif a.cordoned:
            usable[a.id] = f"{a.name}: cordoned"
        else:
            usable[a.id] = None

    # Lost replicas whose agent is heard from again: their engines may still run there.
    returning = {
        r.id for r in snapshot.replicas
        if states[r.id] == S.LOST and r.agent_id in agents and r.agent_id not in stale
    }

    # Free resources per agent, after every replica that still holds some.
    rooms: dict[int, _Room] = {}
    for a in snapshot.agents:
        rooms[a.id] = _Room(a, {g.index: g.memory_total_mib for g in a.gpus}, a.cpu_cores, a.memory_mib)
    for r in snapshot.replicas:
        if (states[r.id] in HOLDS_RESOURCES or r.id in returning) and r.agent_id in rooms:
            room = rooms[r.agent_id]
            for idx in r.gpu_indices:
                room.free_gpus.pop(idx, None)
            room.free_cores -= r.cpu_cores
            room.free_memory_mib -= r.memory_mib

    # 1b. Placed but never taken up by a connected agent: fail it (and so replace it with
    # backoff) instead of letting it block the model forever.
    for r in snapshot.replicas:
        if states[r.id] != S.PLACING or r.state_changed_at is None:
            continue
        waited = (now - r.state_changed_at).total_seconds()
        if waited >= policy.placing_timeout_s and not usable.get(r.agent_id):
            result.actions.append(Move(r.id, S.FAILED, f"agent {agents[r.agent_id].name} did not take it up "
                                                       f"within {_fmt_s(policy.placing_timeout_s)}",
                                       MoveCause.NOT_TAKEN_UP))
            states[r.id] = S.FAILED
            if r.agent_id in rooms:
                rooms[r.agent_id].give_back(r)

    # 2. Draining → stopping.
    for r in snapshot.replicas:
        if states[r.id] != S.DRAINING:
            continue
        draining_for = _age_s(now, r.state_changed_at) or 0.0
        if r.in_flight == 0:
            result.actions.append(Move(r.id, S.STOPPING, "drained: no requests in flight", MoveCause.DRAINED))
            states[r.id] = S.STOPPING
        elif draining_for >= policy.drain_grace_s:
            flight = "unknown" if r.in_flight is None else str(r.in_flight)
            result.actions.append(
                Move(r.id, S.STOPPING, f"drain grace of {_fmt_s(policy.drain_grace_s)} over ({flight} in flight)",
                     MoveCause.DRAIN_GRACE_OVER)
            )
            states[r.id] = S.STOPPING

    # 3. Models.
    by_model: dict[int, list[ReplicaView]] = defaultdict(list)
    for r in snapshot.replicas:
        by_model[r.model_id].append(r)
    # Load scaling first: it moves each model's extra replicas, which desired() reads.
    scaled_models = []
    steps = {}
    for m in snapshot.models:
        base = base_replicas(m, policy, now) if not policy.stopped else 0
        ceiling = m.window_max if m.window_max else m.max_replicas
        starting = any(states[r.id] in COMING_UP for r in by_model[m.id])
        step = evaluate(base, ceiling, m.load, m.measured_per_replica, starting,
                        ScalingState(m.extra_replicas, m.busy_since, m.quiet_since, m.observed_per_replica,
                                     m.crowded_since),
                        now, policy.scaling)
        steps[m.id] = step
        scaled_models.append(replace(m, extra_replicas=step.state.extra))
    snapshot = replace(snapshot, models=tuple(scaled_models))
    models = {m.id: m for m in snapshot.models}
    desired = {m.id: desired_replicas(m, policy, now) for m in snapshot.models}
    forgotten: set[int] = set()
    claimed: set[int] = set()  # releasing replicas some model is already waiting for

    def active_of(model_id: int) -> list[ReplicaView]:
        return [r for r in by_model[model_id] if states[r.id] in COUNTS_TOWARDS_DESIRED]

    def order_key(m: ModelView) -> tuple:
        return (m.on_demand, m.wanted_at or now, m.name)

    for m in sorted(snapshot.models, key=order_key):
        step = steps[m.id]
        outcome = ModelOutcome(desired=desired[m.id], scaling=step.state,
                               scaled=(step.from_replicas, step.to_replicas, step.why) if step.moved else None)
        result.models[m.id] = outcome
        if m.external:
            outcome.reason = "external: served at its base URL, nothing to place"
            continue
        if policy.stopped:
            outcome.reason = "cluster stopped"
        if m.on_demand and m.wanted_at is not None and base_replicas(m, policy, now) == 0:
            if not policy.stopped:
                outcome.forget_demand = True
                idle = (now - m.wanted_at).total_seconds()
                outcome.reason = f"idle for {_fmt_s(idle)} (timeout {_fmt_s(idle_timeout_s(m, policy))}): scaled to zero"

        _settle_returning(m, desired[m.id], by_model[m.id], returning, states, agents, result)
        active = active_of(m.id)
        missing = desired[m.id] - len(active)
        if missing > 0 and not policy.stopped:
            # A replica still draining is warm: serving again beats a cold start.
            for r in sorted((r for r in by_model[m.id] if states[r.id] == S.DRAINING and not usable.get(r.agent_id)),
                            key=lambda r: -r.id)[:missing]:
                result.actions.append(Move(r.id, S.READY, "wanted again: drain cancelled", MoveCause.WANTED_AGAIN))
                states[r.id] = S.READY
                missing -= 1
            active = active_of(m.id)
        if missing > 0 and m.profile is None:
            outcome.reason = "no engine profile: cannot place"
            outcome.unservable = True
        elif missing > 0:
            wait = backoff_remaining_s(m, policy, now)
            if wait > 0:
                outcome.reason = (
                    f"crash loop: {len(m.failures)} failure(s) in a row, next try in {_fmt_s(wait)}"
                    + (f"; last error: {m.last_error}" if m.last_error else "")
                )
            else:
                _place_missing(m, missing, active, result, rooms, usable, snapshot, now,
                               states, by_model, models, desired, forgotten, outcome, claimed)
        elif missing < 0:
            cause = (MoveCause.CLUSTER_STOPPED if policy.stopped
                     else MoveCause.IDLE if outcome.forget_demand else MoveCause.SURPLUS)
            for r in _surplus(active, -missing):
                why = outcome.reason or f"surplus: {len(active)} running, {desired[m.id]} wanted"
                to = S.DRAINING if states[r.id] == S.READY else S.STOPPING
                result.actions.append(Move(r.id, to, why, cause))
                states[r.id] = to  # a stopping one holds its resources until the agent reports it stopped
        elif not outcome.reason and desired[m.id] > 0:
            outcome.reason = f"{desired[m.id]} wanted, all placed"
        if not outcome.reason and desired[m.id] == 0:
            outcome.reason = "not wanted: 0 replicas" if not m.on_demand else "on demand: cold until asked for"

    for m in snapshot.models:
        outcome = result.models[m.id]
        if m.id in forgotten:
            outcome.forget_demand = True
            outcome.desired = desired[m.id]
        reps = by_model[m.id]
        outcome.active = sum(1 for r in reps if states[r.id] in COUNTS_TOWARDS_DESIRED)
        outcome.ready = sum(1 for r in reps if states[r.id] == S.READY)
        outcome.active += sum(1 for p in result.places if p.model_id == m.id)
        if m.failures and not outcome.ready and outcome.desired and not outcome.reason.startswith("crash loop"):
            # Between two failures the next attempt is coming up: still a crash loop.
            outcome.reason = (f"crash loop: {len(m.failures)} failure(s) in a row, trying again ({outcome.reason})"
                              + (f"; last error: {m.last_error}" if m.last_error else ""))
    return result


def _settle_returning(
    m: ModelView, desired: int, replicas: list[ReplicaView], returning: set[int],
    states: dict[int, ReplicaState], agents: dict[int, AgentView], result: Plan,
) -> None:
    """Lost replicas of ``m`` whose agent came back (DESIGN, Reconciler rules: "when it
    returns, duplicates are reconciled away"). Ready replicas elsewhere are kept and the
    returning ones stop first; while the others are not ready yet, a returning replica
    reported ready is taken back instead, and the others become the surplus."""
    back = sorted((r for r in replicas if r.id in returning), key=lambda r: r.id)
    if not back:
        return
    ready_elsewhere = sum(1 for r in replicas if r.id not in returning and states[r.id] == S.READY)
    room = max(0, desired - ready_elsewhere)
    for r in back:
        name = agents[r.agent_id].name
        if r.back and room > 0:
            room -= 1
            result.actions.append(Move(r.id, S.READY, f"agent {name} came back with the engine ready",
                                       MoveCause.AGENT_BACK))
            states[r.id] = S.READY
        elif room == 0:
            result.actions.append(Move(
                r.id, S.STOPPING,
                f"duplicate: agent {name} came back, {ready_elsewhere} ready elsewhere ({desired} wanted)",
                MoveCause.DUPLICATE,
            ))
            states[r.id] = S.STOPPING
        # else: its engine is not ready (yet) and it may still be needed: wait for its report.


def _surplus(active: list[ReplicaView], count: int) -> list[ReplicaView]:
    """Which replicas to take away: not-yet-ready before ready, idle before busy, newest
    first (DESIGN: scale-down drains)."""

    def key(r: ReplicaView) -> tuple:
        coming = r.state in COMING_UP
        flight = r.in_flight if r.in_flight is not None else 1 << 30
        return (not coming, flight, -r.id)

    return sorted(active, key=key)[:count]


def _candidate_rooms(
    m: ModelView, rooms: dict[int, _Room], usable: dict[int, str | None],
    active: list[ReplicaView], placed_here: dict[int, int],
) -> tuple[list[tuple[tuple, int, tuple[int, ...]]], list[str]]:
    """Agents that can take one replica of ``m``, best first, and why the others cannot."""
    assert m.profile is not None
    fits, reasons = [], []
    per_agent = defaultdict(int)
    for r in active:
        per_agent[r.agent_id] += 1
    for agent_id, n in placed_here.items():
        per_agent[agent_id] += n
    for agent_id, room in sorted(rooms.items(), key=lambda kv: kv[1].agent.name):
        if usable[agent_id]:
            reasons.append(usable[agent_id])
            continue
        gpus, why = room.fit(m.profile)
        if why:
            reasons.append(why)
            continue
        if m.profile.gpus_needed:
            left = len(room.free_gpus) - len(gpus)
        else:
            left = room.free_cores - m.profile.cpu_cores
        # Spread replicas of one model across machines, otherwise pack (least room left).
        fits.append(((per_agent[agent_id], left, room.agent.name), agent_id, gpus))
    fits.sort()
    return fits, reasons


def _place_missing(
    m: ModelView, missing: int, active: list[ReplicaView], result: Plan,
    rooms: dict[int, _Room], usable: dict[int, str | None], snapshot: Snapshot,
    now: datetime, states: dict[int, ReplicaState], by_model: dict[int, list[ReplicaView]],
    models: dict[int, ModelView], desired: dict[int, int], forgotten: set[int],
    outcome: ModelOutcome, claimed: set[int],
) -> None:
    assert m.profile is not None
    placed_here: dict[int, int] = defaultdict(int)
    placed = 0
    for _ in range(missing):
        fits, reasons = _candidate_rooms(m, rooms, usable, active, placed_here)
        if not fits:
            waiting_for = _room_being_freed(m, rooms, usable, snapshot, states, claimed)
            if waiting_for:
                # Replicas already draining or stopping will free enough: wait for them
                # rather than evict more, and do not tell held requests it is hopeless.
                outcome.reason = f"waiting for {waiting_for} to stop, then placing {m.name}"
                break
            evicted = _make_room(m, rooms, usable, snapshot, now, states, by_model, models,
                                 desired, forgotten, result) if m.on_demand else None
            if evicted:
                outcome.reason = evicted
            else:
                needs = m.profile.describe()
                detail = _group_reasons(reasons) if reasons else "no agents registered"
                outcome.reason = f"no agent has {needs}; {detail}"
                outcome.unservable = True
                # Nobody is served by wanting it on: the next request asks afresh.
                outcome.forget_demand = m.on_demand
            break
        _, agent_id, gpus = fits[0]
        room = rooms[agent_id]
        room.take(gpus, m.profile)
        placed_here[agent_id] += 1
        placed += 1
        where = room.agent.name + (f" GPU {','.join(map(str, gpus))}" if gpus else "")
        why = f"placed on {where}: {len(active) + placed} of {desired[m.id]} wanted"
        result.actions.append(
            Place(m.id, agent_id, gpus,
                  0.0 if m.profile.gpus_needed else m.profile.cpu_cores,
                  0 if m.profile.gpus_needed else m.profile.memory_mib, why)
        )
        outcome.reason = why


def _room_being_freed(
    m: ModelView, rooms: dict[int, _Room], usable: dict[int, str | None], snapshot: Snapshot,
    states: dict[int, ReplicaState], claimed: set[int],
) -> str | None:
    """If replicas already draining or stopping (and not awaited by another model this pass)
    will make room for ``m`` on a usable agent, claim them and name them; else None."""
    assert m.profile is not None
    releasing: dict[int, list[ReplicaView]] = defaultdict(list)
    for r in snapshot.replicas:
        if states[r.id] in (S.DRAINING, S.STOPPING) and r.id not in claimed and not usable.get(r.agent_id):
            releasing[r.agent_id].append(r)
    for agent_id in sorted(releasing, key=lambda a: rooms[a].agent.name if a in rooms else ""):
        if agent_id not in rooms:
            continue
        room = rooms[agent_id]
        trial = replace(room, free_gpus=dict(room.free_gpus))
        for r in releasing[agent_id]:
            trial.give_back(r)
        _, why = trial.fit(m.profile)
        if why is None:
            claimed.update(r.id for r in releasing[agent_id])
            n = len(releasing[agent_id])
            return f"{n} replica{'s' if n > 1 else ''} on {room.agent.name}"
    return None


def _make_room(
    m: ModelView, rooms: dict[int, _Room], usable: dict[int, str | None], snapshot: Snapshot,
    now: datetime, states: dict[int, ReplicaState], by_model: dict[int, list[ReplicaView]],
    models: dict[int, ModelView], desired: dict[int, int], forgotten: set[int], result: Plan,
) -> str | None:
    """Evict idle replicas of other on-demand models so ``m`` fits; the reason, or None.

    Only replicas known idle for ``min_idle_before_eviction_s`` with nothing in flight, of
    on-demand models kept at or above their min, least recently used first. The evicted
    replicas drain; ``m`` is placed on a later pass once they have stopped.
    """
    assert m.profile is not None
    policy = snapshot.policy
    left: dict[int, int] = {mid: len([r for r in reps if states[r.id] in COUNTS_TOWARDS_DESIRED])
                            for mid, reps in by_model.items()}
    candidates = []
    for r in snapshot.replicas:
        other = models.get(r.model_id)
        if other is None or other.id == m.id or not other.on_demand:
            continue
        if states[r.id] != S.READY or usable.get(r.agent_id):
            continue
        if r.last_used_at is None or r.in_flight != 0:
            continue  # unknown idleness or busy: never evicted
        idle = (now - r.last_used_at).total_seconds()
        if idle < policy.min_idle_before_eviction_s:
            continue
        candidates.append((r.last_used_at, r.id, r, idle))
    candidates.sort(key=lambda c: (c[0], c[1]))

    trial = {aid: replace(room, free_gpus=dict(room.free_gpus)) for aid, room in rooms.items()}
    chosen: dict[int, list[tuple[ReplicaView, float]]] = defaultdict(list)
    for _, _, r, idle in candidates:
        if left[r.model_id] - 1 < min_replicas_now(models[r.model_id]):
            continue
        left[r.model_id] -= 1
        trial[r.agent_id].give_back(r)
        chosen[r.agent_id].append((r, idle))
        _, why = trial[r.agent_id].fit(m.profile)
        if why is None:
            victims = chosen[r.agent_id]
            names = []
            for victim, victim_idle in victims:
                victim_model = models[victim.model_id]
                text = f"evicted {victim_model.name}, idle {_fmt_s(victim_idle)}, to place {m.name}"
                result.actions.append(Move(victim.id, S.DRAINING, text, MoveCause.EVICTION))
                states[victim.id] = S.DRAINING
                remaining = [x for x in by_model[victim.model_id] if states[x.id] in COUNTS_TOWARDS_DESIRED]
                if not remaining:
                    forgotten.add(victim_model.id)
                    desired[victim_model.id] = 0
                names.append(text)
            return "; ".join(names) + " (placing once they stop)"
    return None
