"""The ``/v1/`` proxy: parse, resolve the model, find (or wait for) a ready replica, relay.

Streaming answers pass through unbuffered (an async iterator over the upstream's raw
bytes); a client that disconnects cancels the upstream request, so the engine frees its
slot. A connection refused before any byte was sent is retried once on another replica.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref

import httpx
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from catalog.models import Model
from fleet.demand import want
from fleet.live import Endpoint, ModelStatus, usage, watcher
from gateway.errors import openai_error
from gateway.routing import choose

log = logging.getLogger(__name__)

_clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient]" = weakref.WeakKeyDictionary()
_FORWARDED_REQUEST_HEADERS = ("content-type", "accept", "openai-organization", "openai-project")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "server", "date"}


def upstream_client() -> httpx.AsyncClient:
    """One shared client per running event loop (clients are bound to their loop)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None or client.is_closed:
        client = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.LLMGW_UPSTREAM_READ_TIMEOUT_S, connect=settings.LLMGW_UPSTREAM_CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200),
        )
        _clients[loop] = client
    return client


class _Refused(Exception):
    """The replica refused the connection before any byte was sent."""


async def read_json_body(request: HttpRequest) -> dict | HttpResponse:
    limit = settings.LLMGW_MAX_BODY_BYTES
    try:
        declared = int(request.headers.get("Content-Length") or 0)
    except ValueError:
        return openai_error(400, "Content-Length is not a number.")
    if declared > limit:
        return openai_error(413, f"Request body of {declared} bytes is over the limit of {limit} bytes.", code="request_too_large")
    try:
        raw = request.body
    except RequestDataTooBig:
        return openai_error(413, f"Request body is over the limit of {limit} bytes.", code="request_too_large")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return openai_error(400, "The request body is not valid JSON.", code="invalid_json")
    if not isinstance(body, dict):
        return openai_error(400, "The request body must be a JSON object.", code="invalid_json")
    return body


async def proxy(request: HttpRequest, path: str) -> HttpResponse:
    """Serve one POST under /v1/."""
    started = time.monotonic()
    body = await read_json_body(request)
    if isinstance(body, HttpResponse):
        return body
    name = body.get("model")
    if not isinstance(name, str) or not name:
        return openai_error(400, "You must provide a model parameter.", code="missing_model", param="model")
    watcher.ensure_started()
    view = watcher.view if watcher.view.version else await watcher.refresh_now()
    if view.stopped:
        return openai_error(503, "The cluster is stopped by its operators; no model is being served.", code="system_stopped")
    model = await Model.aresolve(name)
    if model is None:
        return openai_error(404, f"The model '{name}' does not exist.", code="model_not_found", param="model")
    if model.is_external:
        return await _forward_external(request, model, path, body)
    found = await _find_replica(model)
    if isinstance(found, HttpResponse):
        return found
    return await _forward(request, model, path, found, started)


async def _find_replica(model: Model) -> Endpoint | HttpResponse:
    """A ready replica of ``model``, waiting for one while it is loading (cold start)."""
    view = watcher.view
    endpoints = view.routes.get(model.id)
    if endpoints:
        return choose(endpoints)
    status = view.status.get(model.id, ModelStatus())
    if not model.on_demand and status.coming_up == 0:
        return _unavailable(model, status)
    trust_after = time.monotonic()
    if model.on_demand:
        await sync_to_async(want)(model.id)
        trust_after = time.monotonic()
    timeout_s = view.cold_start_timeout_s
    log.info("holding a request for %s while it starts (up to %.0f s; view %d)", model.name, timeout_s, view.version)
    deadline = time.monotonic() + timeout_s
    watcher.holders += 1
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await watcher.wait_for_refresh(remaining)
            view = watcher.view
            endpoints = view.routes.get(model.id)
            if endpoints:
                return choose(endpoints)
            if view.stopped:
                return openai_error(503, "The cluster is stopped by its operators.", code="system_stopped")
            status = view.status.get(model.id, ModelStatus())
            if view.started_at >= trust_after and status.unservable:
                return _unavailable(model, status)
            if not model.on_demand and status.coming_up == 0 and view.started_at >= trust_after:
                return _unavailable(model, status)
    finally:
        watcher.holders -= 1
    retry_after = max(1, int(min(timeout_s, 30)))
    return openai_error(
        503,
        f"The model '{model.name}' is still loading (waited {timeout_s:.0f} s); retry shortly.",
        code="model_loading",
        headers={"Retry-After": str(retry_after)},
    )


def _unavailable(model: Model, status: ModelStatus) -> HttpResponse:
    reason = status.reason or "no replica is placed yet"
    return openai_error(503, f"No ready replica for '{model.name}': {reason}", code="model_unavailable",
                        headers={"Retry-After": "10"})


def _upstream_headers(request: HttpRequest) -> dict[str, str]:
    headers = {}
    for name in _FORWARDED_REQUEST_HEADERS:
        value = request.headers.get(name)
        if value:
            headers[name] = value
    headers.setdefault("content-type", "application/json")
    return headers


async def _open(url: str, content: bytes, headers: dict[str, str]) -> httpx.Response:
    client = upstream_client()
    req = client.build_request("POST", url, content=content, headers=headers)
    try:
        return await client.send(req, stream=True)
    except httpx.ConnectError as exc:
        raise _Refused(str(exc)) from exc


async def _forward(request: HttpRequest, model: Model, path: str, endpoint: Endpoint, started: float) -> HttpResponse:
    content = request.body
    headers = _upstream_headers(request)
    tried: set[int] = set()
    overhead_ms = (time.monotonic() - started) * 1000  # our own work before the upstream call
    while True:
        tried.add(endpoint.replica_id)
        usage.begin(endpoint.replica_id)
        try:
            upstream = await _open(f"{endpoint.url}/v1/{path}", content, headers)
            break
        except _Refused as exc:
            usage.end(endpoint.replica_id)
            log.warning("replica %s refused the connection: %s", endpoint.replica_id, exc)
            other = choose(watcher.view.routes.get(model.id, ()), exclude=tried)
            if other is None or len(tried) >= 2:
                return openai_error(502, f"The replica serving '{model.name}' is not reachable.", code="upstream_unreachable")
            endpoint = other
        except httpx.TimeoutException:
            usage.end(endpoint.replica_id)
            return openai_error(504, f"The replica serving '{model.name}' did not answer in time.", code="upstream_timeout")
        except httpx.HTTPError as exc:
            usage.end(endpoint.replica_id)
            return openai_error(502, f"The replica serving '{model.name}' failed: {exc}", code="upstream_error")
    return _relay(upstream, endpoint.replica_id, {"X-Llmgw-Replica": str(endpoint.replica_id),
                                                  "X-Llmgw-Overhead-Ms": f"{overhead_ms:.2f}"})


def _relay(upstream: httpx.Response, replica_id: int | None, extra: dict[str, str]) -> HttpResponse:
    async def stream():
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            log.warning("upstream stream broke: %s", exc)
        finally:
            await upstream.aclose()
            if replica_id is not None:
                usage.end(replica_id)

    response = StreamingHttpResponse(stream(), status=upstream.status_code,
                                     content_type=upstream.headers.get("content-type", "application/json"))
    for name, value in upstream.headers.items():
        if name.lower() not in _HOP_BY_HOP and name.lower() != "content-type":
            response[name] = value
    for name, value in extra.items():
        response[name] = value
    if "text/event-stream" in upstream.headers.get("content-type", ""):
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
    return response


async def _forward_external(request: HttpRequest, model: Model, path: str, body: dict) -> HttpResponse:
    headers = _upstream_headers(request)
    if model.external_api_key:
        headers["authorization"] = f"Bearer {model.external_api_key}"
    url = f"{model.external_base_url.rstrip('/')}/{path}"
    try:
        upstream = await _open(url, request.body, headers)
    except (_Refused, httpx.HTTPError) as exc:
        return openai_error(502, f"The external service for '{model.name}' is not reachable: {exc}", code="upstream_unreachable")
    return _relay(upstream, None, {"X-Llmgw-Replica": "external"})


async def list_models(request: HttpRequest) -> HttpResponse:
    """GET /v1/models: every model in the catalog, in OpenAI's list shape."""
    data = []
    async for model in Model.objects.order_by("name"):
        data.append({"id": model.name, "object": "model", "created": int(model.created_at.timestamp()),
                     "owned_by": "external" if model.is_external else "llmgw"})
    return HttpResponse(json.dumps({"object": "list", "data": data}), content_type="application/json")
