"""Each web process's runtime, and the gateway's only door into ``fleet``.

``fleet.live.watch`` keeps this process's picture of the cluster (routing table, model
status, the stopped flag) fresh; ``fleet.live.consumer`` holds the agents' websockets. The
gateway reads and reports through the names below and nothing else: it never mutates the
watcher, so the watcher can change its insides freely (docs/architecture.md, "Dependency
direction").

What the gateway may do:

* read :func:`current_view` (no I/O) or :func:`fresh_view` (refreshes once if this process
  has no picture yet);
* hold a request for a cold start inside :func:`holding` (the watcher refreshes faster
  while anyone holds; a request cancelled because its client went away leaves it, so it
  stops counting at once) and :func:`wait_for_change`;
* count requests per replica with :func:`begin_request` / :func:`end_request` and read
  :func:`in_flight`; choose a replica with :func:`route` (a model's routing policy,
  ``fleet.planning.routing``, on this process's in-flight counts and memory of where it
  sent prompt prefixes and sessions);
* read a model's :func:`capacity` (the cluster's, and this process's share) for its
  admission queue, and report the queue's depth with :func:`set_queued` (no I/O: the
  watcher writes it; the reconciler counts it as load);
* ask for an on-demand model with :func:`want_model` (blocking; ORM);
* add a blocking loader of its own to each refresh (:func:`add_loader`), whose dict lands
  in ``View.extra``.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Collection
from typing import Any

from fleet.control.demand import want as want_model
from fleet.planning.routing import LEAST_LOADED, NO_KEYS, POLICIES, Decision, RecentRoutes, RouteKeys, choose
from fleet.live.watch import Endpoint, Failures, ModelStatus, SilentAgent, View, queued, usage, watcher

__all__ = [
    "LEAST_LOADED", "NO_KEYS", "POLICIES", "Decision", "Endpoint", "Failures", "ModelStatus", "RouteKeys",
    "SilentAgent", "View", "add_loader", "begin_request", "capacity", "current_view", "end_request", "fresh_view",
    "holding", "in_flight", "refused", "route", "set_queued", "start", "stop", "wait_for_change", "want_model",
]


def current_view() -> View:
    """This process's latest picture (possibly empty before the first refresh; no I/O).
    Starts the watcher if it is not running on this event loop."""
    watcher.ensure_started()
    return watcher.view


async def fresh_view() -> View:
    """The latest picture, refreshed now if this process has none yet (its first request)."""
    watcher.ensure_started()
    return watcher.view if watcher.view.version else await watcher.refresh_now()


async def wait_for_change(timeout_s: float) -> bool:
    """Wait until the next refresh lands (True) or ``timeout_s`` passes (False)."""
    return await watcher.wait_for_refresh(timeout_s)


@contextlib.asynccontextmanager
async def holding() -> AsyncIterator[None]:
    """Mark a request as held for a replica: while any is, the watcher refreshes every
    ``LLMGW_WATCH_FAST_INTERVAL`` instead of ``LLMGW_WATCH_INTERVAL``."""
    watcher.holders += 1
    try:
        yield
    finally:
        watcher.holders -= 1


def begin_request(replica_id: int) -> None:
    """A request was sent to ``replica_id`` (counted in flight, and as a use now)."""
    usage.begin(replica_id)


#: Seconds a replica whose port refused a connection stays out of this process's routes.
REFUSED_QUARANTINE_S = 2.0


def refused(replica_id: int) -> None:
    """The engine of ``replica_id`` refused a connection: out of this process's routes for
    :data:`REFUSED_QUARANTINE_S` (``Watcher.quarantine``)."""
    watcher.quarantine(replica_id, REFUSED_QUARANTINE_S)


def end_request(replica_id: int) -> None:
    """A request to ``replica_id`` ended (answered, failed or cancelled)."""
    usage.end(replica_id)


def in_flight(replica_id: int) -> int:
    """Requests this process has in flight on ``replica_id``."""
    return usage.in_flight.get(replica_id, 0)


#: Model id → its turn counter: ties take turns per model (one counter for all models would
#: give a model whose requests interleave with another's every other turn only).
_turns: dict[int, itertools.count] = {}
#: Model id → where this process sent that model's prompt prefixes and sessions lately.
_recent: dict[int, RecentRoutes] = {}


def route(endpoints: tuple[Endpoint, ...], policy: str = LEAST_LOADED, keys: RouteKeys = NO_KEYS,
          exclude: Collection[int] = frozenset()) -> tuple[Endpoint, Decision] | None:
    """The endpoint of ``endpoints`` (one model's routes) that takes a request routed by
    ``policy`` and ``keys``, and how it was chosen (``fleet.planning.routing.choose`` on
    this process's in-flight counts; a keyed choice is remembered per model); None when
    every endpoint is in ``exclude`` (replica ids)."""
    candidates = [e for e in endpoints if e.replica_id not in exclude] if exclude else endpoints
    if not candidates:
        return None
    counts = usage.in_flight
    loads = [(e.replica_id, counts.get(e.replica_id, 0)) for e in candidates]
    recent = None
    if policy != LEAST_LOADED:
        recent = _recent.get(candidates[0].model_id)
        if recent is None:
            recent = _recent[candidates[0].model_id] = RecentRoutes()
    model_id = candidates[0].model_id
    turns = _turns.get(model_id)
    if turns is None:
        turns = _turns[model_id] = itertools.count()
    decision = choose(policy, loads, keys, recent, next(turns))
    return next(e for e in candidates if e.replica_id == decision.replica_id), decision


def capacity(model_id: int) -> tuple[int, int] | None:
    """``(cluster capacity, this process's share)`` of ``model_id`` in the current view, in
    requests run at once (``View.capacity``; no I/O): the sum of its routed replicas'
    concurrency, and how many of those this web process may have in flight. None when it
    is unknown (a routed replica with neither a benchmark nor a learned figure, or no
    replica routed): admit without limit."""
    return watcher.view.capacity.get(model_id)


def set_queued(model_id: int, depth: int) -> None:
    """This process's admission queue for ``model_id`` now holds ``depth`` requests (no
    I/O; call it from the event loop whenever the depth changes, 0 when it empties: a depth
    is not forgotten on its own). The watcher reports it to the database
    (``fleet.models.QueueReport``) and the reconciler adds it to the model's waiting load,
    so load scaling sees requests the engines never saw."""
    queued.set(model_id, depth)


def add_loader(load: Callable[[], dict[str, Any]]) -> None:
    """Run ``load`` (blocking, in the refresh's worker thread) in every refresh and merge
    its dict into ``View.extra``. Adding the same callable twice adds it once."""
    if load not in watcher.extra_loaders:
        watcher.extra_loaders.append(load)


def start() -> None:
    """Start the watcher on the running event loop now (a web process at its start): it
    registers this process as a control plane in its first loop, so ``status`` lists the
    process from its start rather than from its first request."""
    watcher.ensure_started()


async def stop() -> None:
    """Stop the watcher and write what it holds in memory (usage report, heartbeat stamps)."""
    await watcher.stop()
