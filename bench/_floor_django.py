"""Django's floor, for bench/gateway.py: llmgw's lean ``/v1/`` handler (``llmgw.asgi.LeanASGIHandler``:
Django's request, URL resolution, response and ASGI send, without middleware) in front of one
trivial async view that forwards to the upstream as ``bench/_floor_proxy.py`` does, and nothing
else of llmgw: no body limits, keys, model, routing, usage, metrics or relay checks.

Between the stack's floor (``bench/_floor_proxy.py``) and llmgw, its CPU per request is what
Django's request/response machinery costs on this machine; llmgw minus it is the gateway's own
work. Needs llmgw's settings (``DJANGO_SETTINGS_MODULE``); touches no database.

    LLMGW_FLOOR_UPSTREAM=http://127.0.0.1:8001 uvicorn bench._floor_django:app --loop uvloop --http httptools
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")

import django  # noqa: E402

django.setup()

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse  # noqa: E402
from django.urls import re_path  # noqa: E402

from bench._floor_proxy import UPSTREAM, client  # noqa: E402
from llmgw.asgi import LeanASGIHandler  # noqa: E402


async def forward(request: HttpRequest, path: str) -> HttpResponse:
    """POST the body to ``UPSTREAM`` + the path with the client's Authorization; relay."""
    headers = {"content-type": "application/json", "authorization": request.headers.get("Authorization", "")}
    upstream = await client().post(UPSTREAM + request.path, data=request.body, headers=headers)
    content_type = upstream.headers.get("content-type", "application/json")
    if "text/event-stream" not in content_type:
        body = await upstream.read()
        upstream.release()
        return HttpResponse(body, status=upstream.status, content_type=content_type)

    async def events():
        try:
            async for chunk in upstream.content.iter_any():
                yield chunk
        finally:
            upstream.release()

    return StreamingHttpResponse(events(), status=upstream.status, content_type=content_type)


urlpatterns = [re_path(r"^v1/(?P<path>.+)$", forward)]


class _FloorHandler(LeanASGIHandler):
    v1_urlconf = __name__
    _resolved: dict = {}


_handler = _FloorHandler()


async def app(scope, receive, send):
    """The lean handler for HTTP; the lifespan protocol answered with nothing to start."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    await _handler(scope, receive, send)
