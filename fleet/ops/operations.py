"""Operating the whole cluster: stop, start, status, agent restarts.

The stopped flag lives in ``ClusterSettings`` and is live: the reconciler then wants every
model at zero (engines drained and stopped, GPUs freed) and the gateway answers 503
``system_stopped``; nothing in the catalog changes.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from catalog.models import ClusterSettings, Model
from fleet.models import Agent, ControlPlane, Gpu, LeaderLease, ModelState, OperatorAction, PassLock, Replica
from fleet.control.demand import want
from fleet.control.planes import control_plane_stall_s
from fleet.control.reconciler import request_pass
from fleet.groups import nudge_agents, restart_agents
from fleet.ops import cluster as read
from fleet.states import COMING_UP, HOLDS_RESOURCES, ReplicaState


def record_action(by: str, action: str, target: str = "", detail: str = "") -> None:
    """Keep one operator act for ``llmgw changes`` and the dashboard's "Changes" page
    (:class:`fleet.models.OperatorAction`; fields cut to their columns)."""
    OperatorAction.objects.create(actor=(by or "")[:150], action=action[:32], target=(target or "")[:150],
                                  detail=detail)


def stop_cluster(by: str) -> bool:
    """Set the stopped flag (``by`` names who did it); False if it was already set."""
    with transaction.atomic():
        changed = ClusterSettings.objects.filter(pk=1, stopped=False).update(
            stopped=True, stopped_at=timezone.now(), stopped_by=by[:150]
        )
        if not changed and not ClusterSettings.objects.filter(pk=1).exists():
            ClusterSettings.objects.create(pk=1, stopped=True, stopped_at=timezone.now(), stopped_by=by[:150])
            changed = 1
        if changed:
            record_action(by, "stop", "cluster", "every replica drains and stops; /v1/ answers 503")
        request_pass()
    return bool(changed)


def start_cluster(by: str = "") -> bool:
    """Clear the stopped flag (``by`` names who did it); False if the cluster was already
    serving."""
    ClusterSettings.get_solo()
    with transaction.atomic():
        changed = ClusterSettings.objects.filter(pk=1, stopped=True).update(stopped=False, stopped_at=None, stopped_by="")
        if changed:
            record_action(by, "start", "cluster", "serving again; replicas are placed")
        request_pass()
    return bool(changed)


def replicas_running() -> int:
    """Replicas still holding resources (placing … stopping; on a lost agent, as the next
    pass leaves them: ``fleet.ops.cluster``)."""
    return read.replicas_holding_resources(read.moment())


def models_short_of_ready(since) -> list[dict] | None:
    """Models served here with fewer ready replicas than the last reconcile pass wants, as
    ``[{"model", "ready", "desired", "reason"}]``; None while no pass has finished since
    ``since`` (a datetime: what it wants before then may be stale)."""
    last = PassLock.objects.filter(pk=1).values_list("last_pass_at", flat=True).first()
    if last is None or last < since:
        return None
    ready = read.ready_by_model(read.moment())
    short = []
    for state in ModelState.objects.select_related("model").filter(desired__gt=0).order_by("model__name"):
        if state.model.is_external:
            continue
        n = ready.get(state.model_id, 0)
        if n < state.desired:
            short.append({"model": state.model.name, "ready": n, "desired": state.desired, "reason": state.reason})
    return short


def request_agent_restarts(by: str = "") -> list[str]:
    """Ask every connected agent to restart in place (engines keep serving). Returns their
    names. Delivered by the watcher of the web process holding each websocket. ``by``
    names who asked."""
    agents = list(Agent.objects.connected().order_by("name"))
    Agent.objects.filter(pk__in=[a.pk for a in agents]).update(restart_generation=F("restart_generation") + 1)
    if agents:
        record_action(by, "restart agents", f"{len(agents)} agent{'s' if len(agents) > 1 else ''}",
                      ", ".join(a.name for a in agents)[:2000])
    restart_agents([a.pk for a in agents])
    return [a.name for a in agents]


def leader_process() -> str:
    """``host:pid`` of the worker holding the leader lease now ('' when none does:
    ``LeaderLease.leader``)."""
    return LeaderLease.leader(timezone.now())


def leader_host() -> str:
    """Host of the worker holding the leader lease ('' when none does)."""
    return leader_process().rsplit(":", 1)[0]


def control_planes(fresh_s: float | None = None) -> list[dict]:
    """Control-plane processes heard from within ``fresh_s`` (default: the stall bound,
    ``planes.control_plane_stall_s``), one entry each, sorted by host, role and pid:
    ``{"host", "role", "pid", "last_seen_at", "leader", "standby"}``. ``leader`` is the
    worker holding the lease; every other worker listed is a ``standby``; web processes
    are neither. The same rows give the same answer on every call."""
    fresh_s = fresh_s or control_plane_stall_s()
    since = timezone.now() - timedelta(seconds=fresh_s)
    leader = leader_process()
    planes = []
    for cp in ControlPlane.objects.filter(last_seen_at__gte=since).order_by("host", "role", "pid"):
        leads = cp.role == ControlPlane.Role.WORKER and f"{cp.host}:{cp.pid}" == leader
        planes.append({"host": cp.host, "role": cp.role, "pid": cp.pid, "last_seen_at": cp.last_seen_at.isoformat(),
                       "leader": leads, "standby": cp.role == ControlPlane.Role.WORKER and not leads})
    return planes


def cluster_status() -> dict:
    """Everything ``llmgw status`` shows, as plain data (JSON-ready). An agent's
    ``connected`` is the read model's *alive* (``fleet.ops.cluster``: connected and heard
    from), its ``health`` the word ``llmgw agents list`` shows (alive, disconnected, lost,
    never connected) and ``heartbeat_age_s`` seconds since its last message; replica states and ready counts are the read model's too (on a lost agent, what
    the next pass makes them). Each model names its ``routing_policy`` (in ``--json`` only:
    ``llmgw explain`` says it in words)."""
    at = read.moment()
    cluster = ClusterSettings.get_solo()
    gpus_by_agent: dict[int, list[Gpu]] = {}
    for gpu in Gpu.objects.all():
        gpus_by_agent.setdefault(gpu.agent_id, []).append(gpu)
    agents_by_id = {agent.pk: agent for agent in Agent.objects.all()}
    replicas = list(Replica.objects.live().select_related("model").order_by("id"))
    hashes = read.spec_hashes()
    shown = {r.pk: at.replica_state(r, agents_by_id[r.agent_id]) for r in replicas}
    used: dict[int, set[int]] = {}
    for r in replicas:
        if shown[r.pk] in HOLDS_RESOURCES:
            used.setdefault(r.agent_id, set()).update(r.gpu_indices or [])
    agents = []
    for agent in agents_by_id.values():
        gpus = gpus_by_agent.get(agent.pk, [])
        agents.append({
            "name": agent.name, "connected": at.agent_alive(agent), "health": read.agent_health(agent, at),
            "heartbeat_age_s": (round(max(0.0, (at.now - agent.last_seen_at).total_seconds()), 1)
                                if agent.last_seen_at else None),
            "version": agent.version, "cordoned": agent.cordoned,
            "address": agent.address,
            "last_seen_at": agent.last_seen_at.isoformat() if agent.last_seen_at else None,
            "connected_since": agent.connected_since.isoformat() if agent.connected and agent.connected_since else None,
            "gpus_total": len(gpus), "gpus_used": len(used.get(agent.pk, set())),
            "cpu_cores": agent.cpu_cores, "memory_mib": agent.memory_mib,
        })
    states = {s.model_id: s for s in ModelState.objects.all()}
    ready = read.ready_by_model(at)
    models = []
    for model in Model.objects.all():
        state = states.get(model.pk)
        desired = state.desired if state else 0
        entry = {"name": model.name, "desired": desired, "ready": ready.get(model.pk, 0),
                 "on_demand": model.on_demand, "external": model.is_external,
                 "routing_policy": model.routing_policy}
        if not read.looked_at(state):
            entry["reason"] = read.NOT_LOOKED_AT
        elif entry["ready"] != desired or state.unservable:
            entry["reason"] = state.reason
        models.append(entry)
    return {
        "serving": not cluster.stopped,
        "stopped": cluster.stopped,
        "stopped_at": cluster.stopped_at.isoformat() if cluster.stopped_at else None,
        "stopped_by": cluster.stopped_by or None,
        "admission": {"rate_limits_without_redis": cluster.rate_limits_without_redis,
                      "admission_wait_s": cluster.admission_wait_s},
        "leader": leader_host() or None,
        "leader_process": leader_process() or None,
        "control_planes": control_planes(),
        "agents": agents,
        "models": models,
        "replicas": [
            {"id": r.pk, "model": r.shown_model_name, "agent": agents_by_id[r.agent_id].name,
             "state": shown[r.pk].value, "port": r.port, "gpus": r.gpu_indices,
             "outdated": read.replica_outdated(r, hashes), "note": read.replica_note(r, hashes)}
            for r in replicas
        ],
    }


# --- Agents and on-demand models: the dashboard's and the REST API's actions ---------------


def set_cordoned(agent: Agent, cordoned: bool, by: str = "") -> bool:
    """Cordon (nothing new is placed on it) or uncordon ``agent``; False if it already was.
    Uncordoning requests a pass: a model waiting for room may fit now. ``by`` names who."""
    with transaction.atomic():
        changed = Agent.objects.filter(pk=agent.pk).exclude(cordoned=cordoned).update(cordoned=cordoned)
        agent.cordoned = cordoned
        if changed:
            record_action(by, "cordon" if cordoned else "uncordon", agent.name,
                          "nothing new is placed there" if cordoned else "replicas may be placed there again")
        if changed and not cordoned:
            request_pass()
    return bool(changed)


def _move_away(replicas, why: str) -> list[int]:
    """Take replicas out of service as the planner does for a surplus: a ready one drains
    (in-flight requests finish; the pass stops it), one still coming up stops at once.
    Returns the agents whose desired set moved."""
    touched = []
    for replica in replicas:
        to = ReplicaState.DRAINING if replica.state == ReplicaState.READY.value else ReplicaState.STOPPING
        if replica.transition(to, reason=why):
            touched.append(replica.agent_id)
    return touched


def drain_agent(agent: Agent, by: str = "") -> int:
    """Cordon ``agent`` and move its replicas away: ready ones drain, those still coming up
    stop, and a pass is requested so the planner places their successors on other agents.
    Returns how many replicas were moved (0: only cordoned)."""
    why = f"agent {agent.name} drained" + (f" by {by}" if by else "")
    with transaction.atomic():
        Agent.objects.filter(pk=agent.pk).update(cordoned=True)
        agent.cordoned = True
        replicas = list(Replica.objects.filter(agent=agent).in_states({ReplicaState.READY, *COMING_UP}))
        touched = _move_away(replicas, why)
        record_action(by, "drain", agent.name, f"cordoned; {len(touched)} replica(s) moved away")
        Agent.bump_generation(touched)
        request_pass()
    if touched:
        transaction.on_commit(lambda: nudge_agents(touched))
    return len(touched)


def evict_model(model: Model, by: str = "") -> int:
    """Evict an on-demand model now: forget its demand (``ModelState.wanted_at``) and drain
    its replicas. Returns how many replicas were moved. ValueError for a model that is not
    on demand (its min would only place it again)."""
    if not model.on_demand:
        raise ValueError(f"{model.name} is not an on-demand model: lower its min replicas instead")
    why = "evicted" + (f" by {by}" if by else "")
    with transaction.atomic():
        ModelState.objects.filter(model=model).update(wanted_at=None)
        touched = _move_away(list(Replica.objects.filter(model=model).in_states({ReplicaState.READY, *COMING_UP})),
                             why)
        record_action(by, "evict", model.name, f"demand forgotten; {len(touched)} replica(s) drained")
        Agent.bump_generation(touched)
        request_pass()
    if touched:
        transaction.on_commit(lambda: nudge_agents(touched))
    return len(touched)


def want_model(model: Model) -> None:
    """Ask for an on-demand model now, as a request for it would. ValueError for a model
    that is not on demand or is served elsewhere."""
    if model.is_external or not model.on_demand:
        raise ValueError(f"{model.name} is not an on-demand model served here")
    want(model.pk)
