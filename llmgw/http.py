"""uvicorn's httptools protocol with a deadline for request heads (docs/architecture.md,
"Gateway rules": body limits; a request that does not finish sending its headers in time
is closed).

uvicorn closes idle keep-alive connections (``--timeout-keep-alive``) but has no header
timeout: a client that opens a connection and sends nothing, or trickles its request line
and headers a byte at a time (slowloris), holds the connection — and one of the
``--limit-concurrency`` slots — for as long as it likes. Here a request head must be
complete within ``LLMGW_HEADER_TIMEOUT`` of the connection opening, or of the first byte
of the next request on a kept-alive connection; otherwise the connection is answered 408
(when some of a head arrived and no response is under way) and closed. Between requests
the keep-alive timeout applies as before. ``llmgw up`` runs uvicorn with
``--http llmgw.http:HeaderTimeoutProtocol``.
"""

from __future__ import annotations

from asyncio import TimerHandle

from django.conf import settings
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_MESSAGE = b"The request head did not arrive in time.\n"
_RESPONSE_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                 b"content-length: " + str(len(_MESSAGE)).encode() + b"\r\nconnection: close\r\n\r\n" + _MESSAGE)


def header_timeout_s() -> float:
    """``LLMGW_HEADER_TIMEOUT`` in seconds (0: no deadline), from the Django settings the
    app has loaded by the time a connection is made."""
    return float(settings.LLMGW_HEADER_TIMEOUT_S)


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """:class:`HttpToolsProtocol` that closes a connection whose request head is not
    complete within :func:`header_timeout_s` (see the module docstring). The timer runs
    while a head is awaited: from ``connection_made``, or from the first byte after a
    response on a kept-alive connection, until ``on_headers_complete``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout_s = header_timeout_s()
        self.head_timer: TimerHandle | None = None
        self.awaiting_head = True  # False from a head's end until its response is complete
        self.head_bytes = False  # some bytes of the awaited head arrived

    def _arm_head_timer(self) -> None:
        if self.head_timer is None and self.head_timeout_s > 0 and self.transport is not None:
            self.head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.awaiting_head and data:
            self.head_bytes = True
            self._arm_head_timer()  # keep-alive's timer is cancelled by this data: ours runs
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_head_timer()  # a pipelined head, begun while a response is under way

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        self.awaiting_head = False
        self.head_bytes = False
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        # With a pipelined request already parsed, its head is not awaited.
        self.awaiting_head = not self.pipeline
        super().on_response_complete()

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self.transport is None or self.transport.is_closing():
            return
        idle = self.cycle is None or self.cycle.response_complete
        if idle and self.head_bytes:
            self.transport.write(_RESPONSE_408)
        self.logger.info("closing a connection from %s: no complete request head in %.1f s",
                         "%s:%d" % self.client if self.client else "?", self.head_timeout_s)
        self.transport.close()
