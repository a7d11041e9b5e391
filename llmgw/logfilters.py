"""Logging filters."""

import logging


class SkipGatewayAnswers(logging.Filter):
    """Drop Django's "Service Unavailable: /v1/…" and "Unauthorized: /v1/…" lines: a 4xx or
    a 502/503/504 from the gateway is an answer it chose (a wrong key, a cold model, a
    stopped cluster) and already explains to the client — and records as usage — not a
    server error; a misbehaving client would otherwise flood the log. Real exceptions (with
    a traceback) still pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "django.request" or record.exc_info:
            return True
        request = getattr(record, "request", None)
        path = getattr(request, "path", "") or ""
        status = getattr(record, "status_code", 0)
        return not (path.startswith("/v1/") and (400 <= status < 500 or status in (502, 503, 504)))
