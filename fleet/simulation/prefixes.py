"""Prefix caches in the simulator (issue 17): what a replica keeps, and how a request with a
prefix is routed to one.

A trace's request may carry a prefix (``prefix_id``, ``prefix_tokens``; see
:mod:`fleet.simulation.traces`). Its model routes it by the model's ``routing_policy`` with
``fleet.planning.routing.choose``, as the gateway does: one ``RecentRoutes`` per model, the
prefix as the only block (``RouteKeys(blocks=(prefix_hash(id),))``), loads the ready
replicas' in-flight counts, and ``turn`` a per-model counter advanced by every request
routed with a prefix, so ties between equally loaded replicas rotate as the gateway's do
(``fleet.live.route`` keeps an ``itertools.count`` per model). That matters for
``least-loaded``: two tenants taking turns on two idle replicas each keep to one replica
and find their prefix cached, as they would behind the real gateway; ties to the first
would put both on one replica and understate least-loaded's hits (and overstate what
prefix-affinity gains). Requests without a prefix keep the engine's fast path — the
fewest in flight, ties to the first — and do not advance the counter, so a trace without
prefixes simulates exactly as before.

Each replica keeps the last ``prefix_cache_slots`` prefixes routed to it
(:class:`PrefixCache`, least recently used out first; a new replica starts empty). A request
whose prefix its replica holds when it is routed is a *hit*: its TTFT and duration shrink by
``prefix_tokens × prefill_ms_per_token`` (``catalog.LatencyModel``). Hit or not, its prefix is
then that replica's most recent: the engine keeps what it prefills, and a request routed
while an earlier one with the same prefix still runs shares it, as an engine's prefix cache
shares computed blocks. Pure standard library.
"""

from __future__ import annotations

from hashlib import blake2b


def prefix_hash(prefix_id: str) -> int:
    """A trace's prefix id as the 64-bit routing key (BLAKE2b-64 of its UTF-8, big-endian),
    stable across runs and processes as ``fleet.planning.routing`` requires."""
    return int.from_bytes(blake2b(prefix_id.encode("utf-8"), digest_size=8).digest(), "big")


class PrefixCache:
    """One replica's prefix cache: at most ``slots`` prefix hashes (0: it keeps none), the
    least recently used evicted first."""

    __slots__ = ("slots", "_keys")

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._keys: dict[int, None] = {}  # least recently used first

    def __contains__(self, key: int) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def keys(self) -> list[int]:
        """The cached prefix hashes, least recently used first."""
        return list(self._keys)

    def use(self, key: int) -> bool:
        """A request with prefix ``key`` runs here: True when it was cached (a hit). Either
        way it becomes the most recent, and the least recent goes when over ``slots``."""
        keys = self._keys
        hit = key in keys
        if hit:
            del keys[key]
        if self.slots:
            keys[key] = None
            if len(keys) > self.slots:
                del keys[next(iter(keys))]
        return hit
