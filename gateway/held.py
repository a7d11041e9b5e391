"""What a request for a model with no route is told, from this process's view of the
cluster (``fleet.live``), and when a held request stops waiting (docs/architecture.md,
"Gateway rules": cold start, agent silence).

:func:`verdict` is pure: the model's :class:`~fleet.live.ModelStatus`, the view and the
wall clock in, an answer (or None: hold / keep holding) out. The proxy asks it once before
holding and again after every refresh of the view while it holds, so every held request
of a model wakes on the same refresh and gets the same answer within one
``LLMGW_WATCH_FAST_INTERVAL`` of the row that decides it (a pass's verdict, an agent's
report of a failed start).

Answers, all 503 with ``Retry-After`` (``code``):

* ``system_stopped`` — the cluster is stopped;
* ``agent_silent`` — the model's ready replicas are all on agents silent past the route
  grace (routing dropped them) and nothing else is coming up: which agent, for how long,
  and in how many seconds the planner re-places its replicas if it stays silent
  (``LLMGW_AGENT_LOST_AFTER``); ``Retry-After`` is that many seconds;
* ``model_unavailable`` — the planner says it cannot be served (its reason), or a fixed
  model the planner wants no replica of now;
* ``replica_start_failed`` — held, and a replica of the model failed since (the agent's
  error line), nothing else coming up: the answer at once, not at the next pass;
* ``crash_loop`` — recent failures hold off the next placement: the last error line and
  when the next try is due; ``Retry-After`` is the seconds until then.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime

from django.http import HttpResponse

from fleet.live import Failures, ModelStatus, View
from gateway import metrics
from gateway.errors import openai_error


@dataclass(frozen=True)
class HoldStart:
    """What a held request knew when it began holding.

    ``trust_after``: monotonic seconds; for an on-demand model, the view's "unservable" counts
    only from a refresh started after this (the request's want cleared the old verdict).
    ``failure_at``: when the model's newest failure known then happened (None: none): a
    newer one is the failed start of the replica this request waits for."""

    trust_after: float
    failure_at: datetime | None


def hold_start(status: ModelStatus, trust_after: float) -> HoldStart:
    """The :class:`HoldStart` of a request that starts holding now, ``status`` being its
    model's status in the view it last read."""
    return HoldStart(trust_after, status.failures.last_at if status.failures else None)


def began_holding(name: str) -> float:
    """Count a request of model ``name`` as held now (``llmgw_requests_held``, and the total
    ``llmgw_requests_held_for_cold_start``); returns the monotonic start for :func:`ended_holding`."""
    metrics.HELD.inc()
    metrics.HELD_BY_MODEL.labels(name).inc()
    return time.monotonic()


def ended_holding(name: str, began: float) -> None:
    """The hold :func:`began_holding` counted is over, whatever ended it: no longer held, and
    its duration observed (``llmgw_request_hold_seconds``)."""
    metrics.HELD.dec()
    metrics.HELD_BY_MODEL.labels(name).dec()
    metrics.HOLD_TIME.labels(name).observe(time.monotonic() - began)


def verdict(name: str, on_demand: bool, status: ModelStatus, view: View, now: datetime,
            held: HoldStart | None = None) -> HttpResponse | None:
    """The answer for model ``name`` when its view has no route, or None to hold (keep
    holding) the request. ``held`` is None before the request holds (a verdict of an
    on-demand model is not trusted then: the request's want starts afresh); ``now`` is
    the wall clock (timezone-aware). Rules in the module docstring."""
    if view.stopped:
        return openai_error(503, "The cluster is stopped by its operators.", code="system_stopped")
    nothing_coming = status.coming_up == 0
    if status.silent_agents and nothing_coming:
        return _agent_silent(name, status, view, now)
    trusted = not on_demand or (held is not None and view.started_at >= held.trust_after)
    if status.unservable and trusted:
        return unavailable(name, status)
    failures = status.failures
    if failures is not None and nothing_coming:
        if held is not None and (held.failure_at is None or failures.last_at > held.failure_at):
            return _start_failed(name, failures, now)
        if failures.retry_at > now:
            return _crash_loop(name, failures, now)
    if not on_demand and status.looked_at and status.desired == 0 and nothing_coming:
        return unavailable(name, status)
    return None


def unavailable(name: str, status: ModelStatus) -> HttpResponse:
    """503 ``model_unavailable`` with the planner's reason."""
    reason = status.reason or "no replica is placed yet"
    return openai_error(503, f"No ready replica for '{name}': {reason}", code="model_unavailable",
                        headers={"Retry-After": "10"})


def _next_try(failures: Failures, now: datetime) -> tuple[str, int]:
    """Words for when the next try is due, and the seconds until then (at least 1)."""
    wait_s = (failures.retry_at - now).total_seconds()
    at = failures.retry_at.strftime("%H:%M:%S %Z").strip()
    if wait_s <= 0:
        return f"next try due now ({at})", 1
    return f"next try in {wait_s:.0f} s (at {at})", max(1, math.ceil(wait_s))


def _start_failed(name: str, failures: Failures, now: datetime) -> HttpResponse:
    when, retry_s = _next_try(failures, now)
    error = failures.last_error or "no error line reported"
    return openai_error(
        503, f"The replica starting for '{name}' failed: {error} (crash loop: {failures.count} failure(s) in a row, "
             f"{when}).", code="replica_start_failed", headers={"Retry-After": str(retry_s)})


def _crash_loop(name: str, failures: Failures, now: datetime) -> HttpResponse:
    when, retry_s = _next_try(failures, now)
    error = failures.last_error or "no error line reported"
    return openai_error(
        503, f"No ready replica for '{name}': crash loop: {failures.count} failure(s) in a row, last error: {error}; "
             f"{when}.", code="crash_loop", headers={"Retry-After": str(retry_s)})


def _agent_silent(name: str, status: ModelStatus, view: View, now: datetime) -> HttpResponse:
    parts, waits = [], []
    for agent in status.silent_agents:
        silent_s = max(0.0, (now - agent.silent_since).total_seconds())
        left_s = view.agent_lost_after_s - silent_s
        if left_s > 0:
            parts.append(f"agent {agent.name} silent for {silent_s:.0f} s; its replicas are re-placed in "
                         f"{math.ceil(left_s)} s if it stays silent")
            waits.append(math.ceil(left_s))
        else:
            parts.append(f"agent {agent.name} silent for {silent_s:.0f} s; its replicas are re-placed as soon as a "
                         "pass declares it lost")
            waits.append(2)
    return openai_error(503, f"No ready replica for '{name}': " + "; ".join(parts) + ".", code="agent_silent",
                        headers={"Retry-After": str(max(1, min(waits)))})
