"""The gateway's admission queue (issue 16): above a model's capacity — requests at once in
this web process, the fleet's share for it — requests wait here, not at the engine.

Order of admission, the rule written once in :class:`FairQueue`:

1. **priority class**, higher first, strictly: a waiting request of a higher class is
   always admitted before any of a lower one;
2. **weighted fair share across tenants** within a class, on *tokens* (a ticket's ``cost``,
   the tokens it reserves), by start-time fair queuing (below);
3. **FIFO within one tenant** (push order).

Two layers, a functional core and an imperative shell:

* :class:`FairQueue` — pure: no asyncio, no clock, no Django; O(log n) per operation, so it
  stays cheap with 10,000 waiting (``bench/admission_queue.py``).
* :class:`Gate` — one per model per process and event loop (:func:`gate_for`): ``async with
  gate.admit(ticket, capacity, wait_s)`` admits at once under capacity, else waits its turn
  in the queue; a bounded wait ends in :class:`QueueTimeout` (the proxy answers 429 with
  ``Retry-After``, :meth:`QueueTimeout.response`), never a hang; a waiter whose task is
  cancelled (its client left) leaves the queue at once. ``on_depth(depth)`` is told every
  change of the queue's depth: the scaler's demand.

**Fairness: start-time fair queuing (SFQ; Goyal, Vin & Cheng, 1996).** Each priority class
keeps a virtual time ``V``. When a tenant's ticket reaches the head of the tenant's FIFO it
gets the start tag ``S = max(V, F)``, ``F`` being the finish tag of the tenant's last
admitted ticket; the pop takes the tenant with the smallest ``S`` (ties: the smaller
``seq``), sets ``V = S`` and the tenant's ``F = S + cost / weight``. A tenant returning from
idle starts at ``V``: it gets no credit for the time it was away (its debt, a finish tag
still ahead of ``V``, is kept). Bound: over any stretch in which tenants *i* and *j* both
have a backlog, the tokens admitted (``W``) satisfy
``|W_i / w_i − W_j / w_j| ≤ c_i / w_i + c_j / w_j`` (``c``: the largest single cost of each)
— a tenant with a backlog is admitted at least its weight share of tokens, within one
request's cost. Because a new tenant's start tag is ``V`` whatever its cost, a light tenant
arriving behind a flood of another is popped within the next two. SFQ rather than deficit
round robin: DRR's quantum must exceed the largest request to keep O(1), and a small
quantum with big requests makes a tenant wait several rounds; SFQ needs no quantum.

Admission counts requests (capacity is "requests at once"); fairness counts tokens: a
tenant of big requests gets fewer admissions, not more tokens.

**Headroom for a tenant under its share.** A fair order alone cannot help a light tenant
behind a flood: its request is first in line, but the next slot frees only when one of the
flood's requests ends — up to a whole request away. So a request whose tenant runs fewer
than its weight share of the capacity (``capacity × weight / Σ weights`` of the tenants
running or waiting; at least one request), with nothing of its own waiting and nothing of a higher class waiting,
is admitted at once into a headroom of :data:`HEADROOM_FRACTION` of the capacity (at least
one) above it. The engine runs at most that much over its measured capacity, briefly: the
flood is admitted again only once the total is back under capacity. A flooding tenant is
always at or over its share, so it never uses the headroom.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from django.http import HttpResponse

from gateway.errors import openai_error

log = logging.getLogger(__name__)

#: Service times (seconds from admission to release) kept per gate for ``Retry-After``.
SERVICE_SAMPLES = 32
#: Above a gate's capacity, the share of it lent to tenants under their fair share (at least 1).
HEADROOM_FRACTION = 0.1

_seqs = itertools.count(1)


@dataclass(eq=False, slots=True)
class Ticket:
    """One request's place in a :class:`FairQueue`.

    ``priority``: its class, higher first (strict). ``tenant``: whom fairness is among (a
    team, or a key without one). ``weight`` (> 0): the tenant's share. ``cost`` (≥ 1): the
    tokens it reserves (prompt + max output). ``seq``: arrival number, the tie-breaker
    between tenants (:func:`ticket` assigns one). ``payload``: the caller's, untouched.
    Compared by identity; one ticket is in at most one queue at a time."""

    priority: int
    tenant: str
    weight: float
    cost: int
    seq: int
    payload: Any = None
    _tenant: _Tenant | None = field(default=None, init=False, repr=False)


def check(t: Ticket) -> None:
    """Raise ValueError unless ``t`` has a finite weight > 0 and a cost ≥ 1 (a zero cost or
    an infinite weight would keep its tenant's start tag at ``V`` for ever: the others
    starve)."""
    if not (t.weight > 0 and math.isfinite(t.weight)):
        raise ValueError(f"weight must be finite and > 0, got {t.weight!r}")
    if t.cost < 1:
        raise ValueError(f"cost must be ≥ 1 token, got {t.cost!r}")


def ticket(priority: int, tenant: str, weight: float, cost: int, payload: Any = None) -> Ticket:
    """A :class:`Ticket` with this process's next arrival number."""
    return Ticket(priority, tenant, weight, cost, next(_seqs), payload)


class _Tenant:
    """A tenant within one priority class: its FIFO, which may still hold removed tickets
    (``ticket._tenant is not self``; skipped when reached, compacted when they outnumber
    the live ones), and its finish tag."""

    __slots__ = ("name", "cls", "tickets", "live", "dead", "finish", "entry", "idle_listed")

    def __init__(self, name: str, cls: _Class, finish: float) -> None:
        self.name = name
        self.cls = cls
        self.tickets: deque[Ticket] = deque()
        self.live = 0
        self.dead = 0
        self.finish = finish
        self.entry = 0  # id of its valid entry in cls.heap; 0: none (no backlog)
        self.idle_listed = False


class _Class:
    """One priority class: virtual time, tenants (backlogged ones, and idle ones whose
    finish tag is still ahead of ``virtual``), and the heap of backlogged tenants by start
    tag. Heap entries are ``(start, head seq, entry id, tenant)``; an entry whose id is not
    its tenant's ``entry`` is stale."""

    __slots__ = ("owner", "priority", "virtual", "tenants", "heap", "stale", "live", "idle")

    def __init__(self, owner: FairQueue, priority: int) -> None:
        self.owner = owner
        self.priority = priority
        self.virtual = 0.0
        self.tenants: dict[str, _Tenant] = {}
        self.heap: list[tuple[float, int, int, _Tenant]] = []
        self.stale = 0
        self.live = 0
        self.idle: list[tuple[float, str]] = []  # (finish, tenant name) of idle tenants


class FairQueue:
    """Waiting tickets, popped by priority class, then weighted fair share on tokens across
    tenants (start-time fair queuing, module docstring), then FIFO within a tenant.

    ``push``/``pop`` are O(log n), ``remove`` O(1) amortised. Pure: no clock, no asyncio.
    A class that empties is forgotten with its tenants' tags (nothing waits in it, so there
    is nobody to be fair to)."""

    _COMPACT_AFTER = 32  # removed entries kept before a FIFO or heap is rebuilt

    def __init__(self) -> None:
        self._classes: dict[int, _Class] = {}
        self._priorities: list[int] = []  # heap of -priority; may name classes gone
        self._listed: set[int] = set()  # priorities in self._priorities
        self._len = 0
        self._entries = itertools.count(1)

    def __len__(self) -> int:
        return self._len

    def __contains__(self, t: Ticket) -> bool:
        return t._tenant is not None and t._tenant.cls.owner is self

    def depth(self, priority: int | None = None) -> int:
        """Tickets waiting: all of them, or those of one priority class."""
        if priority is None:
            return self._len
        cls = self._classes.get(priority)
        return cls.live if cls is not None else 0

    def depth_at_or_above(self, priority: int) -> int:
        """Tickets waiting in classes of ``priority`` or higher: those that a ticket of
        ``priority`` waits behind or beside. O(number of classes)."""
        return sum(cls.live for p, cls in self._classes.items() if p >= priority)

    def virtual_time(self, priority: int) -> float:
        """The class's virtual time (tokens per unit weight); 0.0 for a class with no
        ticket waiting."""
        cls = self._classes.get(priority)
        return cls.virtual if cls is not None else 0.0

    def backlogged(self, priority: int) -> dict[str, int]:
        """Tenant → tickets waiting, in one class."""
        cls = self._classes.get(priority)
        if cls is None:
            return {}
        return {name: t.live for name, t in cls.tenants.items() if t.live}

    def tracked_tenants(self, priority: int) -> int:
        """Tenants a class keeps state for, backlogged or idle with a debt (memory bound)."""
        cls = self._classes.get(priority)
        return len(cls.tenants) if cls is not None else 0

    def push(self, t: Ticket) -> None:
        """Queue ``t`` behind its tenant's others. Raises ValueError for a ticket already
        queued or one that :func:`check` refuses."""
        if t._tenant is not None:
            raise ValueError("ticket is already queued")
        check(t)
        cls = self._classes.get(t.priority)
        if cls is None:
            cls = self._classes[t.priority] = _Class(self, t.priority)
            if t.priority not in self._listed:
                self._listed.add(t.priority)
                heapq.heappush(self._priorities, -t.priority)
        tenant = cls.tenants.get(t.tenant)
        if tenant is None:
            tenant = cls.tenants[t.tenant] = _Tenant(t.tenant, cls, cls.virtual)
        tenant.tickets.append(t)
        t._tenant = tenant
        tenant.live += 1
        cls.live += 1
        self._len += 1
        if tenant.live == 1:
            self._schedule(cls, tenant)

    def remove(self, t: Ticket) -> bool:
        """Take ``t`` out wherever it waits; False if it is not queued (popped, removed,
        never pushed)."""
        if t not in self:
            return False
        tenant = t._tenant
        cls = tenant.cls
        t._tenant = None
        tenant.live -= 1
        cls.live -= 1
        self._len -= 1
        if cls.live == 0:
            self._drop(cls)
            return True
        if tenant.live == 0:
            tenant.tickets.clear()
            tenant.dead = 0
            tenant.entry = 0
            cls.stale += 1
            if tenant.finish <= cls.virtual:
                del cls.tenants[tenant.name]  # no debt: it would start at V anyway
            else:
                self._list_idle(cls, tenant)
            if cls.stale > self._COMPACT_AFTER and cls.stale * 2 > len(cls.heap):
                cls.heap = [e for e in cls.heap if e[3].entry == e[2]]
                heapq.heapify(cls.heap)
                cls.stale = 0
        else:
            tenant.dead += 1
            if tenant.dead > self._COMPACT_AFTER and tenant.dead > tenant.live:
                tenant.tickets = deque(x for x in tenant.tickets if x._tenant is tenant)
                tenant.dead = 0
        return True

    def pop(self) -> Ticket | None:
        """The next ticket to admit (removed from the queue), or None when none waits."""
        cls = self._top_class()
        if cls is None:
            return None
        while True:
            start, _, entry, tenant = heapq.heappop(cls.heap)
            if tenant.entry == entry:
                break
            cls.stale -= 1
        t = tenant.tickets.popleft()
        while t._tenant is not tenant:
            tenant.dead -= 1
            t = tenant.tickets.popleft()
        t._tenant = None
        cls.virtual = start
        tenant.finish = start + t.cost / t.weight
        tenant.live -= 1
        cls.live -= 1
        self._len -= 1
        if cls.live == 0:
            self._drop(cls)
            return t
        if tenant.live:
            self._schedule(cls, tenant)
        else:
            tenant.entry = 0
            self._list_idle(cls, tenant)
        self._forget_idle(cls)
        return t

    def _drop(self, cls: _Class) -> None:
        """Forget a class that has emptied. Its tenants and heap entries point back at it:
        cleared, so that reference counting frees them at once, not the cycle collector."""
        del self._classes[cls.priority]
        cls.tenants.clear()
        cls.heap.clear()
        cls.idle.clear()

    def _top_class(self) -> _Class | None:
        while self._priorities:
            priority = -self._priorities[0]
            cls = self._classes.get(priority)
            if cls is not None:
                return cls
            heapq.heappop(self._priorities)
            self._listed.discard(priority)
        return None

    def _schedule(self, cls: _Class, tenant: _Tenant) -> None:
        """Give a backlogged tenant's head its start tag (its heap entry)."""
        head = tenant.tickets[0]
        while head._tenant is not tenant:
            tenant.tickets.popleft()
            tenant.dead -= 1
            head = tenant.tickets[0]
        tenant.entry = next(self._entries)
        start = cls.virtual if cls.virtual > tenant.finish else tenant.finish
        heapq.heappush(cls.heap, (start, head.seq, tenant.entry, tenant))

    @staticmethod
    def _list_idle(cls: _Class, tenant: _Tenant) -> None:
        if not tenant.idle_listed:
            tenant.idle_listed = True
            heapq.heappush(cls.idle, (tenant.finish, tenant.name))

    @staticmethod
    def _forget_idle(cls: _Class) -> None:
        """Drop idle tenants whose finish tag ``V`` has passed: they would start at ``V``
        anyway, so their state is only memory."""
        while cls.idle and cls.idle[0][0] <= cls.virtual:
            _, name = heapq.heappop(cls.idle)
            tenant = cls.tenants.get(name)
            if tenant is None or not tenant.idle_listed:
                continue
            if tenant.live:
                tenant.idle_listed = False
            elif tenant.finish <= cls.virtual:
                del cls.tenants[name]
            else:  # served again since it was listed: list it at its new finish tag
                heapq.heappush(cls.idle, (tenant.finish, name))


class QueueTimeout(Exception):
    """A request waited its whole ``wait_s`` for a slot and was not admitted (it has left
    the queue). ``waited_s``: seconds it waited; ``depth``: tickets still waiting then;
    ``retry_after_s``: whole seconds after which a retry may get in
    (:func:`retry_after_estimate`)."""

    def __init__(self, waited_s: float, depth: int, retry_after_s: int) -> None:
        super().__init__(f"not admitted after {waited_s:.1f} s in the queue ({depth} still waiting); "
                         f"retry after {retry_after_s} s")
        self.waited_s = waited_s
        self.depth = depth
        self.retry_after_s = retry_after_s

    def response(self, model_name: str) -> HttpResponse:
        """The client's answer: 429 ``model_at_capacity`` with ``Retry-After``."""
        return openai_error(
            429, f"The model '{model_name}' is at capacity: not admitted after waiting {self.waited_s:.0f} s "
                 f"({self.depth} request(s) still waiting); retry after {self.retry_after_s} s.",
            code="model_at_capacity", headers={"Retry-After": str(self.retry_after_s),
                                               "retry-after-ms": str(self.retry_after_s * 1000),
                                               "x-should-retry": "true"})


class _Waiter:
    __slots__ = ("future", "timer", "since")

    def __init__(self, future: asyncio.Future, since: float) -> None:
        self.future = future
        self.timer: asyncio.TimerHandle | None = None
        self.since = since


class Gate:
    """Admission of one model's requests in this process: at most ``capacity`` at once,
    the rest waiting in a :class:`FairQueue`.

    Bound to the event loop of its first :meth:`admit` (futures and timers are); not
    thread-safe: :meth:`resize` too is called from that loop (the watcher's view changes
    arrive there). ``on_depth`` is called with the queue's depth (tickets) after every
    change of it; an exception it raises is logged, never lets a slot leak."""

    def __init__(self, on_depth: Callable[[int], None] | None = None, headroom_fraction: float = 0.0) -> None:
        #: The headroom lent to tenants under their share, as a fraction of the capacity (0:
        #: none, a strict capacity; :func:`gate_for` makes gates with :data:`HEADROOM_FRACTION`).
        self.headroom_fraction = headroom_fraction
        self._queue = FairQueue()
        self._waiters: dict[Ticket, _Waiter] = {}
        self._capacity: int | None = None
        self._running = 0
        self._on_depth = on_depth
        self._reported = 0
        self._service_s: deque[float] = deque(maxlen=SERVICE_SAMPLES)
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None  # weak: see _gates
        #: Per tenant: requests running, requests waiting, and its weight (while it has either).
        self._running_of: dict[str, int] = {}
        self._waiting_of: dict[str, int] = {}
        self._weight_of: dict[str, float] = {}

    @property
    def running(self) -> int:
        """Requests admitted and not yet released."""
        return self._running

    @property
    def capacity(self) -> int | None:
        """Requests at once (None: unlimited), as last given to :meth:`admit`/:meth:`resize`."""
        return self._capacity

    def depth(self) -> int:
        """Requests waiting."""
        return len(self._queue)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the gate is bound to (None: not used yet, or that loop is gone)."""
        return self._loop() if self._loop is not None else None

    def resize(self, capacity: int | None) -> None:
        """Set the capacity (requests at once, None: unlimited; ValueError below 0). Raised,
        it admits waiters at once; lowered, running requests finish and nothing new is
        admitted until the running ones are under it."""
        if capacity is not None and capacity < 0:
            raise ValueError(f"capacity must be ≥ 0 or None, got {capacity!r}")
        self._capacity = capacity
        self._grant()
        self._report()

    @contextlib.asynccontextmanager
    async def admit(self, t: Ticket, capacity: int | None, wait_s: float) -> AsyncIterator[float]:
        """Hold a slot for the body of ``async with``; yields the seconds waited for it.

        ``capacity``: the model's requests at once in this process now (None: unlimited;
        it resizes the gate, :meth:`resize`). Admitted at once when the gate is under
        capacity and nobody waits; else ``t`` waits in the queue for up to ``wait_s``
        seconds and raises :class:`QueueTimeout` after leaving it. Cancelled while waiting:
        ``t`` leaves the queue, and a slot granted in that same moment goes to the next.
        The slot is released when the body ends, normally or by an exception. ValueError
        for a ticket that :func:`check` refuses, RuntimeError on another event loop."""
        release, waited_s = await self.acquire(t, capacity, wait_s)
        try:
            yield waited_s
        finally:
            release()

    async def acquire(self, t: Ticket, capacity: int | None, wait_s: float) -> tuple[Callable[[], None], float]:
        """:meth:`admit` for a slot that outlives the calling coroutine (a streamed answer
        ends after the view returned): returns the slot's release (call it once; later calls
        do nothing) and the seconds waited. Raises as :meth:`admit`."""
        check(t)
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = weakref.ref(loop)
        elif self._loop() is not loop:
            raise RuntimeError("this Gate belongs to another event loop (use gate_for())")
        self.resize(capacity)
        started = loop.time()
        if (not self._queue and self._has_room()) or self._may_borrow(t):
            self._running += 1
            self._count_running(t, +1)
            admitted = started
        else:
            self._waiting_of[t.tenant] = self._waiting_of.get(t.tenant, 0) + 1
            self._weight_of[t.tenant] = t.weight
            try:
                await self._wait(t, wait_s, loop, started)
            finally:
                self._uncount_waiting(t)
            self._count_running(t, +1)
            admitted = loop.time()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._count_running(t, -1)
                self._release(loop.time() - admitted)

        return release, admitted - started

    def headroom(self) -> int:
        """Slots above capacity lent to tenants under their share (module docstring)."""
        if not self._capacity or self.headroom_fraction <= 0:
            return 0
        return max(1, math.ceil(self._capacity * self.headroom_fraction))

    def _may_borrow(self, t: Ticket) -> bool:
        """Whether ``t`` is admitted at once into the headroom: its tenant runs under its
        weight share of the capacity and has nothing waiting, nothing of a higher class
        waits, and the headroom has a slot."""
        room = self.headroom()
        if not room or self._running >= self._capacity + room:
            return False
        if self._waiting_of.get(t.tenant) or self._queue.depth_at_or_above(t.priority + 1):
            return False
        weights = dict(self._weight_of)
        weights[t.tenant] = t.weight
        share = self._capacity * t.weight / sum(weights.values())
        return self._running_of.get(t.tenant, 0) + 1 <= max(1.0, share)  # every tenant's due one

    def _count_running(self, t: Ticket, step: int) -> None:
        n = self._running_of.get(t.tenant, 0) + step
        if n > 0:
            self._running_of[t.tenant] = n
            self._weight_of[t.tenant] = t.weight
        else:
            self._running_of.pop(t.tenant, None)
            if not self._waiting_of.get(t.tenant):
                self._weight_of.pop(t.tenant, None)

    def _uncount_waiting(self, t: Ticket) -> None:
        n = self._waiting_of.get(t.tenant, 0) - 1
        if n > 0:
            self._waiting_of[t.tenant] = n
        else:
            self._waiting_of.pop(t.tenant, None)
            if not self._running_of.get(t.tenant):
                self._weight_of.pop(t.tenant, None)

    async def _wait(self, t: Ticket, wait_s: float, loop: asyncio.AbstractEventLoop, started: float) -> None:
        if wait_s <= 0:
            ahead = self._queue.depth_at_or_above(t.priority)
            raise QueueTimeout(0.0, len(self._queue), self.retry_after_s(ahead + 1, wait_s))
        waiter = _Waiter(loop.create_future(), started)
        self._queue.push(t)
        self._waiters[t] = waiter
        waiter.timer = loop.call_later(wait_s, self._expire, t, wait_s)
        self._grant()  # a slot may be free behind waiters whose task was just cancelled
        self._report()
        future = waiter.future
        try:
            await future
        except asyncio.CancelledError:
            waiter.timer.cancel()
            if future.done() and not future.cancelled():
                if future.exception() is None:  # granted as it was cancelled: hand the slot on
                    self._release(None)
            elif self._queue.remove(t):
                self._waiters.pop(t, None)
                self._report()
            raise

    def _has_room(self) -> bool:
        return self._capacity is None or self._running < self._capacity

    def _grant(self) -> None:
        """Admit waiters, in the queue's order, while there is room."""
        while self._queue and self._has_room():
            t = self._queue.pop()
            waiter = self._waiters.pop(t, None)
            if waiter is None or waiter.future.done():
                continue  # its task was cancelled and has not run its handler yet
            waiter.timer.cancel()
            self._running += 1
            waiter.future.set_result(None)

    def _expire(self, t: Ticket, wait_s: float) -> None:
        waiter = self._waiters.pop(t, None)
        if waiter is None or waiter.future.done() or not self._queue.remove(t):
            return
        ahead = self._queue.depth_at_or_above(t.priority)
        waited_s = waiter.future.get_loop().time() - waiter.since
        waiter.future.set_exception(QueueTimeout(waited_s, len(self._queue), self.retry_after_s(ahead + 1, wait_s)))
        self._report()

    def _release(self, service_s: float | None) -> None:
        self._running -= 1
        if service_s is not None:
            self._service_s.append(service_s)
        self._grant()
        self._report()

    def retry_after_s(self, position: int, wait_s: float) -> int:
        """:func:`retry_after_estimate` from this gate's recent service times and capacity."""
        return retry_after_estimate(tuple(self._service_s), position, self._capacity, wait_s)

    def _report(self) -> None:
        depth = len(self._queue)
        if depth == self._reported or self._on_depth is None:
            self._reported = depth
            return
        self._reported = depth
        try:
            self._on_depth(depth)
        except Exception:
            log.exception("admission queue depth listener failed")


def retry_after_estimate(service_s: tuple[float, ...], position: int, capacity: int | None, wait_s: float) -> int:
    """Whole seconds until a request at ``position`` in the queue (1: next) would likely be
    admitted: the mean of recent service times (seconds from admission to release) ×
    position / capacity, rounded up, at least 1 and at most ``wait_s`` rounded up. With no
    service time seen yet or a capacity of 0, the estimate is ``wait_s``: the wait just
    spent in vain is all that is known."""
    most = max(1, math.ceil(wait_s))
    if not service_s or not capacity:
        return most
    mean_s = sum(service_s) / len(service_s)
    return max(1, min(most, math.ceil(mean_s * position / capacity)))


#: Event loop → model id → its Gate. Weak on the loop (and gates hold their loop weakly, or
#: the entry would keep its own key alive): a closed test loop's gates go with it, and a new
#: loop never gets a gate whose futures belong to an old one.
_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, Gate]] = weakref.WeakKeyDictionary()
_depth_listener: Callable[[int, int], None] | None = None


def set_depth_listener(listener: Callable[[int, int], None] | None) -> None:
    """Who is told ``(model_id, depth)`` when a model's queue depth changes (the scaler's
    demand); for gates made from now on. Register it in an ``AppConfig.ready()``."""
    global _depth_listener
    _depth_listener = listener


def gates() -> dict[int, Gate]:
    """The running event loop's gates by model id (RuntimeError outside a coroutine)."""
    return _gates.get(asyncio.get_running_loop(), {})


def gate_for(model_id: int) -> Gate:
    """The running event loop's :class:`Gate` of ``model_id`` (made on first use). Call it
    from a coroutine (RuntimeError otherwise)."""
    loop = asyncio.get_running_loop()
    gates = _gates.get(loop)
    if gates is None:
        gates = _gates[loop] = {}
    gate = gates.get(model_id)
    if gate is None:
        listener = _depth_listener
        on_depth = None if listener is None else (lambda depth: listener(model_id, depth))
        gate = gates[model_id] = Gate(on_depth, HEADROOM_FRACTION)
    return gate
