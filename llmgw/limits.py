"""Request bodies bounded before any work (docs/architecture.md, "Gateway rules":
body limits): an ASGI wrapper in front of Django for every HTTP request.

* A declared ``Content-Length`` over the limit is answered 413 at once, without reading
  the body (no ``100 Continue`` is sent; what the client sends anyway is dropped).
* A streamed body (chunked, or one longer than it said) is counted while it is received
  and answered 413 as soon as it passes the limit.
* A body that has not arrived whole within ``LLMGW_BODY_TIMEOUT`` of the request's head is
  answered 408 and the connection closed.

The body is read here, whole, before Django sees the request: so before authentication,
before Django spools anything, and before the slowest client can hold a worker thread.
Limits: ``LLMGW_MAX_BODY_BYTES`` under ``/v1/`` (the gateway), ``LLMGW_MAX_ADMIN_BODY_BYTES``
elsewhere (admin, REST API, dashboard). Errors are in OpenAI's shape under ``/v1/``,
DRF's (``{"detail": …}``) under ``/api/``, plain text elsewhere; each closes the connection.
Websockets and lifespan events pass through untouched.
"""

from __future__ import annotations

import asyncio
import json
import time

from django.conf import settings

#: After a 413, how long the rest of a body is read and discarded before the connection is
#: closed: closing with unread bytes makes the kernel send a reset, which can destroy the
#: 413 before the client reads it ("lingering close", as nginx does). Seconds.
LINGER_S = 2.0

_OPENAI_CODES = {408: "request_timeout", 413: "request_too_large", 400: "invalid_request"}
_REASONS = {400: "Bad Request", 408: "Request Timeout", 413: "Payload Too Large"}


def is_gateway_path(path: str) -> bool:
    """Whether ``path`` is under the gateway's ``/v1/`` (its limit and error shape)."""
    return path == "/v1" or path.startswith("/v1/")


def _error_response(path: str, status: int, message: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Headers and body of an error answered here, in the shape the path's clients read."""
    if is_gateway_path(path):
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                     "code": _OPENAI_CODES[status]}}).encode()
        ctype = b"application/json"
    elif path.startswith("/api/"):
        body, ctype = json.dumps({"detail": message}).encode(), b"application/json"
    else:
        body, ctype = f"{_REASONS[status]}: {message}\n".encode(), b"text/plain; charset=utf-8"
    return [(b"content-type", ctype), (b"content-length", str(len(body)).encode()), (b"connection", b"close")], body


def _declared_length(headers) -> int | None | str:
    """The request's Content-Length as an int, None when absent, ``"bad"`` when it is not
    one non-negative number (several differing values, text)."""
    values = {value.strip() for name, value in headers if name.lower() == b"content-length"}
    if not values:
        return None
    if len(values) > 1:
        return "bad"
    value = values.pop()
    if not value.isdigit():
        return "bad"
    return int(value)


class _TooLarge(Exception):
    pass


class BodyLimits:
    """ASGI middleware: read an HTTP request's body within its size limit and deadline,
    then hand it to ``app`` in one ``http.request`` message (later ``receive()`` calls go
    to the server, so a client that disconnects is still seen). See the module docstring.

    Limits are read from settings per request (bytes; seconds, 0 for no deadline)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        gateway = is_gateway_path(path)
        limit = settings.LLMGW_MAX_BODY_BYTES if gateway else settings.LLMGW_MAX_ADMIN_BODY_BYTES
        declared = _declared_length(scope.get("headers", ()))
        if declared == "bad":
            return await self._answer(send, path, 400, "The Content-Length header is not one number.")
        if declared is not None and declared > limit:
            return await self._refuse_too_large(receive, send, path, f"Request body of {declared} bytes is over "
                                                                     f"the limit of {limit} bytes.")
        timeout_s = settings.LLMGW_BODY_TIMEOUT_S
        chunks: list[bytes] = []
        size = 0
        try:
            # One deadline for the whole body (no task per receive, unlike wait_for: this
            # runs on every request).
            async with asyncio.timeout(timeout_s if timeout_s > 0 else None):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None  # the client is gone: nobody to answer
                    body = message.get("body", b"")
                    if body:
                        size += len(body)
                        if size > limit:
                            raise _TooLarge
                        chunks.append(body)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            return await self._answer(send, path, 408, f"The request body did not arrive within {timeout_s:g} s.")
        except _TooLarge:
            return await self._refuse_too_large(receive, send, path, f"Request body is over the limit of {limit} "
                                                                     "bytes.")
        whole = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)

    @staticmethod
    async def _answer(send, path: str, status: int, message: str, linger: bool = False) -> None:
        """Send the error whole; with ``linger`` the response stays open (``more_body``)
        so that the caller can read the rest of the body before closing."""
        headers, body = _error_response(path, status, message)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": linger})

    async def _refuse_too_large(self, receive, send, path: str, message: str) -> None:
        """413 at once (whole, so the client can read it), then a lingering close: what the
        client still sends is read and dropped for at most :data:`LINGER_S`, never kept."""
        await self._answer(send, path, 413, message, linger=True)
        await self._discard(receive)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _discard(receive) -> None:
        """Read and drop what the client still sends, for at most :data:`LINGER_S`."""
        deadline = time.monotonic() + LINGER_S
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                async with asyncio.timeout(remaining):  # not wait_for: it can drop a cancel (gh-86296)
                    message = await receive()
                if message["type"] == "http.disconnect" or not message.get("more_body", False):
                    return
        except asyncio.TimeoutError:
            return
