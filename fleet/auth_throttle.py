"""Failed REST API logins, counted per username and per client address (the token endpoint
``POST /api/auth/token/`` and HTTP basic auth share the counters).

Counters live in Django's cache (``settings.CACHES``: in memory in the embedded default,
Redis in production so every web process sees the same counts), in fixed windows of
``LLMGW_AUTH_FAILURE_WINDOW`` (60 s). Once a username or an address has
``LLMGW_AUTH_FAILURE_LIMIT`` (5) failures in the current window, every further attempt of
it is refused with 429 and ``Retry-After`` until the window ends — a correct password
too: otherwise the limit would not stop guessing, only slow the reporting of a hit. Only
failures count; a success neither counts nor resets. The price is that someone who knows
a username can keep it locked out of password logins for as long as they keep failing
(tokens already issued and session logins keep working).
"""

from __future__ import annotations

import hashlib
import math
import time

from django.conf import settings
from django.core.cache import cache
from rest_framework.exceptions import Throttled
from rest_framework.throttling import BaseThrottle

#: Cache key prefix of the counters.
KEY = "llmgw:auth-failures"


def _now() -> float:
    """The clock (seconds); tests move it to end a window."""
    return time.time()


def _window_s() -> float:
    return max(1.0, float(getattr(settings, "LLMGW_AUTH_FAILURE_WINDOW_S", 60.0)))


def _limit() -> int:
    return max(1, int(getattr(settings, "LLMGW_AUTH_FAILURE_LIMIT", 5)))


def client_address(request) -> str:
    """The client's address as DRF's throttles see it (``REST_FRAMEWORK["NUM_PROXIES"]``:
    by default the socket's peer, never a client-written ``X-Forwarded-For``)."""
    return BaseThrottle().get_ident(request) or "unknown"


def _keys(username: str | None, address: str, bucket: int) -> list[str]:
    keys = [f"{KEY}:addr:{hashlib.sha256(address.encode()).hexdigest()[:32]}:{bucket}"]
    if username:
        # Usernames are compared case-insensitively, as people type them.
        digest = hashlib.sha256(username.strip().lower().encode()).hexdigest()[:32]
        keys.append(f"{KEY}:user:{digest}:{bucket}")
    return keys


def _bucket() -> tuple[int, float]:
    """The current window's number and the seconds left in it."""
    now, window = _now(), _window_s()
    bucket = int(now // window)
    return bucket, (bucket + 1) * window - now


def check(username: str | None, address: str) -> None:
    """Raise DRF's ``Throttled`` (429, ``Retry-After`` in whole seconds) when ``username``
    or ``address`` already failed ``LLMGW_AUTH_FAILURE_LIMIT`` times in this window."""
    bucket, left_s = _bucket()
    counts = cache.get_many(_keys(username, address, bucket))
    if any(int(n) >= _limit() for n in counts.values()):
        raise Throttled(wait=max(1, math.ceil(left_s)),
                        detail="Too many failed logins for this user or address; try again later.")


def record_failure(username: str | None, address: str) -> None:
    """Count one failed login for ``username`` (if given) and ``address``; atomic in the
    cache (``add`` then ``incr``), so concurrent web processes do not lose counts."""
    bucket, _ = _bucket()
    timeout = int(math.ceil(_window_s())) * 2
    for key in _keys(username, address, bucket):
        cache.add(key, 0, timeout=timeout)
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr: start it again
            cache.set(key, 1, timeout=timeout)
