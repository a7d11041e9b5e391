"""The gateway's side of an upstream call: one aiohttp session per event loop, the URL and
headers sent, bounded reads, and which upstream response headers reach the client
(docs/architecture.md, "Gateway rules" and "Security": edges).

Only the client's ``Accept`` goes upstream (and, to an external model that allows it,
``OpenAI-Organization`` / ``OpenAI-Project``); never the client's ``Authorization``. The
query string goes as the client sent it (:func:`upstream_url`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import weakref

import aiohttp
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from yarl import URL

log = logging.getLogger(__name__)

_clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession]" = weakref.WeakKeyDictionary()
# Not content-type: the body is JSON whatever the client said (curl -d says form data).
_FORWARDED_REQUEST_HEADERS = ("accept",)
# Which organization/project the operator's key is billed to is the operator's choice: sent
# to an external service only when its model allows it (never to engines, which read none).
_ORG_HEADERS = ("openai-organization", "openai-project")
# Upstream response headers never relayed: hop-by-hop ones (RFC 9110 7.6.1; plus any the
# upstream's Connection header names), ours to set (server, date, length, encoding), and
# those that would act on the client under the gateway's origin — cookies and sessions, an
# upstream's auth challenge, HSTS, Alt-Svc, CORS grants — or name the operator's account
# at an external provider (its organization / project); those that would send the client
# elsewhere under the gateway's name (redirects, refreshes, preloads); and the gateway's own
# (``X-Llmgw-*``: set here, never taken from upstream).
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
               "content-length", "content-encoding", "server", "date"}
_UNSAFE_RESPONSE_HEADERS = {"set-cookie", "set-cookie2", "www-authenticate", "proxy-authenticate",
                            "authentication-info", "proxy-authentication-info", "strict-transport-security",
                            "alt-svc", "clear-site-data", "openai-organization", "openai-project",
                            "location", "content-location", "refresh", "link", "content-security-policy",
                            "content-security-policy-report-only", "x-content-type-options"}
_UNSAFE_RESPONSE_PREFIXES = ("access-control-", "x-llmgw-")


#: Seconds an idle upstream connection is kept: under uvicorn's 5 s (llama-cpp-python, vLLM
#: and SGLang serve with it), so the pool lets a connection go before the engine closes it and
#: a request is never written into a connection the engine has just closed.
KEEPALIVE_S = 4.0


def upstream_client() -> aiohttp.ClientSession:
    """One shared session per running event loop (sessions are bound to their loop)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None or client.closed:
        client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1000, limit_per_host=0, keepalive_timeout=KEEPALIVE_S),
            timeout=aiohttp.ClientTimeout(total=None, connect=settings.LLMGW_UPSTREAM_CONNECT_TIMEOUT_S,
                                          sock_read=settings.LLMGW_UPSTREAM_READ_TIMEOUT_S),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        _clients[loop] = client
    return client


class Refused(Exception):
    """No connection could be made to the upstream, so nothing was sent (a replica's
    request may go to another one). ``reason`` says why in words for the client
    (:func:`connect_failure`: ``"connection refused"``); the exception's text keeps the
    library's own words, with the address, for the log."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason


def connect_failure(exc: aiohttp.ClientConnectorError) -> str:
    """Why a connection could not be made, in plain words and without the address:
    ``"its host name did not resolve"``, ``"its TLS certificate was not accepted"``,
    ``"the TLS handshake failed"``, ``"connection refused"``, ``"no route to its host"``,
    ``"its network is unreachable"``, ``"the connection was reset"``, else ``"the
    connection failed"``. aiohttp's own text (``Cannot connect to host 10.0.0.5:8000
    ssl:default [Connect call failed ('10.0.0.5', 8000)]``) is for the log only."""
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "its host name did not resolve"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return "its TLS certificate was not accepted"
    if isinstance(exc, aiohttp.ClientSSLError):
        return "the TLS handshake failed"
    number = getattr(getattr(exc, "os_error", None), "errno", None)
    return _ERRNO_WORDS.get(number, "the connection failed")


_ERRNO_WORDS = {errno.ECONNREFUSED: "connection refused", errno.EHOSTUNREACH: "no route to its host",
                errno.ENETUNREACH: "its network is unreachable", errno.ECONNRESET: "the connection was reset",
                errno.ETIMEDOUT: "the connection timed out", errno.EADDRNOTAVAIL: "its address is not available"}


def _seconds(value_s: float) -> str:
    return f"{value_s:g} s"


def timeout_words(exc: BaseException) -> str:
    """A timeout in words with the limit that ran out: ``"did not accept a connection
    within 5 s"`` (``LLMGW_UPSTREAM_CONNECT_TIMEOUT``) or ``"did not answer within 600 s"``
    (``LLMGW_UPSTREAM_READ_TIMEOUT``, the longest silence while reading)."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return f"did not accept a connection within {_seconds(settings.LLMGW_UPSTREAM_CONNECT_TIMEOUT_S)}"
    return f"did not answer within {_seconds(settings.LLMGW_UPSTREAM_READ_TIMEOUT_S)}"


class UpstreamAnswerTooLarge(aiohttp.ClientPayloadError):
    """An upstream answer (or one event of a stream) over ``LLMGW_MAX_UPSTREAM_BODY_BYTES``."""


async def read_bounded(upstream: aiohttp.ClientResponse) -> bytes:
    """The whole answer, read no further than ``LLMGW_MAX_UPSTREAM_BODY_BYTES`` (decompressed:
    a small gzip answer can unpack to any size)."""
    limit = settings.LLMGW_MAX_UPSTREAM_BODY_BYTES
    chunks, size = [], 0
    async for chunk in upstream.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise UpstreamAnswerTooLarge(f"the answer is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)



def request_headers(request: HttpRequest, model) -> dict[str, str]:
    """The client's headers that go upstream to ``model`` (a catalog ``Model`` or a
    ``gateway.cache.CachedModel``): ``Accept``; ``OpenAI-Organization`` and
    ``OpenAI-Project`` only to an external model that allows them
    (``external_forward_org_headers``). Never the client's ``Authorization``."""
    headers = {}
    names = _FORWARDED_REQUEST_HEADERS
    if model.is_external and model.external_forward_org_headers:
        names += _ORG_HEADERS
    for name in names:
        value = request.headers.get(name)
        if value:
            headers[name] = value
    headers["content-type"] = "application/json"
    return headers


async def open_upstream(url: str | URL, content: bytes, headers: dict[str, str]) -> aiohttp.ClientResponse:
    """The upstream's response, headers read, body not yet (the caller releases it).
    Raises :class:`Refused` when no connection could be made, ``asyncio.TimeoutError``
    (:func:`timeout_words`) and any other ``aiohttp.ClientError`` (:func:`what_broke`)."""
    try:
        return await upstream_client().post(url, data=content, headers=headers, allow_redirects=False)
    except aiohttp.ClientConnectorError as exc:
        raise Refused(connect_failure(exc), str(exc)) from exc


def relayed_header(name: str, connection: str = "") -> bool:
    """Whether an upstream response header ``name`` may reach the client (see
    ``_HOP_BY_HOP`` and ``_UNSAFE_RESPONSE_HEADERS``); ``connection`` is the upstream's
    ``Connection`` header, whose listed names are hop-by-hop too (docs/architecture.md,
    "Security": edges)."""
    lowered = name.lower()
    if lowered in _HOP_BY_HOP or lowered in _UNSAFE_RESPONSE_HEADERS or lowered == "content-type":
        return False
    if lowered.startswith(_UNSAFE_RESPONSE_PREFIXES):
        return False
    return lowered not in {token.strip().lower() for token in connection.split(",")}


#: On every relayed answer: whatever an upstream sends (an HTML page, a script) is not run by
#: a browser under the gateway's origin, which is the admin's too.
_CONTAINED = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "default-src 'none'; sandbox"}


def copy_headers(upstream: aiohttp.ClientResponse, response: HttpResponse, extra: dict[str, str]) -> None:
    connection = ",".join(upstream.headers.getall("connection", []))
    for name, value in upstream.headers.items():
        if relayed_header(name, connection):
            try:
                response[name] = value
            except (UnicodeError, ValueError):  # bytes that are not text (surrogates), a newline
                log.warning("dropped upstream header %r: its value cannot be relayed", name)
    for name, value in {**extra, **_CONTAINED}.items():
        response[name] = value



# RFC 3986 query characters other than "%": unreserved, sub-delims, ":", "@", "/", "?".
_QUERY_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@/?")
_HEX = frozenset(b"0123456789abcdefABCDEF")


def client_query(request: HttpRequest) -> bytes:
    """The query string as the client sent it (ASGI ``scope["query_string"]``, without the
    ``?``), b"" when there is none."""
    scope = getattr(request, "scope", None)
    if isinstance(scope, dict) and isinstance(scope.get("query_string"), bytes):
        return scope["query_string"]
    return request.META.get("QUERY_STRING", "").encode("latin-1", "replace")


def upstream_url(url: str, query: bytes) -> str | URL:
    """``url`` with the client's query string, its bytes as sent: a value's percent-encoding
    is kept (``a%2Fb`` stays ``a%2Fb``, never decoded to ``a/b`` and re-encoded). Only bytes
    that may not appear in a query at all (space, quotes, ``#``, controls, non-ASCII, a
    ``%`` not followed by two hex digits) are percent-encoded, so nothing the client sends
    can end the request line or add a header. Shapes: ``("http://h:1/v1/completions",
    b"a=1")`` → ``URL("http://h:1/v1/completions?a=1")``; no query → ``url`` unchanged."""
    if not query:
        return url
    out = bytearray()
    for i, byte in enumerate(query):
        if byte in _QUERY_SAFE or (byte == 0x25 and query[i + 1:i + 2] and query[i + 2:i + 3]
                                   and query[i + 1] in _HEX and query[i + 2] in _HEX):
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return URL(f"{url}?{out.decode('ascii')}", encoded=True)


def what_broke(exc: BaseException) -> str:
    """An upstream failure in words for the client ("the connection was closed", "it did
    not answer within 600 s"), never a library's class name or an address (the log keeps
    those)."""
    if isinstance(exc, asyncio.TimeoutError):
        return f"it {timeout_words(exc)}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return connect_failure(exc)
    if isinstance(exc, UpstreamAnswerTooLarge) or type(exc).__name__ == "EventTooLarge":
        return "its answer was over the size limit"
    if type(exc).__name__ == "StreamEnded":
        return "its stream ended before the answer was complete"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "its answer was cut off"
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
        return "the connection was closed"
    return "the connection failed"
