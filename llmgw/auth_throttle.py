"""Failed password logins, counted per username and per client address (the token endpoint
``POST /api/auth/token/``, HTTP basic auth and the admin's login page share the counters).

Counters live in Django's cache (``settings.CACHES``: in memory in the embedded default,
Redis in production so every web process sees the same counts), in fixed windows of
``LLMGW_AUTH_FAILURE_WINDOW`` (60 s). Once a username or an address has
``LLMGW_AUTH_FAILURE_LIMIT`` (5) failures in the current window, every further attempt of
it is refused with 429 and ``Retry-After`` until the window ends — a correct password
too: otherwise the limit would not stop guessing, only slow the reporting of a hit. Only
failures count; a success neither counts nor resets. An attempt is counted when it
starts, before its password is checked, and a success takes its count back
(:func:`reserve`): guesses sent at once count as they arrive, not after the slow password
hash. The price is that someone who knows a username can keep it locked out of password
logins for as long as they keep failing (tokens already issued and session logins keep
working).
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import time
import unicodedata

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
    by default the socket's peer, never a client-written ``X-Forwarded-For``). Works for a
    DRF request and a plain Django one (the admin's login form)."""
    return BaseThrottle().get_ident(request) or "unknown"


def address_key(address: str) -> str:
    """What an address is counted as: an IPv6 client by its /64 (one host is handed a
    whole /64 and could otherwise change address at every attempt), an IPv4-mapped IPv6
    address as the IPv4 address it is; anything else as written."""
    try:
        ip = ipaddress.ip_address(address.strip().split("%")[0])
    except ValueError:
        return address.strip()
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def username_key(username) -> str | None:
    """What a username is counted as: as people type it (NFKC, as Django's login form
    normalises it; case and surrounding spaces ignored). A number in a JSON body is a
    username too (the token endpoint's serializer accepts it)."""
    if isinstance(username, bool) or not isinstance(username, (str, int, float)):
        return None
    name = unicodedata.normalize("NFKC", str(username)).strip().casefold()
    return name or None


def _keys(username, address: str, bucket: int) -> list[str]:
    keys = [f"{KEY}:addr:{hashlib.sha256(address_key(address).encode()).hexdigest()[:32]}:{bucket}"]
    name = username_key(username)
    if name:
        digest = hashlib.sha256(name.encode()).hexdigest()[:32]
        keys.append(f"{KEY}:user:{digest}:{bucket}")
    return keys


def _bucket() -> tuple[int, float]:
    """The current window's number and the seconds left in it."""
    now, window = _now(), _window_s()
    bucket = int(now // window)
    return bucket, (bucket + 1) * window - now


MESSAGE = "Too many failed logins for this user or address; try again later."


def _incr(key: str, timeout: int) -> int:
    cache.add(key, 0, timeout=timeout)
    try:
        return int(cache.incr(key))
    except ValueError:  # expired between add and incr: start it again
        cache.set(key, 1, timeout=timeout)
        return 1


def _decr(keys: list[str]) -> None:
    for key in keys:
        try:
            cache.decr(key)
        except ValueError:  # the window's counter is gone already
            pass


class Attempt:
    """One login attempt, counted before its password is checked (see :func:`reserve`)."""

    def __init__(self, keys: list[str]):
        self._keys = keys

    def succeeded(self) -> None:
        """The password was right: the attempt is not a failure, it stops counting."""
        keys, self._keys = self._keys, []
        _decr(keys)


def reserve(username, address: str) -> tuple[Attempt | None, int | None]:
    """Count a login attempt of ``username`` from ``address`` *before* its password is
    checked, atomically in the cache (``add`` then ``incr``), so guesses sent at once
    cannot all pass a check made before any of them failed; a success takes its count
    back (:meth:`Attempt.succeeded`), a failure leaves it. Returns ``(attempt, None)``,
    or ``(None, seconds to wait)`` when the username or the address already has
    ``LLMGW_AUTH_FAILURE_LIMIT`` attempts counted in this window (this one is not
    counted then)."""
    bucket, left_s = _bucket()
    timeout = int(math.ceil(_window_s())) * 2
    keys = _keys(username, address, bucket)
    counts = [_incr(key, timeout) for key in keys]
    if any(n > _limit() for n in counts):
        _decr(keys)
        return None, max(1, math.ceil(left_s))
    return Attempt(keys), None


def attempt(username, address: str) -> Attempt:
    """:func:`reserve` for the REST API: DRF's ``Throttled`` (429, ``Retry-After`` in
    whole seconds) when refused."""
    found, wait = reserve(username, address)
    if found is None:
        raise Throttled(wait=wait, detail=MESSAGE)
    return found
