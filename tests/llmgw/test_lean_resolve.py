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
