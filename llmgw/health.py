"""Health endpoints of a web process, for load balancers, orchestrators and systemd.

* ``GET /healthz`` — *liveness*: the process runs and its event loop answers. 200 with
  ``{"status": "ok"}``; no database, no lock, no I/O. A failing liveness probe means
  "restart this process".
* ``GET /readyz`` — *readiness*: this process can serve. Three checks, run at once, each
  bounded by ``LLMGW_READY_TIMEOUT`` (so the answer comes within about that, never a hang):

  - ``database``: ``SELECT 1`` answers (one probe at a time per process: while one is
    still waiting, the next probe says so rather than pile up threads behind a stalled
    database);
  - ``channel_layer``: Channels' layer is reachable — the in-memory layer always is; a
    Redis layer answers ``PING`` on each of its hosts;
  - ``watcher``: this process's picture of the cluster (routing table, keys, models;
    ``fleet.live``) was refreshed within ``LLMGW_READY_WATCH_STALE``. The first probe of
    a process whose watcher has not refreshed yet (daphne starts it on first use) waits
    for its first refresh, within the same bound.

  200 with every check when all pass; 503 otherwise, ``failed`` naming each failing check
  and why on one line (``"database: did not answer within 1.5 s"``), without addresses or
  user names. The exception's own words go to this process's log, once when readiness is
  lost and once when it is back — never one error line per probe.

Both answer whatever the ``Host`` header says (``llmgw.asgi`` exempts them from the
``ALLOWED_HOSTS`` check: a balancer probes by IP address) and need no credentials; both
take the lean path of ``llmgw.asgi`` (no middleware) and are not counted as ``/v1/``
requests. Their bodies name no address, user or secret (docs/architecture.md,
"Health").
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse

log = logging.getLogger(__name__)

#: The paths served here (``llmgw.asgi`` routes them lean and skips the Host check for them).
PATHS = ("/healthz", "/readyz")

_HEADERS = {"Cache-Control": "no-store"}


@dataclass(frozen=True)
class Check:
    """One readiness check's outcome: ``name`` (``database``, ``channel_layer``,
    ``watcher``), ``ok``, and ``detail``: one line for people (``"answered in 3 ms"``,
    ``"did not answer within 1.5 s"``)."""

    name: str
    ok: bool
    detail: str
    #: The failure in the library's own words, for the log only (addresses included).
    cause: str = ""

    @property
    def line(self) -> str:
        return f"{self.name}: {self.detail}"


def _json(status: int, body: dict) -> HttpResponse:
    response = HttpResponse(json.dumps(body), status=status, content_type="application/json")
    for name, value in _HEADERS.items():
        response[name] = value
    if status >= 500:
        # Readiness lost is told by :func:`_note` (once); Django's request logger would
        # otherwise write an ERROR line for every probe of a balancer.
        response._has_been_logged = True
    return response


def _method_not_allowed(request: HttpRequest) -> HttpResponse | None:
    if request.method in ("GET", "HEAD"):
        return None
    response = _json(405, {"status": "error", "message": f"Use GET for {request.path}."})
    response["Allow"] = "GET, HEAD"
    return response


async def healthz(request: HttpRequest) -> HttpResponse:
    """GET /healthz: 200 ``{"status": "ok"}`` while the process and its event loop run."""
    return _method_not_allowed(request) or _json(200, {"status": "ok"})


# --- the checks ------------------------------------------------------------------------------


def _first_line(exc: BaseException) -> str:
    """An exception's first line as the library wrote it (for the log), or its class's
    name when it says nothing."""
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


# Redis: "Error 111 connecting to 10.0.0.5:6379. Connection refused." → "Connection refused."
_REDIS_CONNECTING = re.compile(r"connecting to \S+?\.\s+(\S.*)$")
# What would name a machine or an account: IP addresses (with a port), quoted names.
_ADDRESS = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b|\[[0-9A-Fa-f:.]+\](?::\d+)?|\"[^\"]*\"|'[^']*'")


def _plain(exc: BaseException) -> str:
    """An exception in a few words for the body, without the addresses, host names or
    user names the driver put in it (the body is served to any Host): the reason after
    the driver's last ``": "`` (``"Connection refused"``, ``"unable to open database
    file"``), quoted names and IP addresses as ``…``, at most 160 characters."""
    text = _first_line(exc)
    redis = _REDIS_CONNECTING.search(text)
    if redis:
        text = redis.group(1)
    elif ": " in text and len(text.rsplit(": ", 1)[1].strip()) > 2:
        text = text.rsplit(": ", 1)[1]
    text = _ADDRESS.sub("…", text).strip() or type(exc).__name__
    return text if len(text) <= 160 else text[:159] + "…"


def _select_one() -> None:
    """``SELECT 1`` on this thread's connection (blocking). A connection left broken by an
    earlier failure (PostgreSQL restarted) is closed first, and after a failure, so that
    the next probe connects afresh."""
    from django.db import connection

    connection.close_if_unusable_or_obsolete()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception:
        connection.close()
        raise


#: Event loop → the database probe in progress on it (at most one per loop: a probe whose
#: database stalls holds a worker thread until the driver gives up; the next probes report
#: it instead of taking more threads).
_db_probes: dict[asyncio.AbstractEventLoop, tuple[asyncio.Future, float]] = {}


async def check_database(timeout_s: float) -> Check:
    """``SELECT 1`` on the default database within ``timeout_s`` seconds (in a worker
    thread). Fails with the driver's first line (``"unable to open database file"``,
    ``"connection refused"``…) or ``"did not answer within N s"``. Raises nothing."""
    loop = asyncio.get_running_loop()
    for other in [k for k in _db_probes if k.is_closed()]:
        del _db_probes[other]
    probe = _db_probes.get(loop)
    if probe is not None and probe[0].done():
        probe = None
    if probe is None:
        future = asyncio.ensure_future(sync_to_async(_select_one, thread_sensitive=False)())
        future.add_done_callback(lambda f: f.cancelled() or f.exception())  # never "exception never retrieved"
        probe = _db_probes[loop] = (future, time.monotonic())
    future, started = probe
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.shield(future)
    except TimeoutError:
        return Check("database", False, f"did not answer within {time.monotonic() - started:.1f} s")
    except Exception as exc:  # noqa: BLE001 — any failure is the answer
        return Check("database", False, f"unreachable: {_plain(exc)}", _first_line(exc))
    return Check("database", True, f"answered in {(time.monotonic() - started) * 1000:.0f} ms")


async def check_channel_layer(timeout_s: float) -> Check:
    """The default channel layer reachable within ``timeout_s`` seconds: Channels'
    in-memory layer always is (it is this process's own); a Redis layer (channels_redis)
    answers ``PING`` on each host. Another kind of layer is reported as not checked
    (ok). Raises nothing."""
    from channels.layers import InMemoryChannelLayer, get_channel_layer

    try:
        layer = get_channel_layer()
    except Exception as exc:  # noqa: BLE001 — a broken CHANNEL_LAYERS setting
        return Check("channel_layer", False, f"not configured: {_plain(exc)}", _first_line(exc))
    if layer is None:
        return Check("channel_layer", False, "none configured (CHANNEL_LAYERS)")
    if isinstance(layer, InMemoryChannelLayer):
        return Check("channel_layer", True, "in memory (this process only)")
    if not (hasattr(layer, "connection") and hasattr(layer, "ring_size")):
        return Check("channel_layer", True, f"{type(layer).__name__} (not checked)")
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            for index in range(layer.ring_size):
                await layer.connection(index).ping()
    except TimeoutError:
        return Check("channel_layer", False, f"Redis did not answer within {timeout_s:.1f} s")
    except Exception as exc:  # noqa: BLE001 — refused, unknown host, authentication…
        return Check("channel_layer", False, f"Redis unreachable: {_plain(exc)}", _first_line(exc))
    return Check("channel_layer", True, f"Redis answered in {(time.monotonic() - started) * 1000:.0f} ms")


async def check_watcher(timeout_s: float, stale_after_s: float) -> Check:
    """This process's watcher (``fleet.live``) refreshed within ``stale_after_s`` seconds.
    Starts it if it is not running on this event loop; a watcher that has not refreshed
    yet, or whose last refresh is stale, is waited for, up to ``timeout_s``, so one just
    (re)started is not called stale. Raises nothing."""
    from fleet import live

    view = live.current_view()  # starts the watcher on this loop if it is not running
    if not view.version:
        await live.wait_for_change(timeout_s)
        view = live.current_view()
        if not view.version:
            return Check("watcher", False, f"no refresh yet (waited {timeout_s:.1f} s; the database may be away)")
    age_s = time.monotonic() - view.started_at
    if age_s > stale_after_s:
        # A watcher (re)started on this loop may be about to land its refresh: give it the
        # same bound before calling the picture stale.
        await live.wait_for_change(timeout_s)
        age_s = time.monotonic() - live.current_view().started_at
    if age_s > stale_after_s:
        return Check("watcher", False, f"last refresh {age_s:.1f} s ago (stale after {stale_after_s:g} s)")
    return Check("watcher", True, f"refreshed {age_s:.1f} s ago")


async def readiness() -> list[Check]:
    """Every readiness check, run at once; the whole within about ``LLMGW_READY_TIMEOUT``."""
    timeout_s = settings.LLMGW_READY_TIMEOUT_S
    return list(await asyncio.gather(
        check_database(timeout_s),
        check_channel_layer(timeout_s),
        check_watcher(timeout_s, settings.LLMGW_READY_WATCH_STALE_S),
    ))


#: Whether the last readiness answer of this process was "ready" (None: none given yet).
_was_ready: bool | None = None


def _note(checks: list[Check]) -> None:
    """Log readiness when it changes: a WARNING naming what failed when it is lost, an
    INFO line when it is back; nothing while it stays the same."""
    global _was_ready
    ready = all(c.ok for c in checks)
    if ready == _was_ready:
        return
    if not ready:
        log.warning("not ready: %s", "; ".join(f"{c.line} ({c.cause})" if c.cause else c.line
                                                for c in checks if not c.ok))
    elif _was_ready is False:
        log.info("ready again")
    _was_ready = ready


async def readyz(request: HttpRequest) -> HttpResponse:
    """GET /readyz: 200 ``{"status": "ready", "checks": {...}}`` when the database, the
    channel layer and the watcher are fine; 503 ``{"status": "not ready", "failed":
    ["database: …"], "checks": {...}}`` otherwise. ``checks`` maps each name to
    ``{"ok": bool, "detail": str}``."""
    refused = _method_not_allowed(request)
    if refused is not None:
        return refused
    checks = await readiness()
    _note(checks)
    body: dict = {"status": "ready" if all(c.ok for c in checks) else "not ready"}
    failed = [c.line for c in checks if not c.ok]
    if failed:
        body["failed"] = failed
    body["checks"] = {c.name: {"ok": c.ok, "detail": c.detail} for c in checks}
    return _json(503 if failed else 200, body)
