"""The one read model of the cluster: what "alive", "ready", "lost" and "not looked at yet"
mean, for every surface that shows the cluster — ``llmgw status`` and the REST API
(``fleet.ops.operations.cluster_status``), the dashboard (``fleet.ops.dashboard.load``),
``explain`` (``fleet.ops.explain.explain_model``) and ``/metrics`` (``fleet.ops.metrics``).

The definitions follow the planner, which is the truth of what happens (its lost-agent rule,
docs/architecture.md, R9; ``fleet.planning.planner.PlanningPass._lose_silent_agents``):

* an agent is **heard from** unless silent for more than ``LLMGW_AGENT_LOST_AFTER_S``, its
  silence counted from the later of its last message and the instant the control plane
  could listen again (``fleet.control.planes.listening_since``); otherwise it is **lost**;
* an agent is **alive** when connected *and* heard from (the stored ``connected`` flag alone
  can be stale);
* a replica on a lost agent is shown in the state the next pass gives it
  (``fleet.states.moved_when_agent_lost``): ready, starting… → ``lost``, draining →
  ``stopping``; so a **ready** replica is one in state ready on an agent heard from;
* a model is **not looked at yet** until a reconcile pass recorded its verdict
  (``ModelState.reason_at``; a row made by a request wanting the model does not count);
* a replica is **outdated** when the spec it was started from is not its model's current one
  (``fleet.control.specs``; docs/architecture.md, R10: the planner replaces it), and a replica
  whose model was deleted is shown under its old name, draining and stopping.

One thing the planner does that this model does not: when more than half the agents with
replicas go silent together, the pass marks none lost (it assumes the control plane
stalled). The read model still shows them silent — lost, not alive — which is what they are;
the pass's log note says why nothing was replaced.

Reads only; nothing here changes a row.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import BooleanField, Case, Count, F, Value, When
from django.utils import timezone

from catalog.models import Model
from fleet.control.planes import listening_since
from fleet.control.specs import is_outdated, spec_hash
from fleet.models import Agent, AgentQuerySet, ModelState, Replica
from fleet.models import Gpu, ScalingEvent  # for /metrics (end of the file)
from fleet.states import HOLDS_RESOURCES, LIVE, NOT_STOPPED, ReplicaState, moved_when_agent_lost

#: How far back ``explain`` and the dashboard list stopped replicas, each with why it stopped.
RECENTLY_STOPPED = timedelta(minutes=15)

#: The reason shown for a model no reconcile pass has looked at yet.
NOT_LOOKED_AT = "not looked at by a reconcile pass yet"


@dataclass(frozen=True)
class Moment:
    """The instant a surface reads the cluster at (``now``) and since when the control plane
    could hear agents (``listening_since``; None: no web process ever registered). Build it
    with :func:`moment`, once per read, so every row of one answer uses the same clock."""

    now: datetime
    listening_since: datetime | None = None

    def alive_agents(self) -> AgentQuerySet:
        """``Agent.objects.alive`` at this moment."""
        return Agent.objects.alive(self.now, self.listening_since)

    def heard_agents(self) -> AgentQuerySet:
        """``Agent.objects.heard_from`` at this moment."""
        return Agent.objects.heard_from(self.now, self.listening_since)

    def lost_agents(self) -> AgentQuerySet:
        """``Agent.objects.lost`` at this moment."""
        return Agent.objects.lost(self.now, self.listening_since)

    def agent_alive(self, agent: Agent) -> bool:
        """Whether ``agent`` (a loaded row; no query) is alive at this moment."""
        return agent.is_alive(self.now, self.listening_since)

    def agent_heard_from(self, agent: Agent) -> bool:
        """Whether ``agent`` (a loaded row; no query) is heard from at this moment."""
        return agent.is_heard_from(self.now, self.listening_since)

    def replica_state(self, replica: Replica, agent: Agent | None = None) -> ReplicaState:
        """The state ``replica`` is shown in: its own, or on a lost agent the one the next
        pass gives it. ``agent`` defaults to ``replica.agent`` (load it with
        ``select_related`` to spare a query per replica)."""
        return shown_state(replica.state, self.agent_heard_from(agent or replica.agent))


def moment(now: datetime | None = None) -> Moment:
    """The read model's clock for one answer (one query: the web processes' rows)."""
    now = now or timezone.now()
    return Moment(now, listening_since(now))


def shown_state(state: ReplicaState | str, agent_heard_from: bool) -> ReplicaState:
    """A replica's state as every surface shows it (see the module's docstring)."""
    return ReplicaState(state) if agent_heard_from else moved_when_agent_lost(state)


def replicas_by_state(at: Moment) -> dict[ReplicaState, int]:
    """Replica count per shown state, for every state but ``stopped`` (zeros included), in
    two grouped queries whatever the size of the fleet."""
    counts: Counter[ReplicaState] = Counter({s: 0 for s in NOT_STOPPED})
    for state, n in Replica.objects.not_stopped().values_list("state").annotate(n=Count("id")):
        counts[ReplicaState(state)] += n
    on_lost = (Replica.objects.not_stopped().filter(agent__in=at.lost_agents())
               .values_list("state").annotate(n=Count("id")))
    for state, n in on_lost:
        stored, moved = ReplicaState(state), moved_when_agent_lost(state)
        if moved != stored:
            counts[stored] -= n
            counts[moved] += n
    return {s: counts[s] for s in NOT_STOPPED}


def replicas_holding_resources(at: Moment) -> int:
    """Replicas whose resources count as taken (placing … stopping, shown states)."""
    counts = replicas_by_state(at)
    return sum(counts[s] for s in HOLDS_RESOURCES)


def ready_by_model(at: Moment, model_ids=None) -> dict[int, int]:
    """Model id → its ready replicas: in state ready, on an agent heard from. Models with
    none are absent. ``model_ids`` limits the count to those models."""
    replicas = Replica.objects.ready().filter(agent__in=at.heard_agents())
    if model_ids is not None:
        replicas = replicas.filter(model_id__in=list(model_ids))
    return dict(replicas.values_list("model_id").annotate(n=Count("id")))


def agents_alive(at: Moment) -> int:
    """How many agents are alive."""
    return at.alive_agents().count()


def looked_at(state: ModelState | None) -> bool:
    """Whether a reconcile pass has recorded its verdict on the model of ``state``."""
    return state is not None and state.looked_at


def model_reason(state: ModelState | None) -> str:
    """The pass's last word on a model (``ModelState.reason``; "" when it had nothing to
    say), or :data:`NOT_LOOKED_AT` before any pass looked at it."""
    return state.reason if looked_at(state) else NOT_LOOKED_AT


def spec_hashes(model_ids=None) -> dict[int, str]:
    """Model id → the hash of its current spec (``fleet.control.specs.spec_hash``), in one
    query; ``model_ids`` limits it to those models."""
    models = Model.objects.select_related("profile")
    if model_ids is not None:
        models = models.filter(pk__in=list(model_ids))
    return {m.pk: spec_hash(m, m.profile) for m in models}


def replica_outdated(replica: Replica, hashes: dict[int, str]) -> bool:
    """Whether ``replica`` was started from a spec its model no longer has (``hashes`` from
    :func:`spec_hashes`); a row with no recorded hash, or of a deleted model, is not."""
    current = hashes.get(replica.model_id) if replica.model_id is not None else None
    return current is not None and is_outdated(replica.spec_hash, current)


def replica_note(replica: Replica, hashes: dict[int, str]) -> str:
    """A few words on a live replica's transition, for people: "outdated, being replaced",
    "its model was deleted: draining, then stopping", or "" — "" for a replica whose engine
    no longer runs (failed, stopped: history, not a transition under way)."""
    if ReplicaState(replica.state) not in LIVE:
        return ""
    if replica.model is None:  # no query when model_id is None
        return "its model was deleted: draining, then stopping"
    if replica_outdated(replica, hashes):
        return "outdated, being replaced"
    return ""


def models_not_looked_at() -> int:
    """Catalog models no reconcile pass has looked at yet."""
    return Model.objects.exclude(pk__in=ModelState.objects.looked_at().values("model_id")).count()


# --- Agents' own health (``llmgw agents list``, ``llmgw status``) ----------------------------

#: An agent's health in a word: connected and heard from; heard from lately but its
#: websocket closed (its replicas stay until it is lost); silent past
#: ``LLMGW_AGENT_LOST_AFTER`` (its replicas are replaced elsewhere); registered, never heard.
ALIVE, DISCONNECTED, LOST, NEVER_CONNECTED = "alive", "disconnected", "lost", "never connected"


def agent_health(agent: Agent, at: Moment) -> str:
    """``agent``'s health in a word (:data:`ALIVE`, :data:`DISCONNECTED`, :data:`LOST`,
    :data:`NEVER_CONNECTED`), by the same rules as every surface (the module's docstring)."""
    if agent.last_seen_at is None and not agent.connected:
        return NEVER_CONNECTED
    if not at.agent_heard_from(agent):
        return LOST
    return ALIVE if agent.connected else DISCONNECTED


def agents_health(at: Moment) -> list[dict]:
    """Every agent, by name, as its operator watches it, in three queries whatever the fleet:
    ``{"name", "health", "connected_since", "last_seen_at", "heartbeat_age_s" (seconds since
    its last message, None if never), "cordoned", "version", "address", "gpus": [{"index",
    "name", "memory_used_mib", "memory_total_mib", "utilisation_pct", "temperature_c"}]
    (utilisation and temperature None when the agent has not reported them), "gpus_used"
    (GPUs held by its replicas), "replicas": {shown state: count} (live replicas only)}``.
    Instants are ISO 8601 strings."""
    agents = list(Agent.objects.order_by("name").prefetch_related("gpus"))
    by_id = {a.pk: a for a in agents}
    replicas: dict[int, Counter] = {}
    used: dict[int, set[int]] = {}
    for replica in Replica.objects.live().only("agent_id", "state", "gpu_indices"):
        state = at.replica_state(replica, by_id[replica.agent_id])
        replicas.setdefault(replica.agent_id, Counter())[state.value] += 1
        if state in HOLDS_RESOURCES:
            used.setdefault(replica.agent_id, set()).update(replica.gpu_indices or [])
    rows = []
    for agent in agents:
        age_s = (at.now - agent.last_seen_at).total_seconds() if agent.last_seen_at else None
        rows.append({
            "name": agent.name, "health": agent_health(agent, at),
            "connected_since": agent.connected_since.isoformat() if agent.connected and agent.connected_since else None,
            "last_seen_at": agent.last_seen_at.isoformat() if agent.last_seen_at else None,
            "heartbeat_age_s": None if age_s is None else round(max(0.0, age_s), 1),
            "cordoned": agent.cordoned, "version": agent.version, "address": agent.address,
            "gpus": [{"index": g.index, "name": g.name, "memory_used_mib": g.memory_used_mib,
                      "memory_total_mib": g.memory_total_mib, "utilisation_pct": g.utilisation_pct,
                      "temperature_c": g.temperature_c} for g in sorted(agent.gpus.all(), key=lambda g: g.index)],
            "gpus_used": len(used.get(agent.pk, set())),
            "replicas": dict(sorted(replicas.get(agent.pk, Counter()).items())),
        })
    return rows


# --- /metrics: what an operator alerts on (fleet.ops.metrics) ---------------------------------

#: How far back ``/metrics`` counts scaling steps and replica failures.
METRICS_WINDOW = timedelta(hours=1)
#: The words a pass's verdict on a model in a crash loop starts with
#: (``fleet.planning.planner.PlanningPass._wait_out_backoff`` and ``_explain_crash_loop``).
CRASH_LOOP_WORDS = "crash loop"


def _model_label(model_name: str | None, placed_as: str) -> str:
    """A replica's model as a label: its catalog name, else the name it was placed under."""
    return model_name or placed_as or "unknown"


def live_replicas_by_model(at: Moment) -> dict[tuple[str, ReplicaState], int]:
    """(model name, shown state) → replicas, for live replicas only (``fleet.states.LIVE``:
    holding resources, or lost) — never the ended ones (stopped, failed), whose rows are
    history and would count up until retention prunes them. In two grouped queries; a
    replica of a deleted model counts under the name it was placed under."""
    counts: Counter[tuple[str, ReplicaState]] = Counter()
    rows = Replica.objects.live().values_list("model__name", "model_name", "state").annotate(n=Count("id"))
    for name, placed_as, state, n in rows:
        counts[(_model_label(name, placed_as), ReplicaState(state))] += n
    on_lost = (Replica.objects.live().filter(agent__in=at.lost_agents())
               .values_list("model__name", "model_name", "state").annotate(n=Count("id")))
    for name, placed_as, state, n in on_lost:
        stored, moved = ReplicaState(state), moved_when_agent_lost(state)
        if moved != stored:
            label = _model_label(name, placed_as)
            counts[(label, stored)] -= n
            counts[(label, moved)] += n
    return {key: n for key, n in counts.items() if n > 0}


def outdated_by_model() -> dict[str, int]:
    """Catalog model name → its live replicas started from a spec it no longer has (the
    ones the planner replaces: :func:`replica_outdated`), 0 for every other model. Two
    queries."""
    hashes, names = {}, {}
    for m in Model.objects.select_related("profile"):
        hashes[m.pk], names[m.pk] = spec_hash(m, m.profile), m.name
    out = dict.fromkeys(names.values(), 0)
    rows = (Replica.objects.live().filter(model_id__isnull=False)
            .values_list("model_id", "spec_hash").annotate(n=Count("id")))
    for model_id, started_from, n in rows:
        if model_id in hashes and is_outdated(started_from, hashes[model_id]):
            out[names[model_id]] += n
    return out


def scaling_steps_by_model(since: datetime) -> dict[tuple[str, str], int]:
    """(model name, ``up`` or ``down``) → load-scaling steps (``ScalingEvent``) since
    ``since``; both directions of every catalog model, zeros included. Two queries."""
    out = {(name, direction): 0 for name in Model.objects.values_list("name", flat=True)
           for direction in ("up", "down")}
    rows = (ScalingEvent.objects.filter(at__gte=since)
            .annotate(up=Case(When(to_replicas__gt=F("from_replicas"), then=Value(True)), default=Value(False),
                              output_field=BooleanField()))
            .values_list("model__name", "up").annotate(n=Count("id")))
    for name, up, n in rows:
        key = (name, "up" if up else "down")
        out[key] = out.get(key, 0) + n
    return out


def crash_loops_by_model() -> dict[str, bool]:
    """Catalog model name → whether the last pass's verdict on it is a crash loop (its
    replicas keep failing: the next placement waits out a backoff, or the next try is under
    way with none ready). One query."""
    return {name: (reason or "").startswith(CRASH_LOOP_WORDS)  # no state row yet: no verdict, no loop
            for name, reason in Model.objects.values_list("name", "fleet_state__reason")}


def failures_by_model(since: datetime) -> dict[str, int]:
    """Model name → its replicas that failed since ``since`` (the rows' ``state_changed_at``;
    a deleted model's under the name they were placed under). One query."""
    out: Counter[str] = Counter()
    rows = (Replica.objects.filter(state=ReplicaState.FAILED.value, state_changed_at__gte=since)
            .values_list("model__name", "model_name").annotate(n=Count("id")))
    for name, placed_as, n in rows:
        out[_model_label(name, placed_as)] += n
    return dict(out)


@dataclass(frozen=True)
class GpuReadingRow:
    """One GPU's last reading as ``/metrics`` shows it: memory in MiB, utilisation in
    percent and temperature in °C (None: not reported)."""

    agent: str
    index: int
    memory_used_mib: int
    memory_total_mib: int
    utilisation_pct: float | None
    temperature_c: float | None


def gpu_readings(at: Moment) -> list[GpuReadingRow]:
    """The last reading of every GPU of the agents heard from (a lost agent's figures are
    old news: left out, so no alert fires on a reading nobody refreshes). One query."""
    rows = (Gpu.objects.filter(agent__in=at.heard_agents()).order_by("agent__name", "index")
            .values_list("agent__name", "index", "memory_used_mib", "memory_total_mib", "utilisation_pct",
                         "temperature_c"))
    return [GpuReadingRow(*row) for row in rows]


def heartbeat_ages_s(at: Moment) -> dict[str, float]:
    """Agent name → seconds since the control plane last heard from it (its ``last_seen_at``,
    written in batches by the web processes: up to a flush late), for every agent heard from
    at least once. One query."""
    return {name: max(0.0, (at.now - seen).total_seconds())
            for name, seen in Agent.objects.filter(last_seen_at__isnull=False).values_list("name", "last_seen_at")}
