"""The lean handler's URL resolution (llmgw/asgi.py, issue 20): an endpoint's path is resolved
once per process, any other path every time and never remembered (the memory is bounded
whatever clients send), /metrics against the root URL map, and a 4xx is still logged as
Django logs it."""

from __future__ import annotations

import logging

import pytest
from channels.testing import HttpCommunicator
from django.test import RequestFactory

from gateway import views
from llmgw.asgi import RESOLVED_PATHS, V1_URLCONF, LeanASGIHandler, application


def resolve(handler: LeanASGIHandler, path: str, urlconf: str | None = V1_URLCONF):
    request = RequestFactory().post(path)
    if urlconf is not None:
        request.urlconf = urlconf
    return request, handler.resolve_request(request)


@pytest.fixture
def handler(monkeypatch):
    monkeypatch.setattr(LeanASGIHandler, "_resolved", {})
    return LeanASGIHandler()


def test_an_endpoint_is_resolved_once_and_gives_the_view_its_arguments(handler):
    request, first = resolve(handler, "/v1/chat/completions")
    assert first.func is views.v1 and first.kwargs == {"path": "chat/completions"}
    assert request.resolver_match is first
    request, again = resolve(handler, "/v1/chat/completions")
    assert again is first and request.resolver_match is first
    assert set(handler._resolved) == {"/v1/chat/completions"}
    _, models = resolve(handler, "/v1/models")
    assert models.func is views.models
    assert set(handler._resolved) <= RESOLVED_PATHS


def test_other_paths_are_resolved_every_time_and_never_remembered(handler):
    for n in range(50):
        _, match = resolve(handler, f"/v1/chat/completions/../{n}")
        assert match.func is views.v1 and match.kwargs == {"path": f"chat/completions/../{n}"}
        _, match = resolve(handler, f"/v1/models/model-{n}")
        assert match.func is views.model_detail and match.kwargs == {"name": f"model-{n}"}
    assert handler._resolved == {}


def test_metrics_is_resolved_against_the_root_url_map(handler):
    _, match = resolve(handler, "/metrics", urlconf=None)
    assert match.func is views.prometheus


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_refused_request_is_still_logged_as_django_logs_it(caplog):
    caplog.set_level(logging.WARNING, logger="django.request")
    communicator = HttpCommunicator(application, "GET", "/v1/no-such-thing", headers=[(b"host", b"127.0.0.1")])
    response = await communicator.get_response(timeout=30)
    assert response["status"] == 404
    assert b"unknown_url" in response["body"]
    assert any(r.name == "django.request" and "/v1/no-such-thing" in r.getMessage() for r in caplog.records)


def test_headers_from_the_scope_are_the_ones_django_builds():
    from django.core.handlers.asgi import ASGIRequest
    from django.http.request import HttpHeaders

    from llmgw.asgi import headers_of

    raw = [(b"host", b"gw.example"), (b"authorization", b"Bearer k"), (b"content-type", b"application/json"),
           (b"content-length", b"12"), (b"x-llmgw-priority", b"low"), (b"accept", b"a/b"), (b"accept", b"c/d"),
           (b"x_spoofed", b"dropped"), (b"X-Mixed-Case", b"v"), (b"x-latin", "é".encode("latin1")),
           (b"x-empty", b"")]
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": raw, "query_string": b""}
    django = HttpHeaders(ASGIRequest(scope, None).META)
    ours = headers_of(scope)
    assert list(ours.items()) == list(django.items())
    assert ours["Authorization"] == ours["authorization"] == "Bearer k"
    assert ours["Accept"] == "a/b,c/d" and "x_spoofed" not in ours and "X-Spoofed" not in ours
    assert ours.get("X_LLMGW_PRIORITY") == "low"  # Django's underscore lookup too


# --- the view in the request's own task, a listener cancelling it when the client leaves ----
from django.http import HttpResponse, StreamingHttpResponse  # noqa: E402
from django.urls import re_path  # noqa: E402

_seen: dict = {}


async def _slow_view(request, path):
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        _seen["cancelled"] = True
        raise
    return HttpResponse(b"late")


async def _stream_view(request, path):
    async def parts():
        try:
            yield b"first"
            await asyncio.sleep(30)
            yield b"never"
        finally:
            _seen["stream closed"] = True

    response = StreamingHttpResponse(parts())
    response._resource_closers.append(lambda: _seen.setdefault("closer ran", True))
    return response


urlpatterns = [re_path(r"^v1/slow$", _slow_view, {"path": "slow"}),
               re_path(r"^v1/stream$", _stream_view, {"path": "stream"})]


class _TestHandler(LeanASGIHandler):
    v1_urlconf = __name__
    _resolved: dict = {}


def _scope(path: str) -> dict:
    return {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "headers": [(b"host", b"127.0.0.1")], "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80)}


class _Client:
    """An ASGI client whose ``leave()`` makes the next receive() a disconnect."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.gone = asyncio.Event()
        self.first = True

    async def receive(self):
        if self.first:
            self.first = False
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await self.gone.wait()
        return self.after_body()

    def after_body(self) -> dict:
        """The message after the body, once the client is gone: its disconnect."""
        return {"type": "http.disconnect"}

    async def send(self, message):
        self.sent.append(message)


import asyncio  # noqa: E402


@pytest.mark.django_db(transaction=True)
async def test_a_client_leaving_cancels_the_view_and_the_request_ends_cleanly():
    _seen.clear()
    client = _Client()
    task = asyncio.ensure_future(_TestHandler()(_scope("/v1/slow"), client.receive, client.send))
    await asyncio.sleep(0.1)
    client.gone.set()
    await asyncio.wait_for(task, 5)  # no exception: a client leaving is not an error
    assert _seen == {"cancelled": True}
    assert client.sent == []  # nothing was answered to nobody
    assert task.cancelling() == 0


@pytest.mark.django_db(transaction=True)
async def test_a_client_leaving_during_a_stream_closes_it_and_runs_its_closers():
    _seen.clear()
    client = _Client()
    task = asyncio.ensure_future(_TestHandler()(_scope("/v1/stream"), client.receive, client.send))
    for _ in range(50):
        if any(m.get("body") == b"first" for m in client.sent):
            break
        await asyncio.sleep(0.02)
    client.gone.set()
    await asyncio.wait_for(task, 5)
    assert client.sent[0]["type"] == "http.response.start" and client.sent[0]["status"] == 200
    assert _seen == {"stream closed": True, "closer ran": True}


@pytest.mark.django_db(transaction=True)
async def test_the_server_cancelling_a_request_is_not_absorbed():
    _seen.clear()
    client = _Client()
    task = asyncio.ensure_future(_TestHandler()(_scope("/v1/slow"), client.receive, client.send))
    await asyncio.sleep(0.1)
    task.cancel()  # uvicorn's shutdown, say
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _seen == {"cancelled": True}


@pytest.mark.django_db(transaction=True)
async def test_a_server_cancel_is_answered_503_in_openais_shape_and_not_absorbed():
    import json

    _seen.clear()
    client = _Client()
    task = asyncio.ensure_future(_TestHandler()(_scope("/v1/slow"), client.receive, client.send))
    await asyncio.sleep(0.1)
    task.cancel()  # uvicorn's shutdown after its graceful timeout
    with pytest.raises(asyncio.CancelledError):
        await task
    start, body = client.sent
    assert start["status"] == 503 and (b"retry-after", b"1") in [(k.lower(), v) for k, v in start["headers"]]
    assert json.loads(body["body"])["error"]["code"] == "shutting_down"


class _LeavingAsTheServerCancels(_Client):
    """The server cancels the request (its shutdown) and the client's disconnect comes in
    the same turn of the loop, before the request's task runs again."""

    task: asyncio.Task | None = None

    def after_body(self) -> dict:
        self.task.cancel()
        return super().after_body()


@pytest.mark.django_db(transaction=True)
async def test_a_server_cancel_at_the_moment_the_client_leaves_is_not_absorbed():
    _seen.clear()
    client = _LeavingAsTheServerCancels()
    task = client.task = asyncio.ensure_future(_TestHandler()(_scope("/v1/slow"), client.receive, client.send))
    await asyncio.sleep(0.1)
    client.gone.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert _seen == {"cancelled": True}
    assert task.cancelling() == 1  # the server's cancel, still requested


async def _closing_view(request, path):
    await asyncio.sleep(0.05)  # the listener reads the next message meanwhile
    response = HttpResponse(b"ok")
    response._resource_closers.append(lambda: _seen.setdefault("closer ran", True))
    return response


urlpatterns.append(re_path(r"^v1/closing$", _closing_view, {"path": "closing"}))


class _Confused(_Client):
    """A server that breaks the protocol: a second request message right after the body."""

    def __init__(self) -> None:
        super().__init__()
        self.gone.set()

    def after_body(self) -> dict:
        return {"type": "http.request", "body": b"more", "more_body": False}


@pytest.mark.django_db(transaction=True)
async def test_an_unexpected_message_is_raised_after_the_response_is_closed():
    _seen.clear()
    client = _Confused()
    with pytest.raises(AssertionError, match="Invalid ASGI message"):
        await asyncio.wait_for(_TestHandler()(_scope("/v1/closing"), client.receive, client.send), 5)
    assert client.sent[0]["status"] == 200
    assert _seen == {"closer ran": True}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("method, path", [("GET", "/v1/models/a\nb"), ("POST", "/v1/chat\ncompletions")])
async def test_a_newline_in_a_path_is_answered_in_openais_shape(method, path):
    """``GET /v1/models/a%0Ab`` as uvicorn hands it over (decoded; test clients drop the newline)."""
    import json

    client = _Client()
    await asyncio.wait_for(application({**_scope(path), "method": method}, client.receive, client.send), 10)
    start, body = client.sent[0], client.sent[-1]
    assert start["status"] in (401, 404)  # the gateway's views, not Django's HTML 404
    assert json.loads(body["body"])["error"]["code"] in ("invalid_api_key", "missing_api_key", "unknown_url")
