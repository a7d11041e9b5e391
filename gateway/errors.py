"""OpenAI-shaped JSON errors: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json

from django.http import HttpResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "api_error",
    503: "service_unavailable",
    504: "api_error",
}


def openai_error(status: int, message: str, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None, error_type: str | None = None) -> HttpResponse:
    """An error response in OpenAI's shape with the given HTTP status; ``error_type``
    overrides the ``type`` the status implies (OpenAI's 429s say ``requests``, ``tokens``
    or ``insufficient_quota``)."""
    body = {"error": {"message": message, "type": error_type or _TYPES.get(status, "api_error"), "param": param,
                      "code": code}}
    response = HttpResponse(json.dumps(body), status=status, content_type="application/json")
    for name, value in (headers or {}).items():
        response[name] = value
    return response
