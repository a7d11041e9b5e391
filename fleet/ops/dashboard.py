"""The cluster at a glance, as plain data for the dashboard page (``fleet.ops.views``).

:func:`load` reads the database in a handful of queries; everything else here is pure and
shapes rows into what the template shows: each agent's GPUs (memory used of total, which
replica holds which GPU) or its CPU cores and RAM, each model's phase and last placement
reason, recent scaling events.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Max

from catalog.models import ClusterSettings, Model, RoutingPolicy
from fleet.models import Agent, Gpu, ModelState, Replica, ScalingEvent
from fleet.ops import cluster as read
from fleet.states import COMING_UP, HOLDS_RESOURCES, ReplicaState

S = ReplicaState

#: A model's phase, as the dashboard names it.
COLD, LOADING, READY, DRAINING, FAILED, EXTERNAL = "cold", "loading", "ready", "draining", "failed", "external"
PHASES = (READY, LOADING, DRAINING, FAILED, COLD, EXTERNAL)
RECENT_EVENTS = 15


@dataclass(frozen=True)
class Holder:
    """A replica holding resources on an agent."""

    replica_id: int
    model: str
    state: str
    #: While downloading: how much of the weights the agent has, 0..100; None otherwise.
    progress_pct: int | None = None
    #: Its transition in words ("outdated, being replaced"; ``fleet.ops.cluster.replica_note``).
    note: str = ""

    @property
    def label(self) -> str:
        """Its state (with download progress), and its note: "ready, outdated, being replaced"."""
        text = self.state
        if self.progress_pct is not None and self.state == S.DOWNLOADING.value:
            text = f"{self.state} {self.progress_pct}%"
        return f"{text}, {self.note}" if self.note else text


@dataclass(frozen=True)
class GpuRow:
    index: int
    name: str
    memory_used_mib: int
    memory_total_mib: int
    holders: tuple[Holder, ...] = ()

    @property
    def used_pct(self) -> int:
        return percent(self.memory_used_mib, self.memory_total_mib)

    @property
    def memory_label(self) -> str:
        return f"{gib(self.memory_used_mib)} / {gib(self.memory_total_mib)} GiB"


@dataclass(frozen=True)
class AgentRow:
    id: int
    name: str
    alive: bool
    cordoned: bool
    address: str
    version: str
    last_seen_at: datetime | None
    gpus: tuple[GpuRow, ...]
    cpu_cores: float
    cpu_cores_used: float
    memory_mib: int
    memory_mib_used: int
    #: Replicas not tied to a GPU (CPU-only profiles).
    cpu_holders: tuple[Holder, ...] = ()
    draining: int = 0

    @property
    def cpu_pct(self) -> int:
        return percent(self.cpu_cores_used, self.cpu_cores)

    @property
    def memory_pct(self) -> int:
        return percent(self.memory_mib_used, self.memory_mib)

    @property
    def cpu_label(self) -> str:
        return f"{self.cpu_cores_used:g} / {self.cpu_cores:g} cores"

    @property
    def memory_label(self) -> str:
        return f"{gib(self.memory_mib_used)} / {gib(self.memory_mib)} GiB RAM"


@dataclass(frozen=True)
class ModelRow:
    id: int
    name: str
    phase: str
    desired: int
    ready: int
    on_demand: bool
    external: bool
    reason: str
    reason_at: datetime | None
    wanted_at: datetime | None
    unservable: bool
    #: ``catalog.models.RoutingPolicy``'s value.
    routing_policy: str

    @property
    def routing_badge(self) -> str:
        """The policy's name where it is worth a badge: not the default (least-loaded), and
        the model is served here (an external model's requests go to its base URL)."""
        return "" if self.external or self.routing_policy == RoutingPolicy.LEAST_LOADED else self.routing_policy


@dataclass(frozen=True)
class StopRow:
    """A replica stopped lately: when, which, and why in words (the planner's reason; for an
    engine its agent stopped on its own after a restart, the agent's words too)."""

    at: datetime
    replica_id: int
    model: str
    agent: str
    reason: str


@dataclass(frozen=True)
class EventRow:
    at: datetime
    model: str
    from_replicas: int
    to_replicas: int
    reason: str

    @property
    def direction(self) -> str:
        return "up" if self.to_replicas > self.from_replicas else "down"


@dataclass(frozen=True)
class Dashboard:
    stopped: bool
    stopped_at: datetime | None
    stopped_by: str
    #: Replicas still holding resources (a stopped cluster is done when this is 0).
    running: int
    agents: tuple[AgentRow, ...]
    models: tuple[ModelRow, ...]
    events: tuple[EventRow, ...]
    generated_at: datetime
    counts: dict[str, int] = field(default_factory=dict)
    #: Replicas stopped within ``fleet.ops.cluster.RECENTLY_STOPPED``, newest first, with why.
    stops: tuple["StopRow", ...] = ()


def percent(used: float, total: float) -> int:
    """``used`` as a whole percentage of ``total``, clamped to 0..100 (0 when total is 0)."""
    if not total or total <= 0:
        return 0
    return max(0, min(100, round(100 * used / total)))


def gib(mib: float) -> str:
    """MiB as GiB with one decimal ("39.5")."""
    return f"{mib / 1024:.1f}"


def model_phase(*, external: bool, desired: int, states: list[str], unservable: bool, last_state: str | None) -> str:
    """One word for where a model stands.

    ``states`` are its live replicas' states (placing … stopping, lost); ``last_state`` is
    the state of its newest replica of all (None: never had one). Order matters: anything
    ready means it serves; then on its way up; then on its way out; then failed (the last
    pass could not place it, or its newest replica failed and nothing replaced it yet);
    otherwise cold (or loading when the next pass will place it)."""
    if external:
        return EXTERNAL
    if S.READY.value in states:
        return READY
    if any(s in {c.value for c in COMING_UP} for s in states):
        return LOADING
    if any(s in (S.DRAINING.value, S.STOPPING.value) for s in states):
        return DRAINING
    if unservable or (desired > 0 and last_state == S.FAILED.value):
        return FAILED
    return LOADING if desired > 0 else COLD


def agent_row(agent: Agent, gpus: list[Gpu], replicas: list[Replica], alive: bool,
              hashes: dict[int, str] | None = None) -> AgentRow:
    """Shape one agent: which of ``replicas`` (its live ones, model loaded) holds which GPU,
    and the cores and RAM its CPU replicas take. ``hashes`` (``fleet.ops.cluster.spec_hashes``)
    marks outdated replicas; a deleted model's are marked always."""
    by_gpu: dict[int, list[Holder]] = defaultdict(list)
    cpu_holders = []
    for r in sorted(replicas, key=lambda r: r.pk):
        progress = None if r.download_progress is None else percent(r.download_progress, 1)
        note = read.replica_note(r, hashes or {})
        holder = Holder(r.pk, r.shown_model_name, r.state, progress, note)
        if r.gpu_indices:
            for idx in r.gpu_indices:
                by_gpu[idx].append(holder)
        else:
            cpu_holders.append(holder)
    return AgentRow(
        id=agent.pk, name=agent.name, alive=alive, cordoned=agent.cordoned, address=agent.address,
        version=agent.version, last_seen_at=agent.last_seen_at,
        gpus=tuple(GpuRow(g.index, g.name, g.memory_used_mib, g.memory_total_mib, tuple(by_gpu.get(g.index, ())))
                   for g in sorted(gpus, key=lambda g: g.index)),
        cpu_cores=float(agent.cpu_cores), cpu_cores_used=sum(r.cpu_cores for r in replicas if not r.gpu_indices),
        memory_mib=agent.memory_mib, memory_mib_used=sum(r.memory_mib for r in replicas if not r.gpu_indices),
        cpu_holders=tuple(cpu_holders),
        draining=sum(1 for r in replicas if r.state == S.DRAINING.value),
    )


def load(now: datetime | None = None) -> Dashboard:
    """Read the cluster for the dashboard (a handful of queries, none per agent or model).
    Alive, replica states, ready counts and "not looked at yet" are the read model's
    (``fleet.ops.cluster``), the same as ``status``, ``explain`` and ``/metrics``."""
    at = read.moment(now)
    cluster = ClusterSettings.get_solo()
    gpus: dict[int, list[Gpu]] = defaultdict(list)
    for gpu in Gpu.objects.all():
        gpus[gpu.agent_id].append(gpu)
    all_agents = list(Agent.objects.all())
    heard = {a.pk: at.agent_heard_from(a) for a in all_agents}
    live = list(Replica.objects.live().select_related("model").order_by("id"))
    for r in live:
        # The shown state (on a lost agent: what the next pass makes it). Only these
        # in-memory copies change; nothing is saved.
        r.state = read.shown_state(r.state, heard.get(r.agent_id, True)).value
    holding = {s.value for s in HOLDS_RESOURCES}
    by_agent: dict[int, list[Replica]] = defaultdict(list)
    by_model: dict[int, list[str]] = defaultdict(list)
    for r in live:
        if r.state in holding:
            by_agent[r.agent_id].append(r)
        by_model[r.model_id].append(r.state)
    hashes = read.spec_hashes()
    agents = tuple(agent_row(a, gpus[a.pk], by_agent[a.pk], alive=at.agent_alive(a), hashes=hashes)
                   for a in all_agents)
    newest = dict(Replica.objects.values("model_id").annotate(n=Max("id")).values_list("model_id", "n"))
    last_state = dict(Replica.objects.filter(id__in=newest.values()).values_list("model_id", "state"))
    states = {s.model_id: s for s in ModelState.objects.all()}
    models = []
    for m in Model.objects.all():
        st = states.get(m.pk)
        desired = st.desired if st else 0
        models.append(ModelRow(
            id=m.pk, name=m.name,
            phase=model_phase(external=m.is_external, desired=desired, states=by_model[m.pk],
                              unservable=bool(st and st.unservable), last_state=last_state.get(m.pk)),
            desired=desired, ready=by_model[m.pk].count(S.READY.value), on_demand=m.on_demand,
            external=m.is_external,
            reason=read.model_reason(st),
            reason_at=st.reason_at if st else None, wanted_at=st.wanted_at if st else None,
            unservable=bool(st and st.unservable), routing_policy=m.routing_policy,
        ))
    events = tuple(
        EventRow(e.at, e.model.name, e.from_replicas, e.to_replicas, e.reason)
        for e in ScalingEvent.objects.select_related("model")[:RECENT_EVENTS]
    )
    counts = {phase: n for phase in PHASES if (n := sum(1 for row in models if row.phase == phase))}
    stops = tuple(
        StopRow(r.state_changed_at, r.pk, r.shown_model_name, r.agent.name, r.reason)
        for r in Replica.objects.in_states([S.STOPPED]).filter(state_changed_at__gte=at.now - read.RECENTLY_STOPPED)
        .select_related("model", "agent").order_by("-state_changed_at")[:RECENT_EVENTS]
    )
    return Dashboard(
        stopped=cluster.stopped, stopped_at=cluster.stopped_at, stopped_by=cluster.stopped_by,
        running=sum(len(v) for v in by_agent.values()), agents=agents, models=tuple(models), events=events,
        generated_at=at.now, counts=counts, stops=stops,
    )

