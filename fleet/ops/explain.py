"""Why a model has the replicas it has: demand, idleness, windows, scaling, failures.

Plain data for ``llmgw explain``, the REST API and the dashboard.
"""

from __future__ import annotations

import math

from django.utils import timezone

from catalog.models import Benchmark, ClusterSettings, Model, limits_info
from catalog.schedules import active_window, describe
from fleet.models import ModelState, QueueReport, ScalingEvent
from fleet.ops import cluster as read
from fleet.planning import routing
from fleet.states import ReplicaState


def _ago(when):
    if when is None:
        return None
    return round((timezone.now() - when).total_seconds(), 1)


def _bound_in_words() -> str:
    """The load bound of ``fleet.planning.routing`` (``load_slack``) in words."""
    slack = routing.load_slack(0)
    words = f"unless that one already runs {slack} more requests than the least loaded"
    if routing.BOUND_FACTOR > 0:
        # load_slack grows past BOUND_SLACK once ⌈factor · least⌉ does: least > slack / factor.
        past = math.floor(routing.BOUND_SLACK / routing.BOUND_FACTOR)
        words += f" ({routing.BOUND_FACTOR:.0%} more once the least loaded runs over {past})"
    # The order is the key's rendezvous order, the same in every web process.
    return words + ": then it spills to the next replica in the key's order"


def routing_info(model: Model) -> dict:
    """How the gateway chooses among ``model``'s replicas (``fleet.planning.routing``),
    JSON-ready: ``policy`` (the catalog's ``routing_policy``), ``applies`` (False for an
    external model: its requests go to its base URL, there is nothing to choose) and
    ``text``, the rule in a sentence with the load bound's figures from
    ``routing.load_slack``. A stored value that is no policy routes as least-loaded (as
    ``routing.choose`` does), and the text says so."""
    policy = model.routing_policy
    if model.is_external:
        text = "does not apply — an external model: every request goes to its base URL"
    elif policy == routing.PREFIX_AFFINITY:
        text = ("prefix-affinity — a prompt goes to the replica that most likely holds its prefix in its cache, "
                f"{_bound_in_words()}; a prompt too short to have a prefix goes by its session "
                "(X-Session-Id, else user) if it has one, else least-loaded")
    elif policy == routing.SESSION:
        text = ("session — one session's requests stay on one replica (by X-Session-Id, else user, else the "
                f"prompt's prefix), {_bound_in_words()}")
    elif policy == routing.LEAST_LOADED:
        text = "least-loaded — each request goes to the replica with the fewest requests in flight (ties take turns)"
    else:
        text = f"least-loaded — {policy!r} is no routing policy, so the fewest requests in flight decide"
    return {"policy": policy, "applies": not model.is_external, "text": text}


def explain_model(model: Model) -> dict:
    """Everything known about why ``model`` runs what it runs (JSON-ready; times ISO 8601,
    durations in seconds). ``queued_at_gateway``: requests waiting in the web processes'
    admission queues for it, as the reconciler counts them (fresh ``QueueReport`` rows).
    ``routing``: its routing policy and the rule in words (:func:`routing_info`). Each
    replica says whether it is ``outdated`` (docs/architecture.md, R10) and, in ``note``,
    "outdated, being replaced". ``ready``, the replicas' states and ``reason`` before any
    pass are the read model's (``fleet.ops.cluster``), as in ``status`` and the dashboard."""
    at = read.moment()
    state = ModelState.objects.filter(model=model).first()
    replicas = list(model.replicas.select_related("agent").order_by("-id")[:20])
    hashes = read.spec_hashes([model.pk])
    shown = {r.pk: at.replica_state(r) for r in replicas}
    used = [r.last_used_at for r in replicas if r.last_used_at]
    last_used = max(used) if used else None
    cluster = ClusterSettings.get_solo()
    windows = [w.as_window() for w in model.schedule_windows.all()]
    window = active_window(windows, timezone.now(), cluster.time_zone) if windows else None
    bench = Benchmark.objects.filter(model=model, profile_id=model.profile_id).first()
    events = list(ScalingEvent.objects.filter(model=model)[:5])
    failed = [r for r in replicas if shown[r.pk] == ReplicaState.FAILED]
    stopped_since = timezone.now() - read.RECENTLY_STOPPED
    stopped = [r for r in replicas if shown[r.pk] == ReplicaState.STOPPED and r.state_changed_at >= stopped_since]
    return {
        "model": model.name,
        "schedule": [describe(w) for w in windows],
        "window_now": describe(window) if window else None,
        "load_extra_replicas": state.extra_replicas if state else 0,
        "measured_per_replica": bench.max_concurrency if bench else None,
        "observed_per_replica": state.observed_per_replica if state else None,
        "queued_at_gateway": QueueReport.objects.filter(model=model).fresh(timezone.now()).waiting_by_model().get(
            model.pk, 0),
        "scaling_events": [{"at": e.at.isoformat(), "from": e.from_replicas, "to": e.to_replicas, "why": e.reason}
                           for e in events],
        "last_failure": failed[0].error if failed else None,
        "on_demand": model.on_demand,
        "external": model.is_external,
        # Without {api_key} its engines serve anyone who reaches their ports (docs/architecture.md,
        # "Security": engine keys).
        "engine_protected": model.profile.protects_engine if model.profile_id and not model.is_external else None,
        "limits": limits_info(model),  # token limits in force and served endpoints
        "routing": routing_info(model),
        "min_replicas": model.min_replicas,
        "max_replicas": model.max_replicas,
        "desired": state.desired if state else 0,
        "ready": read.ready_by_model(at, [model.pk]).get(model.pk, 0),
        "wanted_at": state.wanted_at.isoformat() if state and state.wanted_at else None,
        "last_used_at": last_used.isoformat() if last_used else None,
        "idle_for_s": _ago(last_used),
        "unservable": bool(state and state.unservable),
        "reason": read.model_reason(state),
        "replicas": [
            {"id": r.pk, "agent": r.agent.name, "state": shown[r.pk].value, "port": r.port, "reason": r.reason,
             "error": r.error.splitlines()[0] if r.error else "", "outdated": read.replica_outdated(r, hashes),
             "note": read.replica_note(r, hashes)}
            for r in replicas if shown[r.pk] != ReplicaState.STOPPED
        ],
        # Stopped within read.RECENTLY_STOPPED, with why: the planner's reason and, for an engine
        # its agent stopped on its own after a restart, the agent's words.
        "recently_stopped": [
            {"id": r.pk, "agent": r.agent.name, "stopped_at": r.state_changed_at.isoformat(), "reason": r.reason}
            for r in stopped[:5]
        ],
    }
