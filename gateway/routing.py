"""Choosing a ready replica for a request: least requests in flight, then round robin."""

from __future__ import annotations

import itertools

from fleet.live import Endpoint, in_flight

_turn = itertools.count()


def choose(endpoints: tuple[Endpoint, ...], exclude: set[int] = frozenset()) -> Endpoint | None:
    """The endpoint with the fewest requests in flight from this process (ties rotate);
    None if every endpoint is excluded."""
    candidates = [e for e in endpoints if e.replica_id not in exclude]
    if not candidates:
        return None
    least = min(in_flight(e.replica_id) for e in candidates)
    tied = [e for e in candidates if in_flight(e.replica_id) == least]
    return tied[next(_turn) % len(tied)]
