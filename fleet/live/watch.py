"""Per-web-process live state: the routing table, model status, agent pushes, usage.

One watcher task per web process (started lazily: daphne has no ASGI lifespan) does, every
``LLMGW_WATCH_INTERVAL`` (faster while requests are held for a cold start):

* one query for ready replicas on connected agents → the routing table the gateway reads,
  with each replica's concurrency (benchmarked, else learned) → each model's capacity and
  this process's share of it, split by the live web processes (read in the query that
  gives the listening window: no query of its own);
* one for each model's pass outcome (unservable + reason, replicas coming up) and the
  cluster's stopped flag;
* one for the generations of the agents connected to this process → push ``assign`` to
  those whose desired set moved (docs/architecture.md, "Crossing processes": generations);
* every ``LLMGW_AGENT_TOKEN_RECHECK``, one query for the token hashes of those agents →
  close the websockets of the re-keyed or deleted ones, silent ones included (docs/architecture.md,
  "Crossing processes": token re-check; a re-key in another process reaches no in-memory
  channel layer);
* a usage report (in-flight counts and last-use times) every ``LLMGW_USAGE_FLUSH_INTERVAL``,
  and with it the depths of the gateway's admission queues that changed or are due a
  fresh stamp (:class:`QueueDepths`);
* the agents' heartbeat stamps, batched (:class:`HeartbeatStamps`), and this process's
  registration as a control plane.

The gateway reaches this only through ``fleet.live``'s functions (``fleet/live/__init__.py``),
never the watcher's attributes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Callable, Protocol

from django.conf import settings
from django.db import DatabaseError, close_old_connections
from django.db.models import Case, F, IntegerField, OuterRef, Q, Subquery, Sum, Value, When
from django.db.models.functions import Cast, Coalesce
from django.utils import timezone

from catalog.models import Benchmark, ClusterSettings
from fleet.control import planes
from fleet.control.usage import record_queue_report, record_report
from fleet.models import Agent, ControlPlane, ModelState, Replica, engine_url
from fleet.planning.planner import backoff_wait_s
from fleet.protocol import error_summary
from fleet.states import COMING_UP, ReplicaState
from llmgw.background import in_background
from llmgw.process_name import process_name, this_process

log = logging.getLogger(__name__)

def process_id() -> str:
    """This web process's name in usage reports (``llmgw.process_name``: ``host:pid``, per
    call: processes may fork after import)."""
    return process_name()


@dataclass(frozen=True)
class Endpoint:
    """A ready replica the gateway may send requests to. ``key`` is its engine key, sent
    as ``Authorization: Bearer`` on every request to it (never shown in a repr).
    ``concurrency``: requests it runs at once — the ``catalog.models.Benchmark`` of its
    model on its profile, else its model's learned ``ModelState.observed_per_replica``;
    None when neither is known."""

    replica_id: int
    model_id: int
    url: str
    agent_name: str
    key: str = field(default="", repr=False)
    concurrency: int | None = None


@dataclass(frozen=True)
class Failures:
    """A model's replica failures that count for its backoff (docs/architecture.md, R9):
    those of the last hour since one of its replicas last stayed ready for
    ``LLMGW_BACKOFF_RESET_AFTER`` (as far as the failed rows tell: a replica that ran that
    long and then stopped is not read, so ``count`` may be over, never under).

    ``last_at`` is when the newest failed (its row's ``state_changed_at``), ``last_error``
    the last line of its error, ``retry_at`` when the planner may place again:
    ``last_at + min(LLMGW_BACKOFF_BASE · 2^(count-1), LLMGW_BACKOFF_CAP)``, the rule of
    ``fleet.planning.planner.backoff_remaining_s``."""

    count: int
    last_at: datetime
    last_error: str
    retry_at: datetime


@dataclass(frozen=True)
class SilentAgent:
    """An agent holding ready replicas of a model that routing dropped: silent for more
    than ``LLMGW_AGENT_ROUTE_GRACE`` but not yet declared lost. ``silent_since`` is when
    its silence started counting (its last message, or when the control plane could
    listen again if that is later: the planner's ``silent_for_s``)."""

    name: str
    silent_since: datetime


@dataclass(frozen=True)
class ModelStatus:
    """What the last refresh knows of one model besides its routes.

    ``unservable``/``reason``/``desired``: the last pass's verdict (``ModelState``);
    ``looked_at``: a pass recorded one (``reason_at`` set); ``coming_up``: replicas placing,
    downloading or starting; ``failures``: its crash loop, None without recent failures;
    ``silent_agents``: agents whose ready replicas of it are out of routing, by name."""

    unservable: bool = False
    reason: str = ""
    coming_up: int = 0
    wanted_at: datetime | None = None
    looked_at: bool = False
    desired: int = 0
    failures: Failures | None = None
    silent_agents: tuple[SilentAgent, ...] = ()


@dataclass
class View:
    """One refresh's picture. ``started_at`` is when the refresh began (monotonic).

    ``capacity``: model id → (cluster capacity, this process's share), for the gateway's
    admission queue: requests the model's routed replicas run at once
    (:func:`model_capacity`), and how many of them this process may have in flight
    (:func:`capacity_share` of its ``web_slot``). A model whose capacity is unknown (a
    routed replica without a benchmark or a learned figure) is absent: no limit.
    ``web_slot``: this process's (index, count) among the live web processes
    (``fleet.control.planes.web_slot``)."""

    routes: dict[int, tuple[Endpoint, ...]] = field(default_factory=dict)
    capacity: dict[int, tuple[int, int]] = field(default_factory=dict)
    web_slot: tuple[int, int] = (0, 1)
    status: dict[int, ModelStatus] = field(default_factory=dict)
    stopped: bool = False
    cold_start_timeout_s: float = 300.0
    #: ``LLMGW_AGENT_LOST_AFTER`` when the refresh ran: how long a silent agent keeps its replicas.
    agent_lost_after_s: float = 20.0
    started_at: float = 0.0
    version: int = 0
    #: What :attr:`Watcher.extra_loaders` returned (merged), loaded in the same refresh.
    extra: dict[str, Any] = field(default_factory=dict)


def capacity_share(total: int, index: int, count: int) -> int:
    """This web process's share of a model's ``total`` capacity, when ``count`` live web
    processes split it and this one is ``index`` (0-based, by host and pid):
    ``total // count``, plus one for the first ``total % count`` processes, and at least 1.
    The shares sum to ``total`` when ``total >= count``. With fewer slots than processes
    every process still gets one, which over-admits by design (up to ``count`` in flight):
    a process that may send nothing would queue its requests forever while another's slot
    sits idle; the engines queue the surplus instead."""
    return max(1, total // count + (1 if index < total % count else 0))


def model_capacity(endpoints: tuple[Endpoint, ...]) -> int | None:
    """Requests a model's routed replicas run at once: the sum of their ``concurrency``;
    None (unknown) when any of them is unknown, or none is routed."""
    if not endpoints or any(e.concurrency is None for e in endpoints):
        return None
    return sum(e.concurrency for e in endpoints)


def capacities(routes: dict[int, tuple[Endpoint, ...]], slot: tuple[int, int]) -> dict[int, tuple[int, int]]:
    """Model id → (capacity, this process's share at ``slot`` = (index, count)) for every
    routed model whose capacity is known (:attr:`View.capacity`)."""
    out: dict[int, tuple[int, int]] = {}
    for model_id, endpoints in routes.items():
        total = model_capacity(endpoints)
        if total is not None:
            out[model_id] = (total, capacity_share(total, *slot))
    return out


def _without(view: View, replica_ids: set[int]) -> View:
    """``view`` with the endpoints of ``replica_ids`` left out of its routes, and the
    capacities recounted without them (a copy)."""
    routes = {model_id: tuple(e for e in eps if e.replica_id not in replica_ids) for model_id, eps in view.routes.items()}
    routes = {k: v for k, v in routes.items() if v}
    return replace(view, routes=routes, capacity=capacities(routes, view.web_slot), version=view.version + 1)


@dataclass(frozen=True)
class AgentGenerations:
    """What one refresh read of the generations of the agents connected to this process
    (kept by the watcher, not part of the :class:`View` the gateway reads).

    ``key`` is ``(agent ids, sum of generations, sum of restart generations)``, None when no
    agent is connected here; ``by_agent`` maps an agent's id to ``(generation,
    restart_generation)``, or is None when ``key`` equals the previous refresh's (nothing
    moved: generations only grow, so the rows were not read)."""

    key: tuple | None = None
    by_agent: dict[int, tuple[int, int]] | None = None


class Pushable(Protocol):
    agent_id: int
    sent_generation: int
    restart_generation: int
    #: The hash of the token it connected with ("" for consumers that do not check one).
    token_sha256: str

    async def push_assign(self, force: bool = False) -> None: ...

    async def send_restart(self) -> None: ...

    async def agent_revoked(self, event: dict) -> None: ...


class UsageRecorder:
    """In-flight counts and last-use times per replica, for this process."""

    def __init__(self) -> None:
        self.in_flight: dict[int, int] = defaultdict(int)
        self.last_used: dict[int, datetime] = {}
        self.dirty = False

    def begin(self, replica_id: int) -> None:
        self.in_flight[replica_id] += 1
        self.last_used[replica_id] = timezone.now()
        self.dirty = True

    def end(self, replica_id: int) -> None:
        self.in_flight[replica_id] = max(0, self.in_flight[replica_id] - 1)
        self.last_used[replica_id] = timezone.now()
        self.dirty = True

    def take_report(self, known: set[int]) -> dict[int, tuple[int, datetime | None]]:
        """Replica id → (in flight, last used or None). Every replica in the routing table
        is reported (0 in flight is worth knowing); a replica still busy counts as used
        now, so a long stream never looks idle."""
        now = timezone.now()
        report: dict[int, tuple[int, datetime | None]] = {}
        for rid in known | set(self.in_flight) | set(self.last_used):
            flight = self.in_flight.get(rid, 0)
            used = now if flight else self.last_used.get(rid)
            report[rid] = (flight, used)
        self.last_used.clear()
        for rid in [r for r, n in self.in_flight.items() if n == 0]:
            del self.in_flight[rid]
        self.dirty = False
        return report


class QueueDepths:
    """This process's admission-queue depth per model (``fleet.live.set_queued``) and what
    it last wrote of each (``fleet.models.QueueReport``).

    A depth is written at the first usage flush after it changed, and re-stamped every
    ``LLMGW_LOAD_STALE / 3`` while it is not zero — the reconciler ignores reports older
    than ``LLMGW_LOAD_STALE``, so a live process's queue never looks stale — as loads are
    (:class:`HeartbeatStamps`). A depth back at 0 deletes the row. A write that fails
    (database away) leaves ``written`` as it was: the next flush retries."""

    def __init__(self) -> None:
        self.depths: dict[int, int] = {}
        #: Model id → (depth, when: ``time.monotonic``) this process last wrote.
        self.written: dict[int, tuple[int, float]] = {}

    def set(self, model_id: int, depth: int) -> None:
        """The queue of ``model_id`` holds ``depth`` requests now (no I/O)."""
        self.depths[int(model_id)] = max(0, int(depth))

    def due(self, now_s: float) -> dict[int, int]:
        """Model id → depth to write at ``now_s`` (monotonic seconds): changed since it was
        last written, or not zero and written ``LLMGW_LOAD_STALE / 3`` ago or more. A queue
        that was never written and is empty has no row to write."""
        refresh_s = settings.LLMGW_LOAD_STALE_S / 3
        out: dict[int, int] = {}
        for model_id, depth in self.depths.items():
            written = self.written.get(model_id)
            if written is None:
                stale = depth > 0
            else:
                stale = written[0] != depth or (depth > 0 and now_s - written[1] >= refresh_s)
            if stale:
                out[model_id] = depth
        return out

    def wrote(self, depths: dict[int, int], now_s: float) -> None:
        """``depths`` (from :meth:`due`) were written at ``now_s``; empty queues whose 0 is
        written are forgotten."""
        for model_id, depth in depths.items():
            self.written[model_id] = (depth, now_s)
        for model_id in [m for m, d in self.depths.items() if d == 0 and self.written.get(m, (0,))[0] == 0]:
            del self.depths[model_id]
            self.written.pop(model_id, None)


class HeartbeatStamps:
    """When each agent's latest message reached this process (stamped on arrival, by this
    clock), and the replica loads its heartbeats carried, kept in memory and written in a
    few UPDATEs per flush. A stamp that cannot be written (database away) is kept for the
    next flush, so the agents' silence is never the control plane's own. Stamps only move
    ``last_seen_at`` and ``load_reported_at`` forwards.

    Loads (docs/architecture.md, "Crossing processes": heartbeats): a replica's load is
    written when it differs from what this process last wrote for it, or when that write is
    ``LLMGW_LOAD_STALE / 3`` old — so a steady load costs one write per replica every few
    heartbeats, not one per heartbeat, and the stamp the reconciler reads is never older
    than that third plus one heartbeat interval (10 s with the defaults, under the 15 s
    after which a load counts as unknown). All the loads of a flush go out in one UPDATE per
    distinct stamp (rounded to ``RESOLUTION_S``), each row only where the reporting agent
    runs that replica."""

    #: Stamps are written rounded down to this (seconds): one UPDATE per distinct value.
    RESOLUTION_S = 0.1
    #: Most rows one load UPDATE names (SQLite's bound on query parameters).
    LOAD_BATCH = 200

    def __init__(self) -> None:
        self.pending: dict[int, datetime] = {}
        #: Replica id → (agent id, running, waiting, arrival), waiting for the next flush.
        self.pending_loads: dict[int, tuple[int, int | None, int | None, datetime]] = {}
        #: Replica id → (running, waiting, stamp) this process last wrote.
        self.written_loads: dict[int, tuple[int | None, int | None, datetime]] = {}
        self._lock = threading.Lock()  # stamp() runs in database_sync_to_async threads

    def stamp(self, agent_id: int, loads: dict[int, tuple[int | None, int | None]] | None = None,
              now: datetime | None = None) -> None:
        """Agent ``agent_id`` was heard at ``now`` (default: this clock), with ``loads``
        (replica id → (running, waiting), ``fleet.control.reports.heartbeat_loads``)."""
        now = now or timezone.now()
        refresh = timedelta(seconds=settings.LLMGW_LOAD_STALE_S / 3)
        with self._lock:
            self.pending[agent_id] = now
            for replica_id, (running, waiting) in (loads or {}).items():
                written = self.written_loads.get(replica_id)
                if written is not None and written[:2] == (running, waiting) and now - written[2] < refresh:
                    continue  # unchanged, and its stamp is still fresh enough
                self.pending_loads[replica_id] = (agent_id, running, waiting, now)

    def flush(self) -> int:
        """Write pending stamps and loads (blocking; ORM). Returns how many agents were
        stamped."""
        with self._lock:
            pending, self.pending = self.pending, {}
            loads, self.pending_loads = self.pending_loads, {}
        if not pending and not loads:
            return 0
        by_stamp: dict[datetime, list[int]] = defaultdict(list)
        for agent_id, at in pending.items():
            by_stamp[self._rounded(at)].append(agent_id)
        try:
            for at, ids in sorted(by_stamp.items()):
                Agent.objects.filter(Q(last_seen_at__lt=at) | Q(last_seen_at__isnull=True), id__in=ids).update(
                    last_seen_at=at)
            self._write_loads(loads)
        except Exception:
            with self._lock:  # keep them, unless a newer stamp arrived meanwhile
                for agent_id, at in pending.items():
                    self.pending.setdefault(agent_id, at)
                for replica_id, load in loads.items():
                    self.pending_loads.setdefault(replica_id, load)
            raise
        return len(pending)

    def _rounded(self, at: datetime) -> datetime:
        return datetime.fromtimestamp(at.timestamp() // self.RESOLUTION_S * self.RESOLUTION_S, tz=at.tzinfo)

    @staticmethod
    def _by_row(batch: list[tuple], column: int) -> Cast:
        """``CASE id WHEN … THEN count END`` over ``batch``, cast to an integer: a CASE of
        nothing but NULLs would otherwise be text to PostgreSQL."""
        count = IntegerField()
        return Cast(Case(*[When(pk=row[0], then=Value(row[column], output_field=count)) for row in batch],
                         output_field=count), count)

    def _write_loads(self, loads: dict[int, tuple[int, int | None, int | None, datetime]]) -> None:
        by_stamp: dict[datetime, list[tuple[int, int, int | None, int | None]]] = defaultdict(list)
        for replica_id, (agent_id, running, waiting, at) in loads.items():
            by_stamp[self._rounded(at)].append((replica_id, agent_id, running, waiting))
        for at, rows in sorted(by_stamp.items()):
            for i in range(0, len(rows), self.LOAD_BATCH):
                batch = rows[i:i + self.LOAD_BATCH]
                mine = Q()
                for agent_id in {row[1] for row in batch}:
                    mine |= Q(agent_id=agent_id, pk__in=[row[0] for row in batch if row[1] == agent_id])
                Replica.objects.filter(mine).filter(Q(load_reported_at__lt=at) | Q(load_reported_at__isnull=True)).update(
                    load_running=self._by_row(batch, 2), load_waiting=self._by_row(batch, 3), load_reported_at=at)
        with self._lock:
            for replica_id, (_, running, waiting, at) in loads.items():
                self.written_loads[replica_id] = (running, waiting, at)
            if len(self.written_loads) > 2 * len(loads) + 1000:  # forget replicas no longer heard of
                horizon = max(at for _, _, at in self.written_loads.values()) - timedelta(
                    seconds=settings.LLMGW_LOAD_STALE_S)
                self.written_loads = {rid: w for rid, w in self.written_loads.items() if w[2] >= horizon}


class Watcher:
    """The per-process loop described in the module docstring."""

    def __init__(self) -> None:
        self.view = View()
        self.agents: dict[int, Pushable] = {}
        #: Every agent consumer of this process, including an older socket of an agent that
        #: connected twice (``agents`` holds the newest): the token sweep closes them all.
        self.consumers: set[Pushable] = set()
        self.holders = 0
        self._changed: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._last_flush = 0.0
        self._routed_at: dict[int, float] = {}
        self._last_register = 0.0
        self._database_away_since: float | None = None
        self._generations: dict[int, tuple[int, int]] = {}
        self._generations_key: tuple | None = None
        self._last_token_sweep = 0.0
        #: Replicas an agent connected to this process reported not ready, taken out of
        #: routing at once (:meth:`withdraw`) and kept out until a refresh agrees or the
        #: agent reports them ready again (:meth:`readmit`). Replica id → (the agent that
        #: withdrew it, when: ``time.monotonic()``).
        self._withdrawn: dict[int, tuple[str, float]] = {}
        #: Replicas whose engine refused a connection here, out of routing until the time
        #: (``self.clock()``, monotonic) given (:meth:`quarantine`).
        self._quarantined: dict[int, float] = {}
        self.clock: Callable[[], float] = time.monotonic  # injected in tests
        #: Blocking callables run in each refresh (same worker thread, after the routing
        #: queries); their dicts are merged into ``View.extra``. Other apps (the gateway's
        #: key and catalog cache) register here, so ``fleet`` imports nothing of theirs.
        self.extra_loaders: list[Callable[[], dict[str, Any]]] = []

    # -- lifecycle -------------------------------------------------------------------------
    def ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is not None and not self._task.done() and self._task.get_loop() is loop:
            return
        self._changed = asyncio.Event()
        self._task = loop.create_task(self._run(), name="llmgw-watcher")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        await self.flush_usage(force=True)
        try:
            await self.flush_heartbeats()
        except Exception:
            log.warning("could not write the agents' last heartbeats", exc_info=True)

    # -- agents ----------------------------------------------------------------------------
    def register_agent(self, consumer: Pushable) -> None:
        self.agents[consumer.agent_id] = consumer
        self.consumers.add(consumer)

    def unregister_agent(self, consumer: Pushable) -> None:
        self.consumers.discard(consumer)
        if self.agents.get(consumer.agent_id) is consumer:
            del self.agents[consumer.agent_id]

    # -- routes an agent withdrew ----------------------------------------------------------
    def withdraw(self, replica_ids, agent_name: str) -> None:
        """Take ``replica_ids`` — of ``agent_name``'s, the agent reporting; an agent cannot
        withdraw another's — out of this process's routing table now, before their rows
        say so: an agent reported their engines not ready (exited, failed, stopping). The
        report's database write can wait behind other writers for seconds on a busy machine,
        and meanwhile a process that took a dead engine's port would be sent its requests
        (docs/architecture.md, "Decisions": readiness proves identity). Other web processes
        learn it from the database at their next refresh."""
        ids = {int(i) for i in replica_ids}
        now = time.monotonic()
        for rid in ids:
            self._withdrawn[rid] = (agent_name, now)
        mine = {e.replica_id for eps in self.view.routes.values() for e in eps
                if e.replica_id in ids and e.agent_name == agent_name}
        if not mine:
            return  # not routed now; a refresh from rows not written yet keeps them out
        self.view = _without(self.view, mine)
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def quarantine(self, replica_id: int, seconds: float) -> None:
        """Take ``replica_id`` out of this process's routing for ``seconds``: its port refused
        a connection, so its engine is gone (or going) and the agent's report of it may take
        a heartbeat to come. Meanwhile another process could take the port and be sent
        requests (docs/architecture.md, "Decisions": readiness proves identity). After
        ``seconds`` it is routed again if the rows still say ready (a refusal that passed)."""
        self._quarantined[int(replica_id)] = self.clock() + seconds
        if any(e.replica_id == replica_id for eps in self.view.routes.values() for e in eps):
            self.view = _without(self.view, {int(replica_id)})
            if self._changed is not None:
                self._changed.set()
                self._changed = asyncio.Event()

    def readmit(self, replica_ids) -> None:
        """The agent reports ``replica_ids`` ready again: the next refresh routes them if
        their rows agree."""
        for rid in replica_ids:
            self._withdrawn.pop(int(rid), None)

    # -- waiting ---------------------------------------------------------------------------
    async def wait_for_refresh(self, timeout_s: float) -> bool:
        """Wait until the next refresh lands (True) or ``timeout_s`` passes (False).

        A cancellation always raises ``CancelledError``, even one that comes while a refresh
        is waking the waiter (a held request's client hanging up, every 20 ms a chance while
        requests are held): ``asyncio.timeout``, not ``asyncio.wait_for``, which on Python
        3.11 then returns the refresh and drops the cancellation (CPython gh-86296, fixed in
        3.12): the request stayed held until its replica was ready and was never recorded
        499."""
        self.ensure_started()
        assert self._changed is not None
        event = self._changed
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
            return True
        except TimeoutError:
            return False

    async def refresh_now(self) -> View:
        await self._refresh()
        return self.view

    # -- the loop --------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            try:
                await self.flush_heartbeats()
                await self._refresh()
                await self._sweep_tokens()
                await self._push_agents()
                await self.flush_usage()
                await self._register()
                if self._database_away_since is not None:
                    # Good news, not a problem: the outage's start was the warning.
                    log.info("database back after %.1f s", time.monotonic() - self._database_away_since)
                    self._database_away_since = None
            except asyncio.CancelledError:
                raise
            except DatabaseError as exc:
                # Routing goes on from the last table; heartbeat stamps wait in memory.
                if self._database_away_since is None:
                    self._database_away_since = time.monotonic()
                    log.warning("database unavailable (%s): routing from the last table, retrying",
                                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
                await asyncio.sleep(0.5)
            except Exception:
                log.exception("watcher refresh failed; retrying")
                await asyncio.sleep(1.0)
            interval = (
                settings.LLMGW_WATCH_FAST_INTERVAL_S if self.holders else settings.LLMGW_WATCH_INTERVAL_S
            )
            await asyncio.sleep(interval)

    async def _refresh(self) -> None:
        started = time.monotonic()
        view, generations = await in_background(_load_view)(
            list(self.agents), self._generations_key, tuple(self.extra_loaders))
        view.started_at = started
        view.version = self.view.version + 1
        if self._withdrawn:
            # Kept out until a refresh no longer routes them (their rows caught up); an id
            # counts only for the agent that withdrew it. Only a refresh that began after the
            # withdrawal tells: one already reading when the report came may have read rows
            # from before the replica was ready, and letting it go then would route it again
            # at the next refresh of rows the report has not reached yet.
            routed = {e.replica_id: e.agent_name for eps in view.routes.values() for e in eps}
            self._withdrawn = {rid: (agent, at) for rid, (agent, at) in self._withdrawn.items()
                               if routed.get(rid) == agent or at >= started}
            if self._withdrawn:
                view = _without(view, set(self._withdrawn))
        if self._quarantined:
            now = self.clock()
            self._quarantined = {rid: until for rid, until in self._quarantined.items() if until > now}
            if self._quarantined:
                view = _without(view, set(self._quarantined))
        self.view = view
        if generations.by_agent is not None or generations.key is None:
            self._generations = generations.by_agent or {}
        self._generations_key = generations.key
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    async def _push_agents(self) -> None:
        for agent_id, (generation, restart) in self._generations.items():
            consumer = self.agents.get(agent_id)
            if consumer is None:
                continue
            try:
                if consumer.restart_generation < restart:
                    consumer.restart_generation = restart
                    await consumer.send_restart()
                elif consumer.sent_generation != generation:
                    await consumer.push_assign()
            except Exception:
                log.warning("could not reach agent %s", agent_id, exc_info=True)

    async def _sweep_tokens(self) -> None:
        """Every ``LLMGW_AGENT_TOKEN_RECHECK``: close the websocket of every agent here whose
        token was re-keyed or whose row was deleted, whether or not it sends anything."""
        now = time.monotonic()
        if not self.consumers or now - self._last_token_sweep < settings.LLMGW_AGENT_TOKEN_RECHECK_S:
            return
        self._last_token_sweep = now
        consumers = list(self.consumers)
        current = await in_background(_token_hashes)(list({c.agent_id for c in consumers}))
        for consumer in consumers:
            agent_id, held = consumer.agent_id, getattr(consumer, "token_sha256", "")
            if held and current.get(agent_id) != held:
                try:
                    await consumer.agent_revoked({"type": "agent.revoked"})
                except Exception:
                    log.warning("could not close the websocket of revoked agent %s", agent_id, exc_info=True)

    async def _register(self) -> None:
        """Keep this web process registered as a control plane (for status and restart)."""
        now = time.monotonic()
        if now - self._last_register < settings.LLMGW_CONTROL_PLANE_HEARTBEAT_S:
            return
        self._last_register = now
        await in_background(register_web_process)()

    async def flush_heartbeats(self) -> None:
        if heartbeats.pending or heartbeats.pending_loads:
            await in_background(heartbeats.flush)()

    async def flush_usage(self, force: bool = False) -> None:
        now = time.monotonic()
        due = now - self._last_flush >= settings.LLMGW_USAGE_FLUSH_INTERVAL_S
        if not (force or due):
            return
        # Replicas routed recently are still reported (0 in flight is worth knowing): a
        # draining replica has left the routing table, and its drain waits for a report
        # made after the drain began.
        for eps in self.view.routes.values():
            for e in eps:
                self._routed_at[e.replica_id] = now
        for rid in [r for r, at in self._routed_at.items() if now - at > 120.0]:
            del self._routed_at[rid]
        report = usage.take_report(set(self._routed_at))
        self._last_flush = now
        if report:
            await in_background(record_report)(process_id(), report)
        depths = queued.due(now)
        if depths:
            await in_background(record_queue_report)(process_id(), depths)
            queued.wrote(depths, now)


def register_web_process() -> None:
    """Register (or refresh) this web process as a control plane. After a gap — this
    process or the database stalled, so heartbeats may have gone unrecorded — its row's
    ``started_at`` restarts: the lost-agent rule counts silence from there
    (``fleet.control.planes.listening_since``)."""
    now = timezone.now()
    host, pid = this_process()
    ControlPlane.objects.filter(
        host=host, role=ControlPlane.Role.WEB, pid=pid,
        last_seen_at__lt=now - timedelta(seconds=planes.control_plane_stall_s()),
    ).update(started_at=now)
    ControlPlane.heartbeat(ControlPlane.Role.WEB)


def _token_hashes(agent_ids: list[int]) -> dict[int, str]:
    """The current token hash of each of ``agent_ids`` that still exists."""
    close_old_connections()
    return dict(Agent.objects.filter(id__in=agent_ids).values_list("id", "token_sha256"))


def _silent_agents(by_name: dict[str, datetime] | None) -> tuple[SilentAgent, ...]:
    return tuple(SilentAgent(name, since) for name, since in sorted((by_name or {}).items()))


#: How far back failures count for backoff, as in ``fleet.control.snapshot.load_snapshot``.
FAILURE_HORIZON = timedelta(hours=1)


def _failures(now: datetime) -> dict[int, Failures]:
    """Model id → its crash loop (:class:`Failures`), from one query on the failed
    replicas of the last hour (blocking; ORM). A failed replica that had stayed ready for
    ``LLMGW_BACKOFF_RESET_AFTER`` forgives the failures before it (``proved_stable``)."""
    stable = timedelta(seconds=settings.LLMGW_BACKOFF_RESET_AFTER_S)
    by_model: dict[int, list[tuple[datetime, str]]] = defaultdict(list)
    rows = Replica.objects.filter(
        state=ReplicaState.FAILED.value, state_changed_at__gte=now - FAILURE_HORIZON,
    ).order_by("state_changed_at", "id").values_list("model_id", "state_changed_at", "ready_at", "error")
    for model_id, failed_at, ready_at, error in rows:
        if ready_at is not None and failed_at - ready_at >= stable:
            by_model[model_id].clear()  # it proved the model runs: the loop starts over
        by_model[model_id].append((failed_at, error))
    base_s, cap_s = settings.LLMGW_BACKOFF_BASE_S, settings.LLMGW_BACKOFF_CAP_S
    out: dict[int, Failures] = {}
    for model_id, failed in by_model.items():
        n = len(failed)
        last_at, error = failed[-1]
        wait_s = backoff_wait_s(n, base_s, cap_s)
        line = error_summary(error)
        out[model_id] = Failures(n, last_at, line[:300], last_at + timedelta(seconds=wait_s))
    return out


def _load_view(agent_ids: list[int], previous_key: tuple | None = None,
               loaders: tuple[Callable[[], dict[str, Any]], ...] = ()) -> tuple[View, AgentGenerations]:
    """One refresh (blocking; ORM): the picture for the gateway, and the generations of
    ``agent_ids`` (read in full only when their key moved from ``previous_key``)."""
    close_old_connections()
    view = View()
    routes: dict[int, list[Endpoint]] = defaultdict(list)
    coming: dict[int, int] = defaultdict(int)
    # An agent heard from within the route grace keeps its replicas routable: a restarting
    # agent (seconds) leaves its engines serving; a silent one drops out of routing. Just
    # after the control plane could not listen (the database, or every web process, was
    # away), an older stamp does not make an agent silent if it is connected to this process
    # (its stamps are on their way) — but the rows of an agent no one has heard since are
    # not trusted: its reports of engines that died meanwhile may never have landed, and a
    # process on a dead engine's port would be sent requests (the soak's web restart).
    now = timezone.now()
    heard_since = now - timedelta(seconds=settings.LLMGW_AGENT_ROUTE_GRACE_S)
    webs = planes.web_planes()  # one read for the listening window and this process's share
    listening = planes.listening_since(now, webs)
    just_listening = listening is not None and listening > heard_since
    connected_here = set(agent_ids)
    # A deleted model's replicas (model None) leave routing at once, before a pass drains them.
    # Each carries its concurrency in the same query: its model's benchmark on its profile,
    # else the model's learned figure.
    measured = Benchmark.objects.filter(model=OuterRef("model_id"), profile=OuterRef("profile_id")).values(
        "max_concurrency")[:1]
    rows = Replica.objects.filter(
        state__in=[ReplicaState.READY.value] + [s.value for s in COMING_UP], model__isnull=False,
    ).annotate(concurrency=Coalesce(Subquery(measured), F("model__fleet_state__observed_per_replica"))).values_list(
        "id", "model_id", "state", "port", "agent__address", "agent__name", "agent__last_seen_at", "engine_key",
        "agent_id", "concurrency")
    silent: dict[int, dict[str, datetime]] = defaultdict(dict)
    for rid, model_id, state, port, address, agent_name, last_seen, key, agent_id, concurrency in rows:
        if state == ReplicaState.READY.value:
            heard = last_seen is not None and (last_seen >= heard_since or (just_listening and agent_id in connected_here))
            if heard and port:
                routes[model_id].append(Endpoint(rid, model_id, engine_url(address, port), agent_name, key,
                                                 concurrency))
            elif last_seen is not None:
                silent[model_id][agent_name] = max(last_seen, listening) if listening is not None else last_seen
        else:
            coming[model_id] += 1
    view.routes = {k: tuple(sorted(v, key=lambda e: e.replica_id)) for k, v in routes.items()}
    view.web_slot = planes.web_slot(now, webs)
    view.capacity = capacities(view.routes, view.web_slot)
    view.agent_lost_after_s = float(settings.LLMGW_AGENT_LOST_AFTER_S)
    failures = _failures(now)
    seen: set[int] = set()
    for model_id, unservable, reason, wanted_at, reason_at, desired in ModelState.objects.values_list(
        "model_id", "unservable", "reason", "wanted_at", "reason_at", "desired"
    ):
        seen.add(model_id)
        view.status[model_id] = ModelStatus(
            unservable, reason, coming.get(model_id, 0), wanted_at, reason_at is not None, desired,
            failures.get(model_id), _silent_agents(silent.get(model_id)))
    for model_id in (set(coming) | set(failures) | set(silent)) - seen:
        view.status[model_id] = ModelStatus(coming_up=coming.get(model_id, 0), failures=failures.get(model_id),
                                            silent_agents=_silent_agents(silent.get(model_id)))
    row = ClusterSettings.objects.filter(pk=1).values_list("stopped", "cold_start_timeout_s").first()
    if row is not None:
        view.stopped, view.cold_start_timeout_s = bool(row[0]), float(row[1])
    generations = AgentGenerations()
    if agent_ids:
        # Generations only grow: unchanged sums (and the same agents) mean nothing to push,
        # one row instead of one per agent connected here (a thousand, five times a second).
        totals = Agent.objects.aggregate(g=Sum("generation"), r=Sum("restart_generation"))
        key = (frozenset(agent_ids), totals["g"], totals["r"])
        by_agent = None
        if key != previous_key:
            by_agent = {
                agent_id: (generation, restart)
                for agent_id, generation, restart in Agent.objects.filter(id__in=agent_ids).values_list(
                    "id", "generation", "restart_generation")
            }
        generations = AgentGenerations(key, by_agent)
    for loader in loaders:
        view.extra.update(loader())
    return view, generations


usage = UsageRecorder()
queued = QueueDepths()
heartbeats = HeartbeatStamps()
watcher = Watcher()
