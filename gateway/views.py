"""Thin async views for ``/v1/``; the work is in ``gateway.proxy``."""

from __future__ import annotations

import hmac

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from prometheus_client import CONTENT_TYPE_LATEST

from gateway import endpoints, proxy
from gateway.errors import openai_error
from llmgw import tokens
from llmgw.metrics import render


def method_not_allowed(allowed: str, message: str) -> HttpResponse:
    """405 in OpenAI's error shape with the ``Allow`` header RFC 9110 (section 15.5.6)
    requires: ``allowed`` is the one method the path takes (``"GET"`` or ``"POST"``)."""
    return openai_error(405, message, headers={"Allow": allowed})


@csrf_exempt
async def models(request: HttpRequest) -> HttpResponse:
    if request.method != "GET":
        return method_not_allowed("GET", "Use GET for /v1/models.")
    return await proxy.list_models(request)


@csrf_exempt
async def model_detail(request: HttpRequest, name: str) -> HttpResponse:
    """GET /v1/models/NAME (the openai SDK's ``models.retrieve``)."""
    if request.method != "GET":
        return method_not_allowed("GET", f"Use GET for /v1/models/{name}.")
    return await proxy.retrieve_model(request, name)


def unknown_url(request: HttpRequest) -> HttpResponse:
    """404 ``unknown_url`` in OpenAI's shape, naming the method and path (truncated)."""
    shown = request.path if len(request.path) <= 200 else request.path[:200] + "…"
    return openai_error(404, f"Unknown URL ({request.method} {shown}): the gateway serves POST "
                             f"{', '.join('/v1/' + e for e in endpoints.OPENAI_ENDPOINTS)} and GET /v1/models.", code="unknown_url")


@csrf_exempt
async def v1(request: HttpRequest, path: str) -> HttpResponse:
    """POST /v1/ENDPOINT: only an exact endpoint of :mod:`gateway.endpoints` reaches the
    proxy (and through it, upstream); any other path is 404 ``unknown_url``."""
    endpoint = endpoints.match_request(request)
    if endpoint is None:
        return unknown_url(request)
    if request.method != "POST":
        return method_not_allowed("POST", f"Use POST for /v1/{endpoint}.")
    return await proxy.proxy(request, endpoint)


async def not_found(request: HttpRequest, exception=None) -> HttpResponse:
    return openai_error(404, f"Unknown URL {request.path}.", code="unknown_url")


async def prometheus(request: HttpRequest) -> HttpResponse:
    """/metrics in Prometheus' text format; behind ``LLMGW_METRICS_TOKEN`` when it is set
    (401 without it). Answered while the database is away too, without the series read
    from it (``llmgw.metrics.render``)."""
    expected = settings.LLMGW_METRICS_TOKEN
    if expected:
        given = tokens.token_from_authorization(request.headers.get("Authorization"))
        if given is None or not hmac.compare_digest(given.encode(), expected.encode()):
            response = HttpResponse("Unauthorized: /metrics needs Authorization: Bearer <LLMGW_METRICS_TOKEN>\n",
                                    status=401, content_type="text/plain")
            response["WWW-Authenticate"] = "Bearer"
            return response

    return HttpResponse(await sync_to_async(render)(), content_type=CONTENT_TYPE_LATEST)
