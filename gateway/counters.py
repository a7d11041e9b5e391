"""Where the tenants' limit counters live: in this process (embedded mode) or in Redis
(production mode, shared by every web process), each applying ``gateway.quotas.decide``
atomically — check every counter, then count the request in all of them or none
(docs/architecture.md, "Tenants").

Both backends have the same four calls:

* ``admit(checks, member)`` → a :class:`~gateway.quotas.Verdict`, or the indexes of budget
  counters that do not exist yet (:class:`NeedSeed`): the caller seeds them from usage records
  (:meth:`seed`) and asks again;
* ``seed(key, value, ttl_s)`` — make a budget counter, unless one exists;
* ``settle(items, releases)`` — correct counters that still exist at a request's end, each
  item ``(key, delta, used, admitted_at_s)``: a counter made before the request was admitted
  holds its reservation and gets ``delta`` (real − reserved); one made since (a Redis that
  lost its data and was seeded again, mid-request) never held it and gets ``used`` (what the
  request really cost; its usage record is not written yet, so no seed has it). A plain
  ``(key, delta)`` is applied as it is. Then release concurrency slots;
* ``peek(keys)`` — counters' values (None: none), for people.

A concurrency slot is a member in a Redis sorted set, scored with the time its lease ends:
a web process renews its members' leases while their requests run, so a process that dies
leaves slots that free themselves within :data:`LEASE_S`.

A Redis that cannot be reached raises :class:`CountersAway` (at once, without trying again,
for :data:`RETRY_AWAY_S` after a failure: a request never waits on a dead Redis).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.quotas import CONCURRENCY, Check, Verdict, decide

log = logging.getLogger(__name__)

#: How long a concurrency slot in Redis lives without renewal (seconds).
LEASE_S = 60.0
#: After Redis failed, calls answer :class:`CountersAway` for this long before trying again.
RETRY_AWAY_S = 1.0
#: Redis socket timeouts (seconds): an admission never waits longer on Redis.
REDIS_TIMEOUT_S = 0.5
#: Connections to Redis per web process and event loop.
MAX_CONNECTIONS = 32


class CountersAway(Exception):
    """The counters' store (Redis) cannot be reached."""


@dataclass(frozen=True)
class NeedSeed:
    """Budget counters (indexes into the checks) that must be seeded before deciding."""

    missing: tuple[int, ...]


_members = itertools.count(1)


def new_member() -> str:
    """A name for one request's concurrency slots, unique across processes and hosts."""
    return f"{os.getpid()}.{id(_members) & 0xffff:x}.{next(_members)}"


class LocalCounters:
    """This process's counters (embedded mode: one web process). ``clock``: epoch seconds,
    injected in tests."""

    def __init__(self, clock=time.time) -> None:
        self.clock = clock
        self._values: dict[str, list] = {}  # key → [value, expires_at_s, made_at_s]
        self._slots: dict[str, set[str]] = {}  # concurrency key → members
        self._admits = 0

    def _value(self, key: str, now: float) -> int | None:
        entry = self._values.get(key)
        if entry is None:
            return None
        if entry[1] <= now:
            del self._values[key]
            return None
        return entry[0]

    async def admit(self, checks: Sequence[Check], member: str) -> Verdict | NeedSeed:
        return self.admit_now(checks, member)

    def admit_now(self, checks: Sequence[Check], member: str) -> Verdict | NeedSeed:
        """:meth:`admit` without a coroutine (it never waits)."""
        now = self.clock()
        self._admits += 1
        if self._admits % 4096 == 0:
            self._sweep(now)
        values, missing = [], []
        for i, c in enumerate(checks):
            if c.kind == CONCURRENCY:
                values.append(len(self._slots.get(c.key, ())))
                continue
            v = self._value(c.key, now)
            if v is None and c.is_budget:
                missing.append(i)
            values.append(v or 0)
        if missing:
            return NeedSeed(tuple(missing))
        verdict = decide(list(checks), values)
        if verdict.admitted:
            for c in checks:
                if c.kind == CONCURRENCY:
                    self._slots.setdefault(c.key, set()).add(member)
                else:
                    entry = self._values.get(c.key)
                    if entry is None:
                        self._values[c.key] = [c.amount, now + c.ttl_s, now]
                    else:
                        entry[0] += c.amount
        return verdict

    async def seed(self, key: str, value: int, ttl_s: int) -> None:
        now = self.clock()
        if self._value(key, now) is None:
            self._values[key] = [max(0, int(value)), now + ttl_s, now]

    async def settle(self, items: Sequence[tuple], releases: Sequence[tuple[str, str]] = ()) -> None:
        self.settle_now(items, releases)

    def settle_now(self, items: Sequence[tuple], releases: Sequence[tuple[str, str]] = ()) -> None:
        """:meth:`settle` without a coroutine."""
        now = self.clock()
        for item in items:
            key, delta = item[0], item[1]
            if self._value(key, now) is None:
                continue
            entry = self._values[key]
            if len(item) > 2 and len(entry) > 2 and entry[2] > item[3]:
                delta = item[2]  # made since the admission: it never held the reservation
            entry[0] = max(0, entry[0] + delta)
        for key, member in releases:
            slots = self._slots.get(key)
            if slots is not None:
                slots.discard(member)
                if not slots:
                    del self._slots[key]

    async def peek(self, keys: Sequence[str]) -> list[int | None]:
        return self.peek_now(keys)

    def peek_now(self, keys: Sequence[str]) -> list[int | None]:
        """:meth:`peek` without a coroutine: each counter's value (a concurrency counter's
        running requests), None for a counter this process does not have (or has let
        expire). Changes nothing, so another thread (the admin's, under ASGI) may call it
        while the event loop admits."""
        now = self.clock()
        out: list[int | None] = []
        for key in keys:
            if key.startswith("c:"):
                out.append(len(self._slots.get(key, ())))
            else:
                entry = self._values.get(key)
                out.append(None if entry is None or entry[1] <= now else entry[0])
        return out

    def _sweep(self, now: float) -> None:
        for key in [k for k, entry in self._values.items() if entry[1] <= now]:
            del self._values[key]


# Redis: one script per round trip carries every settlement, release and admission this
# process has pending (requests arriving together share a call: the round trip's cost is
# paid once). Each admission checks all its counters and counts in all or none — atomic, as
# a script is: no over-admission between web processes.
#
# ARGV: now (s), lease (s), then the counts: settlements S, releases R, admissions A.
# Settlement: KEYS one counter; ARGV delta, used, admitted-at (s; '' to apply delta as it
# is). Release: KEYS the concurrency set; ARGV the member. Admission: ARGV member, its
# counters' count n; KEYS its n counters; ARGV per counter kind (c: a concurrency set, b: a
# budget, n: a plain counter), limit, amount, ttl (s).
# Returns one reply per admission: {1, values…} admitted, {0, values…, 0, refused
# indexes…} refused, {-1, missing indexes…} (budgets to seed first).
_BATCH = """
local now = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local ns, nr, na = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local a, k = 6, 1
for _ = 1, ns do
  local key = KEYS[k]
  local delta = tonumber(ARGV[a])
  if redis.call('EXISTS', key) == 1 then
    if ARGV[a + 2] ~= '' then
      local made = tonumber(redis.call('HGET', key, 'b') or '0')
      if made > tonumber(ARGV[a + 2]) then delta = tonumber(ARGV[a + 1]) end
    end
    if delta ~= 0 then
      if redis.call('HINCRBY', key, 'v', delta) < 0 then redis.call('HSET', key, 'v', 0) end
    end
  end
  k, a = k + 1, a + 3
end
for _ = 1, nr do
  redis.call('ZREM', KEYS[k], ARGV[a])
  k, a = k + 1, a + 1
end
local replies = {}
for r = 1, na do
  local member, n = ARGV[a], tonumber(ARGV[a + 1])
  a = a + 2
  local values, missing, kinds, limits, amounts, ttls = {}, {}, {}, {}, {}, {}
  for i = 1, n do
    local key = KEYS[k + i - 1]
    local b = a + (i - 1) * 4
    kinds[i], limits[i], amounts[i], ttls[i] = ARGV[b], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
    if kinds[i] == 'c' then
      redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
      values[i] = redis.call('ZCARD', key)
    else
      local raw = redis.call('HGET', key, 'v')
      if raw then
        values[i] = tonumber(raw)
      else
        values[i] = 0
        if kinds[i] == 'b' then missing[#missing + 1] = i - 1 end
      end
    end
  end
  local out
  if #missing > 0 then
    out = {-1}
    for _, i in ipairs(missing) do out[#out + 1] = i end
  else
    local refused = {}
    for i = 1, n do
      if values[i] + amounts[i] > limits[i] then refused[#refused + 1] = i - 1 end
    end
    out = {1}
    if #refused > 0 then out[1] = 0 end
    for i = 1, n do out[#out + 1] = values[i] end
    if #refused > 0 then
      out[#out + 1] = 0
      for _, i in ipairs(refused) do out[#out + 1] = i end
    else
      for i = 1, n do
        local key = KEYS[k + i - 1]
        if kinds[i] == 'c' then
          redis.call('ZADD', key, now + lease, member)
          redis.call('EXPIRE', key, math.ceil(lease * 2))
        else
          redis.call('HINCRBY', key, 'v', amounts[i])
          if redis.call('HSETNX', key, 'b', ARGV[1]) == 1 then redis.call('EXPIRE', key, ttls[i]) end
        end
      end
    end
  end
  replies[r] = out
  k, a = k + n, a + 4 * n
end
return replies
"""

# KEYS: one counter. ARGV: value, ttl (s), now (s). Makes it unless it exists.
_SEED = """
if redis.call('HSETNX', KEYS[1], 'v', ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], 'b', ARGV[3])
  redis.call('EXPIRE', KEYS[1], ARGV[2])
end
return 1
"""

_KIND = {CONCURRENCY: "c"}


class RedisCounters:
    """The counters in Redis at ``url``, names under ``prefix``. One client per event loop
    (clients are bound to their loop). Calls made while a round trip is under way (or in
    the same turn of the loop) go together in the next one (:data:`_BATCH`)."""

    def __init__(self, url: str, prefix: str, clock=time.time) -> None:
        self.url = url
        self.prefix = f"{prefix}:rl:"
        self.clock = clock
        self._clients: dict[int, tuple] = {}
        self._away_until = 0.0
        #: member → concurrency set names, for lease renewal while requests run.
        self._held: dict[str, list[str]] = {}
        self._renewer: asyncio.Task | None = None
        #: What the next round trip carries: settlements, releases, admissions (with futures).
        self._settles: list[tuple] = []
        self._releases: list[tuple[str, str]] = []
        self._admits: list[tuple[list[Check], str, asyncio.Future]] = []
        self._sender: asyncio.Task | None = None
        #: Done when the round trip that carries what is pending now has been made.
        self._sent: asyncio.Future | None = None

    def _client(self):
        import redis.asyncio as redis_async  # lazy: embedded mode never loads redis-py

        loop = asyncio.get_running_loop()
        entry = self._clients.get(id(loop))
        if entry is None or entry[0] is not loop:
            # A bounded pool that waits for a free connection: a burst of admissions queues for
            # one of MAX_CONNECTIONS, rather than failing (redis-py's default pool raises).
            pool = redis_async.BlockingConnectionPool.from_url(
                self.url, max_connections=MAX_CONNECTIONS, timeout=REDIS_TIMEOUT_S * 4,
                socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S)
            client = redis_async.Redis(connection_pool=pool)
            entry = (loop, client, client.register_script(_BATCH), client.register_script(_SEED))
            self._clients = {k: v for k, v in self._clients.items() if not v[0].is_closed()}
            self._clients[id(loop)] = entry
        return entry

    def _away(self, exc: BaseException) -> CountersAway:
        self._away_until = time.monotonic() + RETRY_AWAY_S
        return CountersAway(str(exc) or type(exc).__name__)

    async def _script(self, which: int, keys: list[str], args: list):
        if time.monotonic() < self._away_until:
            raise CountersAway("Redis was unreachable a moment ago")
        import redis.exceptions  # lazy: embedded mode never loads redis-py

        script = self._client()[which]
        try:
            return await script(keys=keys, args=args)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError,
                asyncio.TimeoutError) as exc:
            raise self._away(exc) from exc

    def _wake_sender(self) -> asyncio.Future:
        """Make sure a round trip will carry what is pending; returns the future of that one."""
        loop = asyncio.get_running_loop()
        if self._sent is None or self._sent.done() or self._sent.get_loop() is not loop:
            self._sent = loop.create_future()
        if self._sender is None or self._sender.done() or self._sender.get_loop() is not loop:
            self._sender = loop.create_task(self._send())
        return self._sent

    async def _send(self) -> None:
        """Send what is pending, one round trip at a time, until nothing is."""
        await asyncio.sleep(0)  # let the requests of this turn of the loop join
        while self._settles or self._releases or self._admits:
            settles, self._settles = self._settles, []
            releases, self._releases = self._releases, []
            admits, self._admits = self._admits, []
            sent, self._sent = self._sent, None
            try:
                await self._round_trip(settles, releases, admits)
            finally:
                if sent is not None and not sent.done():
                    sent.set_result(None)

    async def _round_trip(self, settles: list[tuple], releases: list[tuple[str, str]],
                          admits: list[tuple[list[Check], str, asyncio.Future]]) -> None:
        """One call of :data:`_BATCH`; each admission's future gets its verdict (or
        CountersAway)."""
        keys: list[str] = []
        args: list = [repr(self.clock()), repr(LEASE_S), len(settles), len(releases), len(admits)]
        for item in settles:
            keys.append(self.prefix + item[0])
            args += [item[1], item[2], repr(item[3])] if len(item) > 2 else [item[1], 0, ""]
        for key, member in releases:
            keys.append(self.prefix + key)
            args.append(member)
        for checks, member, _ in admits:
            args += [member, len(checks)]
            for c in checks:
                keys.append(self.prefix + c.key)
                args += [_KIND.get(c.kind, "b" if c.is_budget else "n"), c.limit, c.amount, c.ttl_s]
        try:
            replies = await self._script(2, keys, args)
        except CountersAway as exc:
            for _, _, future in admits:
                if not future.done():
                    future.set_exception(CountersAway(str(exc)))
            if settles or releases:
                log.debug("%d settlement(s) lost: Redis away", len(settles) + len(releases))
            return
        except Exception as exc:  # noqa: BLE001 (a bug here must not hang the requests)
            for _, _, future in admits:
                if not future.done():
                    future.set_exception(exc)
            return
        for (checks, member, future), reply in zip(admits, replies):
            self._resolve(checks, member, future, [int(x) for x in reply])

    def _resolve(self, checks: list[Check], member: str, future: asyncio.Future, out: list[int]) -> None:
        if out[0] == -1:
            verdict: Verdict | NeedSeed = NeedSeed(tuple(out[1:]))
        else:
            n = len(checks)
            values = tuple(out[1:1 + n])
            verdict = Verdict(True, values) if out[0] == 1 else Verdict(False, values, tuple(out[2 + n:]))
        if future.done():  # the caller left while the call was under way: undo what it counted
            if isinstance(verdict, Verdict) and verdict.admitted:
                self._settles += [(c.key, -c.amount) for c in checks if c.kind != CONCURRENCY]
                self._releases += [(c.key, member) for c in checks if c.kind == CONCURRENCY]
                self._wake_sender()
            return
        if isinstance(verdict, Verdict) and verdict.admitted:
            concurrency = [self.prefix + c.key for c in checks if c.kind == CONCURRENCY]
            if concurrency:
                self._held[member] = concurrency
                self._ensure_renewer()
        future.set_result(verdict)

    async def admit(self, checks: Sequence[Check], member: str) -> Verdict | NeedSeed:
        if time.monotonic() < self._away_until:
            raise CountersAway("Redis was unreachable a moment ago")
        future = asyncio.get_running_loop().create_future()
        self._admits.append((list(checks), member, future))
        self._wake_sender()
        return await future

    async def seed(self, key: str, value: int, ttl_s: int) -> None:
        await self._script(3, [self.prefix + key], [max(0, int(value)), int(ttl_s), repr(self.clock())])

    async def settle(self, items: Sequence[tuple], releases: Sequence[tuple[str, str]] = ()) -> None:
        """Send the corrections with the next round trip and wait until it is made (a Redis
        away loses them, and the slots free themselves when their leases end)."""
        for _, member in releases:
            self._held.pop(member, None)
        if not items and not releases:
            return
        self._settles += list(items)
        self._releases += list(releases)
        await asyncio.shield(self._wake_sender())

    async def flush(self) -> None:
        """Wait until what is pending has been sent (tests)."""
        while self._sender is not None and not self._sender.done():
            await asyncio.wait({self._sender})

    async def peek(self, keys: Sequence[str]) -> list[int | None]:
        await self.flush()
        client = self._client()[1]
        out: list[int | None] = []
        now = self.clock()
        async with client.pipeline(transaction=False) as pipe:
            for key in keys:
                if key.startswith("c:"):
                    pipe.zcount(self.prefix + key, now, "+inf")
                else:
                    pipe.hget(self.prefix + key, "v")
            for raw in await pipe.execute():
                out.append(None if raw is None else int(raw))
        return out

    def _ensure_renewer(self) -> None:
        loop = asyncio.get_running_loop()
        if self._renewer is None or self._renewer.done() or self._renewer.get_loop() is not loop:
            self._renewer = loop.create_task(self._renew())

    async def _renew(self) -> None:
        """Renew the leases of this process's running requests every third of a lease."""
        while self._held:
            await asyncio.sleep(LEASE_S / 3)
            held = dict(self._held)
            if not held:
                break
            try:
                client = self._client()[1]
                until = self.clock() + LEASE_S
                async with client.pipeline(transaction=False) as pipe:
                    for member, sets in held.items():
                        for name in sets:
                            pipe.zadd(name, {member: until}, xx=True)
                    await pipe.execute()
            except Exception:  # noqa: BLE001 (Redis away: the next round tries again)
                log.debug("could not renew concurrency leases", exc_info=True)
