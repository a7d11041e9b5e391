"""Logging filters."""

import logging


class SkipGatewayAnswers(logging.Filter):
    """Drop Django's "Service Unavailable: /v1/…" lines: a 502/503/504 from the gateway is
    an answer it chose (a cold model, a stopped cluster) and already explains to the client,
    not a server error. Real exceptions (with a traceback) still pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "django.request" or record.exc_info:
            return True
        request = getattr(record, "request", None)
        path = getattr(request, "path", "") or ""
        return not (path.startswith("/v1/") and getattr(record, "status_code", 0) in (502, 503, 504))
