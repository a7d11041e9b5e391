"""Project-wide middleware."""

from __future__ import annotations

import logging
import threading
import time

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse

from gateway.errors import openai_error

log = logging.getLogger(__name__)

RETRY_AFTER_S = 2
#: During an outage every request fails alike: one warning per this many seconds, with a count.
LOG_EVERY_S = 10.0


class _OutageLog:
    """Rate-limited warnings: the first failure at once, then one line per ``LOG_EVERY_S``
    saying how many requests were answered 503 in between. Failures further apart than
    that belong to separate outages: the earlier one's count is told as such."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_warned = float("-inf")
        self._last_failed = float("-inf")
        self._last_failed_wall = 0.0
        self._quiet = 0

    def note(self, request: HttpRequest, exception: Exception) -> None:
        now = time.monotonic()
        with self._lock:
            new_outage = now - self._last_failed > LOG_EVERY_S
            ended_wall, self._last_failed, self._last_failed_wall = self._last_failed_wall, now, time.time()
            if not new_outage and now - self._last_warned < LOG_EVERY_S:
                self._quiet += 1
                return
            quiet, self._quiet, self._last_warned = self._quiet, 0, now
        more = ""
        if quiet and new_outage:
            ended = time.strftime("%H:%M:%S", time.localtime(ended_wall))
            more = f" (the previous outage answered {quiet} more request(s) 503, the last at {ended})"
        elif quiet:
            more = f" ({quiet} more request(s) answered 503 since the last warning)"
        log.warning("database unavailable for %s %s: %s%s", request.method, request.path, exception, more)


_outage_log = _OutageLog()


class DatabaseUnavailableMiddleware:
    """A view that could not reach the database (PostgreSQL restarting, a failover) is
    answered 503 with ``Retry-After`` — in OpenAI's error shape under ``/v1/`` — instead of
    a 500: the request may be retried as it is. Costs nothing until a view raises (Django
    calls ``process_exception`` only then); sync and async alike."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        return self.get_response(request)  # async: the coroutine, awaited by the caller

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, (OperationalError, InterfaceError)):
            return None
        _outage_log.note(request, exception)
        message = "The control plane's database is unavailable for a moment; retry shortly."
        if request.path.startswith("/v1/"):
            return openai_error(503, message, code="database_unavailable", headers={"Retry-After": str(RETRY_AFTER_S)})
        response = HttpResponse(message + "\n", status=503, content_type="text/plain")
        response["Retry-After"] = str(RETRY_AFTER_S)
        return response
