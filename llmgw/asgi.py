"""ASGI entry point: HTTP to Django (static files served for the admin), websockets at
``/ws/agent/`` to the agents' consumer.

``/v1/`` and ``/metrics`` go to a lean Django handler: the same URL resolver and views, but
no middleware chain (sessions, CSRF, auth, messages… are of no use to the gateway's
csrf-exempt, session-less views and cost a thread hop each) and no new worker thread per
request (``ThreadSensitiveContext``): the few sync calls left (Django's request signals,
the database fallback of ``gateway.cache``) share one thread. Only the database-unavailable
answer (503 + Retry-After instead of 500) is kept, and the ``Host`` check that Django makes only
when something asks for the host (``ALLOWED_HOSTS``: 400 for any other name, so that a web
page rebound to this address cannot use ``/v1/`` or read ``/metrics``). Everything else (admin, API, dashboard)
keeps the full handler. In front of both, ``llmgw.limits.BodyLimits`` reads each request
body within its size limit and deadline (413 / 408 before any Django work).

A client that hangs up is seen by both handlers at no cost to the others: once the body is
read, Django's ``ASGIHandler.handle`` waits on ``receive()`` beside the view
(``listen_for_disconnect``; ``BodyLimits`` passes every later ``receive()`` to the server)
and cancels the view on ``http.disconnect``. A request held for a cold start ends there:
it leaves ``fleet.live.holding()`` (no longer counted, the watcher back to its normal
cadence) and is recorded 499 (``gateway/proxy.py``). A request the server cancels before
its answer began (uvicorn's shutdown, once ``--timeout-graceful-shutdown`` has passed) is
answered 503 ``shutting_down`` in OpenAI's shape with ``Retry-After`` instead of the server's
plain-text 500, and the cancel goes on.
"""

import asyncio
import gc
import io
import logging
import os
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from asgiref.sync import sync_to_async  # noqa: E402
from django.core import signals  # noqa: E402
from django.core.handlers.asgi import ASGIHandler, get_script_prefix  # noqa: E402
from django.urls import set_script_prefix  # noqa: E402
from django.core.exceptions import RequestAborted  # noqa: E402
from django.db import InterfaceError, OperationalError  # noqa: E402
from django.core.exceptions import DisallowedHost  # noqa: E402
from django.core.handlers.exception import convert_exception_to_response  # noqa: E402
from django.http import HttpResponseBadRequest  # noqa: E402
from django.http.request import HttpHeaders  # noqa: E402
from django.urls import ResolverMatch, get_resolver, path, re_path  # noqa: E402
from django.utils.log import log_response  # noqa: E402

from catalog.models import OPENAI_ENDPOINTS  # noqa: E402

from fleet import live  # noqa: E402
from fleet.live.consumer import AgentConsumer  # noqa: E402
from gateway.errors import openai_error  # noqa: E402
from gateway.usage import usage_records  # noqa: E402
from django.conf import settings  # noqa: E402
from llmgw import health, logqueue, metrics  # noqa: E402
from llmgw.limits import BodyLimits  # noqa: E402
from llmgw.logfilters import install_access_log_redaction  # noqa: E402
from llmgw.middleware import DatabaseUnavailableMiddleware  # noqa: E402

LEAN_PREFIXES = ("/v1/", "/metrics", *health.PATHS)
#: The URL map ``/v1/`` is resolved against (``llmgw.urls`` includes it at the root).
V1_URLCONF = "gateway.urls"


def _gateway_internal_error(request, exception):
    """Under ``/v1/``, an unexpected exception of a view is a 500 in OpenAI's shape (with
    its traceback on the log) rather than Django's HTML page; a database outage is left to
    ``DatabaseUnavailableMiddleware`` (503 with Retry-After)."""
    if not request.path.startswith("/v1/"):
        return None
    if isinstance(exception, (OperationalError, InterfaceError)):
        return None
    logging.getLogger("gateway.proxy").error("internal error serving %s %s", request.method, request.path[:200],
                                             exc_info=exception)
    return openai_error(500, "The gateway failed to serve this request (an internal error; it is logged).",
                        code="internal_error")


def _request_signals() -> None:
    """Django's ``request_started`` and ``request_finished`` receivers (blocking: run in
    the shared sync thread, whose database connection they check)."""
    signals.request_started.send(sender=LeanASGIHandler)
    signals.request_finished.send(sender=LeanASGIHandler)


#: The ``/v1/`` paths whose resolution is remembered (:meth:`LeanASGIHandler.resolve_request`):
#: the endpoints and the model list, a fixed set, so the memory is bounded whatever clients send.
RESOLVED_PATHS = frozenset([*(f"/v1/{e}" for e in OPENAI_ENDPOINTS), "/v1/models"])


def headers_of(scope: dict) -> HttpHeaders:
    """``request.headers`` straight from the ASGI scope: the same mapping as Django's
    ``HttpHeaders(request.META)`` (names in title case, a name with ``_`` left out as
    ``ASGIRequest`` leaves it out, repeated headers joined with ``,``) without going
    through ``META``'s CGI names (tests/llmgw/test_lean_resolve.py compares the two)."""
    joined: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin1")
        if "_" in name:
            continue
        value = raw_value.decode("latin1")
        key = name.lower()
        joined[key] = f"{joined[key]},{value}" if key in joined else value
    headers = HttpHeaders.__new__(HttpHeaders)
    headers._store = {key: (key.title(), value) for key, value in joined.items()}
    return headers


class LeanASGIHandler(ASGIHandler):
    """Django's ASGI handler without the middleware chain (see the module docstring)."""

    _resolved: dict[str, ResolverMatch] = {}
    #: The URL map ``/v1/`` is resolved against (bench/_floor_django.py puts its own here).
    v1_urlconf = V1_URLCONF

    async def get_response_async(self, request):
        """``BaseHandler.get_response_async`` without its ``set_urlconf(ROOT_URLCONF)``: a
        context variable set per request (a fifth of the resolver's cost) that no lean
        path reads — ``/v1/`` is resolved against :data:`V1_URLCONF` in
        :meth:`resolve_request`, the rest against the root, which is the default. Errors
        are logged as Django logs them."""
        response = await self._middleware_chain(request)
        response._resource_closers.append(request.close)
        if response.status_code >= 400:
            await sync_to_async(log_response, thread_sensitive=False)(
                "%s: %s", response.reason_phrase, request.path, response=response, request=request)
        return response

    async def read_body(self, receive):
        """The request body as an in-memory file. ``llmgw.limits.BodyLimits`` has read it
        whole, within its size limit, before any handler runs (one message replays it), so
        Django's spooled temporary file — made for bodies that may not fit in memory —
        would only copy it. Raises ``RequestAborted`` if the client left first."""
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RequestAborted()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return io.BytesIO(b"".join(chunks))

    def resolve_request(self, request):
        """The view for ``request``: against its ``urlconf`` (``/v1/``: :data:`V1_URLCONF`)
        or the root, without setting the thread's urlconf; a path of
        :data:`RESOLVED_PATHS` is resolved once per process (the same patterns always give
        the same match, and the view gets a copy of its arguments)."""
        path = request.path_info
        match = self._resolved.get(path)
        if match is None:
            match = get_resolver(getattr(request, "urlconf", None)).resolve(path)
            if path in RESOLVED_PATHS:
                self._resolved[path] = match
        request.resolver_match = match
        return match

    def load_middleware(self, is_async: bool = True) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = [_gateway_internal_error, DatabaseUnavailableMiddleware(None).process_exception]
        self._middleware_chain = convert_exception_to_response(self._host_checked)

    async def _host_checked(self, request):
        """400 for a ``Host`` not in ``ALLOWED_HOSTS`` (OpenAI's shape under ``/v1/``), as
        the full handler's middleware answers it; else the view's response. The health
        endpoints answer any Host: a load balancer probes by IP address."""
        if request.path in health.PATHS:
            return await self._get_response_async(request)
        try:
            request.get_host()
        except DisallowedHost as exc:
            logging.getLogger("django.security.DisallowedHost").warning("%s", exc)
            if request.path.startswith("/v1/"):
                return openai_error(400, "This gateway is not served under that host name (Host header).",
                                    code="disallowed_host")
            return HttpResponseBadRequest("Bad Request: this host name is not served here (Host header).\n",
                                          content_type="text/plain; charset=utf-8")
        return await self._get_response_async(request)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        if scope.get("path", "").startswith("/v1/"):
            await self._handle_v1(scope, receive, send)
        else:
            await self.handle(scope, receive, send)

    #: The most seconds between two runs of Django's request signals for ``/v1/``
    #: (:meth:`_handle_v1`): how long a database connection of the shared sync thread (the
    #: cache's rare fallback) may outlive its last use, or an unusable one stay open.
    DB_HYGIENE_INTERVAL_S = 1.0
    _hygiene_at = 0.0

    async def _handle_v1(self, scope, receive, send):
        """``ASGIHandler.handle`` for ``/v1/`` without its three thread hops per request
        (``request_started``, ``request_finished``, ``response.close`` — each a
        ``sync_to_async`` call, about a fifth of a request's CPU): the response's closers run
        here, on the loop (they are made to: ``gateway.proxy``), and the signals' receivers
        (``close_old_connections``, ``close_caches``, ``reset_urlconf``) run in the shared
        sync thread — where the database fallback of ``gateway.cache`` runs — after any
        answer of 500 or more (a database outage: its broken connection goes at once) and
        otherwise at most every :data:`DB_HYGIENE_INTERVAL_S`. A warm ``/v1/`` request
        touches no database (tests/gateway/test_hot_path_queries.py), so nothing is left
        open that the next run would not close."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)
            await sync_to_async(error_response.close)()
            return
        # Resolved against the gateway's own patterns (every /v1/ path has one there), not
        # the whole site's: the same view, a fifth of the resolver's work.
        request.urlconf = self.v1_urlconf
        request.headers = headers_of(scope)  # what Django would build from META, at a third of the cost
        # Read by gateway.proxy: a request cancelled without this mark was cancelled by the
        # server (its shutdown), and is recorded 503 rather than 499.
        request.client_left = False

        # The view runs in this task; a second one listens for the client leaving and, if it
        # does, cancels this one (as ASGIHandler.handle cancels its view task), one task and
        # one asyncio.wait fewer per request than Django's two-task form.
        this = asyncio.current_task()
        aborted = False

        async def watch_disconnect():
            nonlocal aborted
            try:
                await self.listen_for_disconnect(receive)
            except RequestAborted:
                aborted = request.client_left = True
                this.cancel()

        watcher = asyncio.create_task(watch_disconnect())
        response = None
        try:
            response = await self.run_get_response(request)
            await self.send_response(response, send)
        except asyncio.CancelledError:
            # The client left (the watcher's cancel) — unless the server cancelled too, at the
            # same moment or before: that one is not ours to absorb (uvicorn's shutdown).
            if not aborted or this.uncancel() > 0:
                watcher.cancel()
                if response is None and this.cancelling():  # nothing sent yet: say why, not a bare 500
                    await self._answer_shutting_down(send)
                self._close(response, body_file)
                raise
        # A cancel requested is always delivered at the await it interrupts, above: once the
        # watcher is cancelled here (before any other await) it can request none.
        watcher.cancel()
        if watcher.done() and not watcher.cancelled() and watcher.exception() is not None:
            self._close(response, body_file)
            raise watcher.exception()  # an ASGI message that is not a disconnect, as Django raises it
        status = 499 if response is None else response.status_code
        self._close(response, body_file)
        now = time.monotonic()
        if status >= 500 or now - LeanASGIHandler._hygiene_at >= self.DB_HYGIENE_INTERVAL_S:
            LeanASGIHandler._hygiene_at = now
            await sync_to_async(_request_signals)()

    @staticmethod
    def _close(response, body_file) -> None:
        """The response's closers (``gateway.proxy`` settles a request not yet recorded
        there), on the loop, whatever ended the request; then the request's body file."""
        if response is not None:
            for closer in response._resource_closers:
                try:
                    closer()
                except Exception:  # noqa: BLE001 (as HttpResponseBase.close)
                    pass
            response._resource_closers.clear()
            response.closed = True
        body_file.close()

    async def _answer_shutting_down(self, send) -> None:
        """503 in OpenAI's shape (with ``Retry-After``) for a request the server cancels
        before its answer began — uvicorn's shutdown once its graceful timeout has passed —
        rather than the server's plain-text 500; nothing if the connection is already gone."""
        response = openai_error(503, "The gateway stopped before answering (it is shutting down or restarting); "
                                     "retry.", code="shutting_down", headers={"Retry-After": "1", "Connection": "close"})
        try:
            await self.send_response(response, send)
        except Exception:  # noqa: BLE001 (the client or the server is gone: nobody to tell)
            pass


class _Split:
    """HTTP under :data:`LEAN_PREFIXES` to the lean handler, the rest to ``full``."""

    def __init__(self, lean, full) -> None:
        self.lean = lean
        self.full = full

    async def __call__(self, scope, receive, send):
        if scope.get("path", "").startswith(LEAN_PREFIXES):
            return await self.lean(scope, receive, send)
        return await self.full(scope, receive, send)


install_access_log_redaction()  # no ?token=… in uvicorn's access log
lean_asgi = LeanASGIHandler()


async def refuse_websocket(scope, receive, send):
    """A websocket to any path but ``/ws/agent/``: refused (uvicorn answers the handshake
    403), with no exception — Channels' router raises one, and its traceback on the error
    log, for every unrouted attempt."""
    message = await receive()
    if message["type"] == "websocket.connect":
        await send({"type": "websocket.close", "code": 1008})

router = ProtocolTypeRouter(
    {
        # Bodies are bounded (size, deadline) before either handler sees the request.
        "http": BodyLimits(_Split(lean_asgi, ASGIStaticFilesHandler(django_asgi))),
        "websocket": URLRouter([path("ws/agent/", AgentConsumer.as_asgi()), re_path(r"", refuse_websocket)]),
    }
)


async def _shutdown() -> None:
    """Write what this process holds in memory: usage records and the last usage report;
    take its gauges out of ``/metrics``' sums (several web processes)."""
    await live.stop()
    await sync_to_async(usage_records.flush, thread_sensitive=False)()
    metrics.forget_process()


#: The youngest generation's threshold (Python's default is 700: tracked containers allocated
#: and not yet freed). A young collection walks that many objects and stalls the loop for
#: it: at 10,000 each took 3-5 ms, which made the one-client p99 (issue 20's goal: +3 ms);
#: at 2,000 they take under 1 ms, for no CPU per request that the benchmark can tell apart.
GC_YOUNG_THRESHOLD = 2_000
_gc_settled = False


def settle_gc() -> None:
    """Once per process, when the app is loaded (its first request or the lifespan's
    startup): collect, then ``gc.freeze()`` what is left — Django's, the libraries' and the
    app's long-lived objects, about 140,000 — so that no later full collection walks them
    (each one took 100-250 ms of event-loop stall under load), and raise the young
    generation's threshold to :data:`GC_YOUNG_THRESHOLD`."""
    global _gc_settled
    if _gc_settled:
        return
    _gc_settled = True
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, oldest)


async def application(scope, receive, send):
    """The ASGI app. Servers with the lifespan protocol (uvicorn) start the watcher at
    startup (the process registers as a control plane before its first request) and get a
    clean shutdown that flushes usage; for those without (daphne) the watcher starts with
    the first request and an ``atexit`` hook flushes."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                live.start()
                settle_gc()
                if settings.LLMGW_LOG_WRITER_THREAD:
                    logqueue.install()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                try:
                    await _shutdown()
                finally:
                    # The queued log lines now, and later ones straight out: uvicorn re-raises
                    # SIGTERM once it is down, so no atexit hook would run. No time limit: a
                    # reader that is behind would block the lines written after this anyway
                    # (the same pipe), so a limit only loses the queued ones and reorders them.
                    logqueue.drain(timeout_s=None)
                    await send({"type": "lifespan.shutdown.complete"})
                return
    if not _gc_settled:
        settle_gc()  # a server without the lifespan protocol (daphne)
    return await router(scope, receive, send)
