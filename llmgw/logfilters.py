"""Logging filters."""

import logging
import re


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


class RedactQuerySecrets(logging.Filter):
    """Blank the values of secret-looking query parameters (``?token=``, ``api_key=``,
    ``key=``, ``password=``, ``access_token=``…) in uvicorn's request lines (``uvicorn.access``
    for HTTP, ``uvicorn.error`` for websockets: ``"WebSocket /ws/agent/?token=…" 403``): llmgw reads
    tokens and keys only from headers and refuses them in a URL, but a client that put one
    there anyway (an old agent, a script) must not leave it in the log (docs/architecture.md,
    "Security": secrets stay out of logs). Installed on both loggers by ``llmgw.asgi``."""

    PATTERN = re.compile(r"(?i)([?&][^=&#\s]*(?:token|key|password|secret|auth)[^=&#\s]*=)[^&#\s]*")

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and record.args:
            record.args = tuple(self.PATTERN.sub(r"\1[redacted]", a) if isinstance(a, str) and "=" in a else a
                                for a in record.args)
        elif isinstance(record.msg, str) and "=" in record.msg:
            record.msg = self.PATTERN.sub(r"\1[redacted]", record.msg)
        return True


def install_access_log_redaction() -> None:
    """Add :class:`RedactQuerySecrets` to uvicorn's request-line loggers (once each)."""
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactQuerySecrets) for f in logger.filters):
            logger.addFilter(RedactQuerySecrets())
