"""Which ready replica takes a request: the routing policies, as pure rules
(docs/architecture.md, "Gateway rules": routing).

A model's ``routing_policy`` (``catalog.models.RoutingPolicy``; the same three names here)
is one of:

* ``least-loaded`` — the replica with the fewest requests in flight from this process (ties
  rotate). Spreads evenly; every replica recomputes every tenant's prompt.
* ``prefix-affinity`` — the replica most likely to hold the request's prompt prefix in its
  KV (or prompt) cache. The caller cuts the rendered prompt into fixed-size blocks and
  hashes them chained (block *i*'s hash names the whole prompt up to the end of block *i*,
  as an engine's KV blocks do). This process remembers where it sent recent blocks
  (:class:`RecentRoutes`, up to :data:`HOLDERS` replicas per block); a remembered match at
  least :data:`ANCHOR_BLOCKS` deep (or the whole prompt, when it is shorter) wins: its most
  recent holder while that one is within the load bound, else the other (a prefix stays where
  it is until load moves it; choosing the less loaded holder each time made it bounce between
  two caches and thrash both). Otherwise rendezvous hashing of the *anchor* — the
  hash of the first :data:`ANCHOR_BLOCKS` blocks — over the replica ids ranks the replicas
  the same way in every web process, with no shared state, and moves only the anchors of a
  replica that goes away. A prompt shorter than one block has no prefix worth keeping: its
  session (below) routes it if it has one, else least-loaded.
* ``session`` — the same, keyed by the session (an ``X-Session-Id`` header, else OpenAI's
  ``user`` field); a request without one is routed by its prefix.

**Bounded load** (consistent hashing with bounded loads, Mirrokni et al. 2018, against the
least-loaded replica rather than the mean): the preferred replica takes the request only
while its in-flight count is below the least-loaded replica's plus :func:`load_slack`;
otherwise the request *spills* to the next replica in the anchor's rendezvous order that is
within the bound (the same order in every process), and this process remembers the prefix
there too, so a hot prefix spreads over two replicas, each then holding it in its cache,
instead of piling onto one. No choice ever leaves a
replica more than the slack above the least-loaded one.

Everything here is a function of its arguments: loads are this process's in-flight counts
(``fleet.live``), ``turn`` is the caller's rotation counter. Hashes are 64-bit integers made
by the caller with a stable hash (never Python's ``hash``, which differs per process).
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass

LEAST_LOADED = "least-loaded"
PREFIX_AFFINITY = "prefix-affinity"
SESSION = "session"
#: Every policy's name, as ``catalog.models.RoutingPolicy`` spells them.
POLICIES = (LEAST_LOADED, PREFIX_AFFINITY, SESSION)

#: How a choice was made, as ``/metrics`` counts it: ``hit`` — the replica the key prefers
#: (remembered or ranked first); ``spill`` — that one was over the load bound, the next
#: within it took the request; ``unkeyed`` — a keyed policy, but the request had no prefix
#: block and no session (least-loaded); ``least-loaded`` — the policy itself.
OUTCOMES = ("hit", "spill", "unkeyed", LEAST_LOADED)

#: Replicas remembered per key: a prefix that spilled is held by two replicas, and goes to
#: the other one (no second prefill) whenever the one it is on is over the bound.
HOLDERS = 2

#: New keys per replica: a key this process has not routed yet goes to the first replica
#: in its rendezvous order that is home to fewer than :func:`key_cap` of the keys it
#: remembers — an even share, plus this fraction of it rounded down (consistent hashing
#: with bounded loads on keys, as Mirrokni et al. bound them; exact for a handful of keys,
#: where a few tenants' prompts would otherwise land on one replica's cache by the luck of
#: the hash, and 25% loose for many, so that the hash decides most).
KEY_BOUND_SLACK = 0.25

#: Blocks in a request's anchor (the rendezvous key): with the gateway's 256-byte blocks,
#: the first KiB of the rendered prompt (about 250 tokens).
ANCHOR_BLOCKS = 4

#: The load bound's slack: a preferred replica may run this many requests more than the
#: least-loaded one before a request spills, or :data:`BOUND_FACTOR` of the least-loaded
#: one's count where that is more.
BOUND_SLACK = 2
BOUND_FACTOR = 0.25

_MASK = (1 << 64) - 1


def load_slack(least: int) -> int:
    """How many more requests in flight than the least-loaded replica's ``least`` a
    replica may have and still take a keyed request: ``max(BOUND_SLACK, ⌈BOUND_FACTOR ·
    least⌉)``."""
    return max(BOUND_SLACK, math.ceil(BOUND_FACTOR * least))


def within_bound(load: int, least: int) -> bool:
    """Whether a replica with ``load`` requests in flight may take one more keyed request
    while the least-loaded has ``least`` (:func:`load_slack`)."""
    return load - least < load_slack(least)


def _mix(x: int) -> int:
    """SplitMix64's finaliser: a 64-bit integer to a well-spread one (stable everywhere)."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
    return x ^ (x >> 31)


def _score(key: int, rid: int) -> int:
    return _mix(key ^ _mix(rid + 1))


def rendezvous_order(key: int, replica_ids: Iterable[int]) -> list[int]:
    """``replica_ids`` ranked for ``key`` by rendezvous (highest-random-weight) hashing:
    best first. The same for the same key and ids in every process; removing an id leaves
    the others' order as it was."""
    return sorted(replica_ids, key=lambda rid: (_score(key, rid), rid), reverse=True)


@dataclass(frozen=True, slots=True)
class RouteKeys:
    """What a request can be routed by: ``blocks``, its prompt's chained block hashes
    (first block first; empty when the prompt is shorter than one block), and
    ``session``, the hash of its session id (None without one)."""

    blocks: tuple[int, ...] = ()
    session: int | None = None


NO_KEYS = RouteKeys()


@dataclass(frozen=True, slots=True)
class Decision:
    """The replica chosen, ``outcome`` (one of :data:`OUTCOMES`) and the replica the key
    preferred (None when unkeyed or least-loaded)."""

    replica_id: int
    outcome: str
    preferred: int | None = None


class RecentRoutes:
    """Where this process sent keys lately: block or session hash → the replicas it went
    to, most recent first, at most :data:`HOLDERS` of them; the ``capacity`` most recently
    used keys kept (a dict in use order). One per model; a replica that is gone is ignored
    and dropped when the key is next remembered."""

    def __init__(self, capacity: int = 20_000) -> None:
        self.capacity = capacity
        self._where: dict[int, tuple[int, ...]] = {}
        #: Anchor (a prompt's rendezvous key, or a session) → its home replica (the last
        #: one chosen for it), in use order; at most ``capacity`` // 8.
        self._homes: dict[int, int] = {}
        #: Replica → how many anchors are at home there.
        self._home_counts: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._where)

    def holders(self, keys: Sequence[int], alive: Container[int], at_least: int) -> tuple[int, ...]:
        """The replicas in ``alive`` remembered for the deepest of ``keys`` (chained hashes,
        shallowest first) that has any, most recent first, looking no shallower than index
        ``at_least - 1`` (``at_least`` below 1 counts as 1: every key); () if none."""
        where = self._where
        for i in range(len(keys) - 1, max(at_least, 1) - 2, -1):
            held = where.get(keys[i])
            if held:
                live = tuple(rid for rid in held if rid in alive)
                if live:
                    return live
        return ()

    def deepest(self, keys: Sequence[int], alive: Container[int], at_least: int) -> int | None:
        """The most recent of :meth:`holders`, or None."""
        held = self.holders(keys, alive, at_least)
        return held[0] if held else None

    def home_counts(self) -> dict[int, int]:
        """Replica id → the anchors whose home it is (replicas gone included: callers count
        only those alive). Read-only."""
        return self._home_counts

    def remember(self, keys: Iterable[int], replica_id: int, anchor: int | None = None) -> None:
        """``keys`` were sent to ``replica_id`` now: it becomes each key's most recent
        holder (the oldest beyond :data:`HOLDERS` is forgotten) and each key the most
        recently used; with ``anchor``, the anchor's home."""
        if anchor is not None:
            homes, counts = self._homes, self._home_counts
            old = homes.pop(anchor, None)
            homes[anchor] = replica_id
            if old != replica_id:
                counts[replica_id] = counts.get(replica_id, 0) + 1
                if old is not None:
                    counts[old] -= 1
                    if not counts[old]:
                        del counts[old]
            if len(homes) > self.capacity // 8:
                gone = next(iter(homes))
                rid = homes.pop(gone)
                counts[rid] -= 1
                if not counts[rid]:
                    del counts[rid]
        where = self._where
        for key in keys:
            held = where.pop(key, ())
            if held and held[0] == replica_id:
                where[key] = held
            elif held:
                where[key] = (replica_id, *(rid for rid in held if rid != replica_id))[:HOLDERS]
            else:
                where[key] = (replica_id,)
        excess = len(where) - self.capacity
        if excess > 0:
            for key in list(_take(where, excess)):
                del where[key]


def _take(where: dict, n: int) -> Iterable[int]:
    it = iter(where)
    for _ in range(n):
        yield next(it)


def _least_loaded(loads: Sequence[tuple[int, int]], turn: int) -> int:
    least = min(load for _, load in loads)
    tied = [rid for rid, load in loads if load == least]
    return tied[turn % len(tied)]


def choose(policy: str, loads: Sequence[tuple[int, int]], keys: RouteKeys = NO_KEYS,
           recent: RecentRoutes | None = None, turn: int = 0) -> Decision:
    """Choose among ``loads`` — ``(replica_id, requests in flight)`` pairs, at least one —
    by ``policy`` (one of :data:`POLICIES`; anything else is least-loaded), and remember a
    keyed choice in ``recent``. The rules are the module's."""
    if policy not in (PREFIX_AFFINITY, SESSION):
        return Decision(_least_loaded(loads, turn), LEAST_LOADED)
    chain: Sequence[int]
    if policy == SESSION and keys.session is not None:
        chain, depth = (keys.session,), 1
    elif keys.blocks:
        chain, depth = keys.blocks, min(len(keys.blocks), ANCHOR_BLOCKS)
    elif keys.session is not None:
        chain, depth = (keys.session,), 1
    else:
        return Decision(_least_loaded(loads, turn), "unkeyed")
    load_of = dict(loads)
    least = min(load_of.values())
    held = recent.holders(chain, load_of, depth) if recent is not None else ()
    order: list[int] | None = None
    if held:  # the most recent holder while it is within the bound, else the next that is
        preferred = next((rid for rid in held if within_bound(load_of[rid], least)), held[0])
    else:
        order = rendezvous_order(chain[depth - 1], load_of)
        preferred = order[0] if recent is None else _with_room(order, recent.home_counts())
    if within_bound(load_of[preferred], least):
        chosen, outcome = preferred, "hit"
    else:
        if order is None:
            order = rendezvous_order(chain[depth - 1], load_of)
        chosen = next(rid for rid in order if rid != preferred and within_bound(load_of[rid], least))
        outcome = "spill"
    if recent is not None:
        recent.remember(chain, chosen, chain[depth - 1])
    return Decision(chosen, outcome, preferred)


def key_cap(homed: int, replicas: int) -> int:
    """The most anchors a replica may be home to before a new one passes it by, with
    ``homed`` anchors at home on ``replicas`` live replicas: ⌈(homed + 1) / replicas⌉ +
    ⌊KEY_BOUND_SLACK · (homed + 1) / replicas⌋ (:data:`KEY_BOUND_SLACK`)."""
    share = (homed + 1) / replicas
    return math.ceil(share) + math.floor(KEY_BOUND_SLACK * share)


def _with_room(order: list[int], counts: dict[int, int]) -> int:
    """The first of ``order`` (live replicas, rendezvous-ranked) home to fewer anchors than
    :func:`key_cap` allows; one always is (their sum is under ``len(order)`` × the cap)."""
    cap = key_cap(sum(counts.get(rid, 0) for rid in order), len(order))
    return next(rid for rid in order if counts.get(rid, 0) < cap)
