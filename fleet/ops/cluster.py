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

from django.db.models import Count
from django.utils import timezone

from catalog.models import Model
from fleet.control.planes import listening_since
from fleet.control.specs import is_outdated, spec_hash
from fleet.models import Agent, AgentQuerySet, ModelState, Replica
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
