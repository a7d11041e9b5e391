"""The ``/v1/`` proxy: authenticate, parse, resolve the model, find (or wait for) a ready
replica, relay, record.

Order of answers: 413 / 408 (body too large or too slow: ``llmgw.limits``, before Django),
404 ``unknown_url`` (not exactly one of ``gateway.endpoints``: the view), 401 (key), 400
(JSON, ``model``), 503 ``system_stopped``, 404 ``model_not_found``, 403 (key not allowed
for the model), 404 ``unknown_url`` (the model does not serve that endpoint), 400 (the
body's shape, ``gateway.validation``), then the upstream's own status (429 stays 429), 502
for a replica that cannot be reached, 503 for a model with no replica (with the planner's
reason) or still loading. Only the client's ``Accept`` goes upstream (and, to an external
model that allows it, ``OpenAI-Organization`` / ``OpenAI-Project``); upstream response
headers that would act on the client under our origin are dropped (:func:`relayed_header`).

Streaming answers are relayed event by event without re-encoding (``gateway.sse``); a
client that disconnects cancels the upstream request, so the engine frees its slot. A
connection refused before any byte was sent is retried once on another ready replica.

No database on the hot path: keys and model names come from ``gateway.cache`` (loaded with
the routing table). Anything the cache cannot answer for sure — an unknown key or name, a
model with no ready replica, a key not allowed the model, an external model (its URL and
key apply at once) — is looked up in the database before answering. Upstream requests go
through one aiohttp session per event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import weakref

import aiohttp
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.utils import timezone

from llmgw import integers
from catalog.models import Model
from fleet import live
from fleet.live import Endpoint, ModelStatus
from gateway import cache, endpoints, held, metrics, sse, validation
from gateway.auth import Caller, authenticate, forbidden
from gateway.errors import openai_error
from gateway.routing import choose
from gateway.usage import usage_records

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
_STREAMABLE = ("chat/completions", "completions")


def upstream_client() -> aiohttp.ClientSession:
    """One shared session per running event loop (sessions are bound to their loop)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None or client.closed:
        client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1000, limit_per_host=0, keepalive_timeout=30.0),
            timeout=aiohttp.ClientTimeout(total=None, connect=settings.LLMGW_UPSTREAM_CONNECT_TIMEOUT_S,
                                          sock_read=settings.LLMGW_UPSTREAM_READ_TIMEOUT_S),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        _clients[loop] = client
    return client


class _Refused(Exception):
    """The replica refused the connection before any byte was sent."""


class UpstreamAnswerTooLarge(aiohttp.ClientPayloadError):
    """An upstream answer (or one event of a stream) over ``LLMGW_MAX_UPSTREAM_BODY_BYTES``."""


async def _read_bounded(upstream: aiohttp.ClientResponse) -> bytes:
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


class Exchange:
    """One request's bookkeeping: caller, model, timings, tokens; recorded once at the end."""

    def __init__(self, path: str) -> None:
        self.started = time.monotonic()
        self.path = path
        self.caller: Caller | None = None
        self.model_name = "unknown"
        self.model_label = "unknown"
        self.replica_id: int | None = None
        self.stream = False
        self.ttft_s: float | None = None
        self.overhead_s: float | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.content_chunks = 0
        self.recorded = False

    def note_usage(self, data: dict | None) -> None:
        """Take token counts from an answer's ``usage``; values that are not counts (an
        engine's or provider's "abc", -1, 1e30) are ignored, never stored."""
        if isinstance(data, dict) and isinstance(data.get("usage"), dict):
            usage_ = data["usage"]
            if (prompt := integers.count_or_none(usage_.get("prompt_tokens"))) is not None:
                self.prompt_tokens = prompt
            if (completion := integers.count_or_none(usage_.get("completion_tokens"))) is not None:
                self.completion_tokens = completion

    def finish(self, status: int) -> None:
        if self.recorded:
            return
        self.recorded = True
        total = time.monotonic() - self.started
        metrics.REQUESTS.labels(self.model_label, str(status)).inc()
        if self.model_label != "unknown":
            metrics.LATENCY.labels(self.model_label).observe(total)
            if self.ttft_s is not None:
                metrics.TTFT.labels(self.model_label).observe(self.ttft_s)
        if self.overhead_s is not None:
            metrics.OVERHEAD.observe(self.overhead_s)
        usage_records.add(
            at=timezone.now(), key_id=self.caller.key_id if self.caller else None, model_name=self.model_name[:128],
            replica_id=self.replica_id, path=self.path[:128], status=status, stream=self.stream,
            prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
            ttft_ms=None if self.ttft_s is None else self.ttft_s * 1000, total_ms=total * 1000,
            overhead_ms=None if self.overhead_s is None else self.overhead_s * 1000,
        )

    def answer(self, response: HttpResponse) -> HttpResponse:
        self.finish(response.status_code)
        return response


def _body_limit_error(request: HttpRequest) -> HttpResponse | None:
    limit = settings.LLMGW_MAX_BODY_BYTES
    try:
        declared = int(request.headers.get("Content-Length") or 0)
    except ValueError:
        return openai_error(400, "Content-Length is not a number.")
    if declared > limit:
        return openai_error(413, f"Request body of {declared} bytes is over the limit of {limit} bytes.",
                            code="request_too_large")
    return None


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: Python's extension, not the spec


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400: re-encoded it would become Infinity, which is not JSON
        raise ValueError(f"number {text} is out of range")
    return value


class _DuplicateName(ValueError):
    pass


def _unique_names(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object as a dict, refusing one that names a member twice: Python keeps the
    last value, other parsers (a provider's, an engine's) the first, so the gateway could
    check one ``model`` and the upstream serve another."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        twice = next(name for name, _ in pairs if name in seen or seen.add(name))
        raise _DuplicateName(twice)
    return obj


def _parse_body(request: HttpRequest) -> dict | HttpResponse:
    try:
        raw = request.body
    except RequestDataTooBig:
        return openai_error(413, f"Request body is over the limit of {settings.LLMGW_MAX_BODY_BYTES} bytes.",
                            code="request_too_large")
    try:
        body = json.loads(raw, parse_constant=_not_json, parse_float=_finite_float, object_pairs_hook=_unique_names)
    except _DuplicateName as exc:
        return openai_error(400, f"The request body names {json.dumps(str(exc))[:200]} twice in one object.",
                            code="invalid_json")
    except (ValueError, UnicodeDecodeError):
        return openai_error(400, "The request body is not valid JSON.", code="invalid_json")
    except RecursionError:
        return openai_error(400, "The request body is nested too deeply.", code="invalid_json")
    if not isinstance(body, dict):
        return openai_error(400, "The request body must be a JSON object.", code="invalid_json")
    # Before any field is used: a lone surrogate cannot be encoded (the database, the log, an
    # engine's UTF-8), so it is refused wherever it is (docs/architecture.md, "Gateway rules").
    if validation.has_surrogate_escape(raw) and (where := validation.lone_surrogate_path(body)) is not None:
        param, message, code = validation.lone_surrogate_problem(where)
        return openai_error(400, message, code=code, param=param)
    return body


async def proxy(request: HttpRequest, path: str) -> HttpResponse:
    """Serve one POST to the endpoint ``path`` (one of ``gateway.endpoints``, matched
    exactly by the view; the upstream URL is built from it)."""
    ex = Exchange(path)
    too_big = _body_limit_error(request)
    if too_big is not None:
        return ex.answer(too_big)
    live.current_view()  # starts this process's watcher on first use
    caller = await authenticate(request)
    if isinstance(caller, HttpResponse):
        return ex.answer(caller)
    ex.caller = caller
    body = _parse_body(request)
    if isinstance(body, HttpResponse):
        return ex.answer(body)
    name = body.get("model")
    if name is None or name == "":
        return ex.answer(openai_error(400, "You must provide a model parameter.", code="missing_model", param="model"))
    if not isinstance(name, str):
        return ex.answer(openai_error(400, f"Invalid type for 'model': expected a string, but got "
                                           f"{validation.kind_of(name)} instead.", code="invalid_type", param="model"))
    ex.model_name = name
    view = await live.fresh_view()
    if view.stopped:
        return ex.answer(openai_error(503, "The cluster is stopped by its operators; no model is being served.",
                                      code="system_stopped"))
    model: Model | cache.CachedModel | None = cache.model(name)
    if model is None or model.is_external or not caller.may_use(model.id) or not view.routes.get(model.id):
        model = await Model.aresolve(name)  # not sure from memory: ask the database
    if model is None:
        return ex.answer(openai_error(404, f"The model '{name}' does not exist.", code="model_not_found", param="model"))
    ex.model_label = model.name
    if not caller.may_use(model.id):
        return ex.answer(forbidden(model.name))
    if not endpoints.served_by(model, path):  # before any upstream call, and the external key
        return ex.answer(openai_error(404, f"The model '{model.name}' does not serve /v1/{path}.",
                                      code="unknown_url"))
    problem = validation.check(path, body)
    if problem is not None:
        param, message, code = problem
        return ex.answer(openai_error(400, message, code=code, param=param))
    generates = path in _STREAMABLE
    ex.stream = bool(body.get("stream")) and generates
    content, strip_usage = _upstream_body(body, request.body, ex.stream, generates and not model.is_external,
                                          model.default_max_tokens)
    headers = _upstream_headers(request, model)
    if model.is_external:
        if model.external_api_key:
            headers["authorization"] = f"Bearer {model.external_api_key}"
        url = f"{model.external_base_url.rstrip('/')}/{path}"
        ex.overhead_s = time.monotonic() - ex.started
        try:
            upstream = await _open(url, content, headers)
        except (_Refused, aiohttp.ClientError, asyncio.TimeoutError) as exc:
            # Its address (an internal host name, a port) is for the log, not the client.
            log.warning("external service for %s not reachable: %s", model.name, exc or type(exc).__name__)
            return ex.answer(openai_error(502, f"The external service for '{model.name}' is not reachable.",
                                          code="upstream_unreachable"))
        except asyncio.CancelledError:
            ex.finish(499)  # the client went away before the answer's headers
            raise
        return await _relay(upstream, ex, None, strip_usage, {"X-Llmgw-Replica": "external"})
    try:
        found = await _find_replica(model)
    except asyncio.CancelledError:
        ex.finish(499)  # the client went away while held (the server cancels the view)
        raise
    if isinstance(found, HttpResponse):
        return ex.answer(found)
    return await _forward(model, path, found, content, headers, ex, strip_usage)


def _positive_int(value) -> bool:
    return validation.is_integer(value) and value > 0  # 16.0 is a limit too


def _upstream_body(body: dict, raw: bytes, stream: bool, bound: bool,
                   default_max_tokens: int | None) -> tuple[bytes, bool]:
    """The request body to send upstream, and whether to strip the usage chunk again.

    Only what the client left out is added; otherwise its bytes go through untouched:

    * a stream gets ``stream_options.include_usage`` (so usage is recorded);
    * with ``bound`` (a generating request to a replica served here):
      ``max_completion_tokens`` alone is copied to ``max_tokens`` — llama-cpp-python's
      server ignores the newer name, and would generate until its context is full —; and
      when neither names a positive count, the model's ``default_max_tokens`` becomes
      ``max_tokens`` (0 or -1 mean "no limit" to llama.cpp). An unbounded request can hold
      a CPU replica for minutes."""
    patched: dict | None = None
    strip_usage = False
    if stream:
        options = body.get("stream_options")
        if not (isinstance(options, dict) and options.get("include_usage")):
            patched = dict(body)
            patched["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
            strip_usage = True
    if bound:
        given, newer = body.get("max_tokens"), body.get("max_completion_tokens")
        limit = None
        if not _positive_int(given) and _positive_int(newer):
            limit = newer
        elif not _positive_int(given) and default_max_tokens:
            limit = default_max_tokens
        if limit is not None:
            patched = dict(body) if patched is None else patched
            patched["max_tokens"] = limit
    return (raw if patched is None else json.dumps(patched).encode()), strip_usage


async def _find_replica(model: Model | cache.CachedModel) -> Endpoint | HttpResponse:
    """A ready replica of ``model``, holding the request while one may come (cold start):
    until a route appears, ``gateway.held.verdict`` answers from a refresh of the view, or
    the cold-start timeout runs out (503 ``model_loading``). docs/architecture.md,
    "Gateway rules": cold start."""
    view = live.current_view()
    endpoints = view.routes.get(model.id)
    if endpoints:
        return choose(endpoints)
    status = view.status.get(model.id, ModelStatus())
    early = held.verdict(model.name, model.on_demand, status, view, timezone.now())
    if early is not None:
        return early
    trust_after = time.monotonic()
    if model.on_demand:
        await _want(model.id)
        trust_after = time.monotonic()
    hold = held.hold_start(status, trust_after)
    timeout_s = view.cold_start_timeout_s
    log.info("holding a request for %s while it starts (up to %.0f s)", model.name, timeout_s)
    deadline = time.monotonic() + timeout_s
    metrics.HELD.inc()
    try:
        async with live.holding():
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                await live.wait_for_change(remaining)
                view = live.current_view()
                endpoints = view.routes.get(model.id)
                if endpoints:
                    return choose(endpoints)
                answer = held.verdict(model.name, model.on_demand, view.status.get(model.id, ModelStatus()), view,
                                      timezone.now(), hold)
                if answer is not None:
                    return answer
    finally:
        metrics.HELD.dec()
    retry_after = max(1, int(min(timeout_s, 30)))
    return openai_error(
        503,
        f"The model '{model.name}' is still loading (waited {timeout_s:.0f} s); retry shortly.",
        code="model_loading",
        headers={"Retry-After": str(retry_after)},
    )


#: Model id → the want in progress for it: concurrent held requests of a model share one
#: (one ``ModelState`` write and one pass request for a burst, not one each).
_wants: dict[int, asyncio.Future] = {}


async def _want(model_id: int) -> None:
    """``live.want_model`` for ``model_id``, joined by every request that asks while it
    runs; a request cancelled meanwhile (its client gone) leaves the want to the others."""
    loop = asyncio.get_running_loop()
    task = _wants.get(model_id)
    if task is None or task.done() or task.get_loop() is not loop:
        task = loop.create_task(sync_to_async(live.want_model)(model_id))
        _wants[model_id] = task

        def done(t: asyncio.Future, key: int = model_id) -> None:
            if _wants.get(key) is t:
                del _wants[key]
            if not t.cancelled():
                t.exception()  # retrieved: every waiter that is left raises it

        task.add_done_callback(done)
    await asyncio.shield(task)


def _upstream_headers(request: HttpRequest, model: Model | cache.CachedModel) -> dict[str, str]:
    """The client's headers that go upstream: ``Accept``; ``OpenAI-Organization`` and
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


async def _open(url: str, content: bytes, headers: dict[str, str]) -> aiohttp.ClientResponse:
    """The upstream's response, headers read, body not yet (the caller releases it)."""
    try:
        return await upstream_client().post(url, data=content, headers=headers, allow_redirects=False)
    except aiohttp.ClientConnectorError as exc:
        raise _Refused(str(exc)) from exc


async def _forward(model: Model | cache.CachedModel, path: str, endpoint: Endpoint, content: bytes, headers: dict[str, str],
                   ex: Exchange, strip_usage: bool) -> HttpResponse:
    tried: set[int] = set()
    ex.overhead_s = time.monotonic() - ex.started  # our own work before the upstream call
    while True:
        tried.add(endpoint.replica_id)
        live.begin_request(endpoint.replica_id)
        try:
            # The replica's engine key, never the client's credentials (docs/architecture.md,
            # "Gateway rules": external models; "Security": engine keys).
            upstream = await _open(f"{endpoint.url}/v1/{path}", content,
                                   {**headers, "authorization": f"Bearer {endpoint.key}"} if endpoint.key else headers)
            break
        except asyncio.CancelledError:
            # The client went away before the engine's headers (a non-streamed answer sends
            # them only when done): count the request out, or the replica never looks idle.
            live.end_request(endpoint.replica_id)
            ex.replica_id = endpoint.replica_id
            ex.finish(499)
            raise
        except _Refused as exc:
            live.end_request(endpoint.replica_id)
            log.warning("replica %s refused the connection: %s", endpoint.replica_id, exc)
            other = choose(live.current_view().routes.get(model.id, ()), exclude=tried)
            if other is None or len(tried) >= 2:
                return ex.answer(openai_error(502, f"The replica serving '{model.name}' is not reachable.",
                                              code="upstream_unreachable"))
            endpoint = other
        except asyncio.TimeoutError:
            live.end_request(endpoint.replica_id)
            return ex.answer(openai_error(504, f"The replica serving '{model.name}' did not answer in time.",
                                          code="upstream_timeout"))
        except aiohttp.ClientError as exc:
            live.end_request(endpoint.replica_id)
            log.warning("replica %s failed: %s", endpoint.replica_id, exc or type(exc).__name__)
            return ex.answer(openai_error(502, f"The replica serving '{model.name}' failed "
                                               f"({type(exc).__name__}).", code="upstream_error"))
    ex.replica_id = endpoint.replica_id
    return await _relay(upstream, ex, endpoint.replica_id, strip_usage, {
        "X-Llmgw-Replica": f"{endpoint.replica_id}@{endpoint.agent_name}",
        "X-Llmgw-Overhead-Ms": f"{ex.overhead_s * 1000:.2f}",
    })


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


def _copy_headers(upstream: aiohttp.ClientResponse, response: HttpResponse, extra: dict[str, str]) -> None:
    connection = ",".join(upstream.headers.getall("connection", []))
    for name, value in upstream.headers.items():
        if relayed_header(name, connection):
            try:
                response[name] = value
            except (UnicodeError, ValueError):  # bytes that are not text (surrogates), a newline
                log.warning("dropped upstream header %r: its value cannot be relayed", name)
    for name, value in {**extra, **_CONTAINED}.items():
        response[name] = value


def _engine_error(status: int, ex: Exchange, parsed, raw: bytes) -> HttpResponse:
    """An engine's error that is not in OpenAI's shape, in it (same status). Its own words
    are kept: SGLang's and older vLLM's ``{"object": "error", "message", "code"}``, a
    string ``error`` (Ollama and others), FastAPI's ``detail``; else the body's text."""
    message = code = None
    if isinstance(parsed, dict):
        for field in ("message", "error", "detail"):
            if isinstance(parsed.get(field), str) and parsed[field].strip():
                message = parsed[field].strip()
                break
        else:
            if parsed.get("detail") is not None:  # FastAPI's validation errors: a list
                message = json.dumps(parsed["detail"])
        code = parsed.get("code") if isinstance(parsed.get("code"), str) else None
    if message is None:
        message = raw.decode("utf-8", "replace").strip()
    message = message[:1000]
    if status == 404 and message in ("Not Found", ""):  # the web framework's: no such route
        return openai_error(404, f"The engine serving '{ex.model_label}' has no endpoint /v1/{ex.path}.",
                            code="unknown_endpoint")
    return openai_error(status, message or f"The engine serving '{ex.model_label}' answered {status}.",
                        code=code or "engine_error")


async def _relay(upstream: aiohttp.ClientResponse, ex: Exchange, replica_id: int | None, strip_usage: bool,
                 extra: dict[str, str]) -> HttpResponse:
    content_type = upstream.headers.get("content-type", "application/json")
    if "text/event-stream" not in content_type:
        read = False
        try:
            body = await _read_bounded(upstream)
            read = True
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            log.warning("upstream answer broke off: %s", exc or type(exc).__name__)
            return ex.answer(openai_error(502, f"The upstream answer broke off ({type(exc).__name__}).",
                                          code="upstream_error"))
        except asyncio.CancelledError:
            ex.finish(499)  # the client went away; closing the upstream tells the engine
            raise
        finally:
            if read:
                upstream.release()  # back to the pool
            else:
                upstream.close()  # drop the connection: the engine sees the request end
            if replica_id is not None:
                live.end_request(replica_id)
        ex.ttft_s = time.monotonic() - ex.started
        parsed = None
        if "json" in content_type:
            try:
                parsed = json.loads(body)
                ex.note_usage(parsed)
            except (ValueError, RecursionError):
                pass
        if upstream.status >= 400 and not (isinstance(parsed, dict) and isinstance(parsed.get("error"), dict)):
            # Not OpenAI's shape (FastAPI's {"detail": …}, a proxy's HTML page): put it in it.
            error = _engine_error(upstream.status, ex, parsed, body)
            _copy_headers(upstream, error, extra)
            return ex.answer(error)
        response = HttpResponse(body, status=upstream.status, content_type=content_type)
        _copy_headers(upstream, response, extra)
        return ex.answer(response)

    if ex.model_label != "unknown":
        metrics.IN_FLIGHT.labels(ex.model_label).inc()

    async def events():
        buffer = b""
        status = upstream.status
        complete_stream = False
        done_sent = False  # the client has the stream's last event: it may hang up now
        try:
            async for chunk in upstream.content.iter_any():
                if ex.ttft_s is None:
                    ex.ttft_s = time.monotonic() - ex.started
                buffer += chunk
                complete, buffer = sse.split_events(buffer)
                if len(buffer) > settings.LLMGW_MAX_UPSTREAM_BODY_BYTES:
                    raise UpstreamAnswerTooLarge(f"an event is over {settings.LLMGW_MAX_UPSTREAM_BODY_BYTES} bytes")
                out = []
                ends = False
                for event in complete:
                    if b'"usage"' in event:  # only these are parsed (usage, and the chunk to strip)
                        data = sse.event_json(event)
                        if data is not None and sse.is_usage_only(data):
                            ex.note_usage(data)
                            if strip_usage:
                                continue
                        elif data is not None and sse.has_content(data):
                            ex.content_chunks += 1
                    elif sse.may_have_content(event):
                        ex.content_chunks += 1
                    if (b"[DONE]" in event or b"event:" in event) and sse.is_done(event):
                        ends = True
                    out.append(event)
                if out:
                    yield b"".join(out)
                    done_sent = done_sent or ends  # handed to the server
            if buffer:
                yield buffer
            complete_stream = True
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            if not done_sent:
                # Nothing can be retried after the first byte: say so in the stream itself
                # (an OpenAI-shaped error event) rather than end it as if it were complete.
                log.warning("upstream stream broke: %s", exc)
                status = 502
                error = {"error": {"message": f"The engine's stream broke off ({type(exc).__name__}).",
                                   "type": "api_error",
                                   "param": None, "code": "upstream_stream_broken"}}
                yield b"data: " + json.dumps(error).encode() + b"\n\n"
            # else: the stream was whole ([DONE] sent); only the engine's goodbye was rough
        except (asyncio.CancelledError, GeneratorExit):
            if not done_sent:  # after [DONE], a client closing before the engine's EOF is done
                status = 499  # the client went away; closing the upstream tells the engine
            raise
        finally:
            if complete_stream:
                upstream.release()
            else:
                upstream.close()  # drop the connection: the engine sees the request cancelled
            if replica_id is not None:
                live.end_request(replica_id)
            if ex.model_label != "unknown":
                metrics.IN_FLIGHT.labels(ex.model_label).dec()
            if ex.completion_tokens is None and ex.content_chunks:
                # Engines that send no usage chunk (llama-cpp-python): one token per chunk.
                ex.completion_tokens = ex.content_chunks
            ex.finish(status)

    response = StreamingHttpResponse(events(), status=upstream.status, content_type=content_type)
    _copy_headers(upstream, response, extra)
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def _model_object(model: Model) -> dict:
    return {"id": model.name, "object": "model", "created": int(model.created_at.timestamp()),
            "owned_by": "external" if model.is_external else "llmgw"}


async def list_models(request: HttpRequest) -> HttpResponse:
    """GET /v1/models: every model in the catalog (that the key may use), OpenAI's shape."""
    caller = await authenticate(request)
    if isinstance(caller, HttpResponse):
        return caller
    data = []
    async for model in Model.objects.order_by("name"):
        if caller.may_use(model.id):
            data.append(_model_object(model))
    return HttpResponse(json.dumps({"object": "list", "data": data}), content_type="application/json")


async def retrieve_model(request: HttpRequest, name: str) -> HttpResponse:
    """GET /v1/models/NAME: the model called NAME (or an alias of it); 404 if there is
    none, 403 if the key may not use it."""
    caller = await authenticate(request)
    if isinstance(caller, HttpResponse):
        return caller
    model = await Model.aresolve(name)
    if model is None:
        return openai_error(404, f"The model '{name}' does not exist.", code="model_not_found", param="model")
    if not caller.may_use(model.id):
        return forbidden(model.name)
    return HttpResponse(json.dumps(_model_object(model)), content_type="application/json")
