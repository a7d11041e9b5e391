"""How many replicas a model wants now: its floor and ceiling (own min/max, the schedule
window in force, a window brought forward by pre-warm), on-demand demand within the idle
timeout, a prediction of its arrival profile, and the load-scaling extra
(docs/architecture.md, R6, R7, R11). Pure functions of a ``ModelView``, the ``Policy`` and
``now``; the planner's pass, the simulator's shortcuts and the operator surfaces all read
them, so they cannot disagree on what a model wants. ``fleet.planning.planner`` re-exports
them (callers write ``planner.desired_replicas``).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from fleet.planning.data import ModelView, Policy
from fleet.planning.scaling import ScalingState
from fleet.planning.warmth import ColdStart, window_ahead


def idle_timeout_s(model: ModelView, policy: Policy) -> float:
    """A model's own idle timeout, else the cluster default (seconds; docs/architecture.md, R6)."""
    return model.idle_timeout_s if model.idle_timeout_s else policy.default_idle_timeout_s


def min_replicas_now(model: ModelView) -> int:
    """A model's floor now: the schedule window's min, else its own min — or the upcoming
    window's, brought forward by pre-warm (``model.ahead``, R11) — eviction never goes
    below it (docs/architecture.md, R5)."""
    low = model.window_min if model.window_min is not None else model.min_replicas
    return max(low, model.ahead.min_replicas) if model.ahead is not None else low


def ceiling_now(model: ModelView) -> int:
    """A model's max now: the window's max, else its own; under pre-warm the larger of that
    and the upcoming window's (``model.ahead``, R11)."""
    if model.ahead is not None:
        return model.ahead.max_replicas
    return model.window_max if model.window_max else model.max_replicas


def cold_start_of(model: ModelView, policy: Policy) -> ColdStart:
    """The model's measured cold start, else the cluster's default (R11)."""
    return model.cold_start if model.cold_start is not None else ColdStart(policy.default_cold_start_s)


def warm_ahead(model: ModelView, policy: Policy, now: datetime) -> ModelView:
    """``model`` with what warm-before-demand makes of it at ``now`` (docs/architecture.md,
    R11; the rules are ``fleet.planning.warmth``'s): ``ahead``, an upcoming window's floor
    brought forward by its lead; and its ``predicted`` run of likely hours kept only while
    the cluster predicts at all (an on-demand model, not external, predictive warmth on).
    The same model when nothing changes. Every pass starts with it
    (:meth:`PlanningPass._warm_ahead`); other readers of the planner's rules (the simulator)
    call it first too."""
    ahead = None
    if policy.prewarm_windows and model.next_window is not None and not model.external and not policy.stopped:
        floor = model.window_min if model.window_min is not None else model.min_replicas
        ceiling = model.window_max if model.window_max else model.max_replicas
        ahead = window_ahead(model.next_window, floor, ceiling, model.max_replicas, cold_start_of(model, policy), now)
    predicted = model.predicted
    if predicted is not None and (not policy.predictive_warmth or not model.on_demand or model.external):
        predicted = None
    if ahead == model.ahead and predicted is model.predicted:
        return model
    return replace(model, ahead=ahead, predicted=predicted)


def wanted_now(model: ModelView, policy: Policy, now: datetime) -> bool:
    """An on-demand model asked for within its idle timeout (R6)."""
    return model.wanted_at is not None and (now - model.wanted_at).total_seconds() <= idle_timeout_s(model, policy)


def speculative(model: ModelView, policy: Policy, now: datetime) -> bool:
    """Its one replica is wanted only because its arrival profile predicts a request
    (``model.predicted``, filled by :func:`warm_ahead`): an on-demand model with no floor,
    not asked for within its idle timeout. Such a replica is placed only on room nobody
    else wants and is evicted first (docs/architecture.md, R11)."""
    return (model.on_demand and not model.external and model.predicted is not None
            and model.predicted.warm_from <= now < model.predicted.until
            and min_replicas_now(model) == 0 and not wanted_now(model, policy, now))


def warm_evicted(model: ModelView) -> bool:
    """A replica kept warm on its current prediction was evicted during this predicted run:
    the room is wanted, so none is placed again until the next run (R11; else every pass
    would place one and the next wanted model evict it, a cold start each time)."""
    return (model.warm_evicted_at is not None and model.predicted is not None
            and model.warm_evicted_at >= model.predicted.warm_from)


def base_replicas(model: ModelView, policy: Policy, now: datetime) -> int:
    """Replicas a model runs without load: the window's min (else its own min; R11's
    pre-warm may bring a window's forward); an on-demand model with that at 0 runs one while
    wanted within its idle timeout, or while its arrival profile predicts a request
    (:func:`speculative`)."""
    if model.external:
        return 0
    low = min_replicas_now(model)
    if not model.on_demand or low > 0:
        return low
    if wanted_now(model, policy, now):
        return 1
    predicted = model.predicted
    return 1 if predicted is not None and predicted.warm_from <= now < predicted.until else 0


def desired_replicas(model: ModelView, policy: Policy, now: datetime) -> int:
    """Replicas wanted now: 0 when the cluster is stopped or the model external; else base
    plus the load-scaling extra (docs/architecture.md, R7), capped at max(its ceiling now,
    base)."""
    if policy.stopped or model.external:
        return 0
    base = base_replicas(model, policy, now)
    if base == 0:
        return 0
    if speculative(model, policy, now):
        return 1  # a guess is one replica, whatever load scaling had added (R11)
    return min(base + model.extra_replicas, max(ceiling_now(model), base))


def scaling_state(model: ModelView) -> ScalingState:
    """The load-scaling memory a model's view carries (R7)."""
    return ScalingState(model.extra_replicas, model.busy_since, model.quiet_since, model.observed_per_replica,
                        model.crowded_since, model.trend)
