"""No database on ``/v1/``'s hot path (issue 20): a warm request — to an external model, to a
model's ready replica, or to a model whose request was held until its replica came — runs no
SQL at all, counted on every connection of every thread while it is served through the real
ASGI app. The watcher's refresh (which loads the in-memory view) and the usage writer are
the only readers and writers, off the request. Edits and deletes of an external model still
apply, at the next refresh."""

from __future__ import annotations

import asyncio
import json
import threading
import traceback

import pytest
from asgiref.sync import sync_to_async
from channels.testing import HttpCommunicator
from django.db.backends import utils as db_utils

from catalog.models import Model
from gateway import cache  # noqa: F401 (registers its loader before the first refresh, as the web app does)
from gateway.models import ApiKey
from tests.replicas import serve
from tests.upstream import RecordingUpstream

pytestmark = [pytest.mark.django_db(transaction=True)]

#: Code that reads or writes off the request, on its own schedule: not the request's queries.
_BACKGROUND = ("fleet/live/watch.py", "fleet/control/usage.py", "gateway/usage.py", "gateway/cache.py")


class Queries:
    """Every SQL statement run while :meth:`counting`, from any thread, less those of the
    watcher's refresh and the usage writer (named by the code on the stack)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.on = False
        self.lock = threading.Lock()

    def install(self, monkeypatch) -> "Queries":
        original = db_utils.CursorWrapper._execute_with_wrappers
        queries = self

        def counted(wrapper, sql, params, many, executor):
            if queries.on:
                stack = "".join(traceback.format_stack(limit=40))
                if not any(name in stack for name in _BACKGROUND):
                    with queries.lock:
                        queries.seen.append((str(sql), stack))
            return original(wrapper, sql, params, many, executor)

        monkeypatch.setattr(db_utils.CursorWrapper, "_execute_with_wrappers", counted)
        return self

    def sql(self) -> list[str]:
        return [sql for sql, _ in self.seen]


async def _post(key: str, model: str, stream: bool = False) -> dict:
    from llmgw.asgi import application

    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "x"}], "stream": stream}).encode()
    communicator = HttpCommunicator(application, "POST", "/v1/chat/completions", body=body,
                                    headers=[(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                                             (b"authorization", f"Bearer {key}".encode())])
    await communicator.send_input({"type": "http.request", "body": body})
    start = await communicator.receive_output(30)
    answer = {"status": start["status"], "headers": start.get("headers", []), "body": b""}
    while True:  # a stream's last message may carry no body
        message = await communicator.receive_output(30)
        answer["body"] += message.get("body", b"")
        if not message.get("more_body"):
            break
    await communicator.wait(30)
    return answer


async def _served_without_queries(queries: Queries, key: str, name: str, times: int = 3) -> None:
    for stream in (False, True):
        for _ in range(times):
            queries.on = True
            try:
                answer = await _post(key, name, stream)
            finally:
                queries.on = False
            assert answer["status"] == 200, answer
    assert queries.sql() == [], "\n\n".join(stack for _, stack in queries.seen)


@pytest.fixture
def upstream():
    server = RecordingUpstream().start()
    yield server
    server.stop()


@pytest.fixture
async def flushed():
    yield
    from gateway.usage import usage_records

    await sync_to_async(usage_records.flush)()  # while this test's database exists (not at exit)


async def test_a_warm_external_request_runs_no_query_and_follows_an_edit_and_a_delete(
        watcher_cleanup, monkeypatch, upstream, flushed):
    second = RecordingUpstream().start()
    try:
        _, key = await sync_to_async(ApiKey.create_key)("hot")

        def external() -> Model:
            model = Model(name="ext", external_base_url=f"http://127.0.0.1:{upstream.port}/v1",
                          external_api_key="sk-first", min_replicas=0, max_replicas=0)
            model.full_clean()
            model.save()
            return model
        model = await sync_to_async(external)()
        await watcher_cleanup.refresh_now()
        assert (await _post(key, "ext"))["status"] == 200  # warm: the upstream's session is open

        queries = Queries().install(monkeypatch)
        await _served_without_queries(queries, key, "ext")
        assert {r["headers"]["authorization"] for r in upstream.requests} == {"Bearer sk-first"}

        # An edit of the URL and key applies at the next refresh, still with no query.
        await sync_to_async(Model.objects.filter(pk=model.pk).update)(
            external_base_url=f"http://127.0.0.1:{second.port}/v1", external_api_key="sk-second")
        await watcher_cleanup.refresh_now()
        before = len(upstream.requests)
        await _served_without_queries(queries, key, "ext", times=1)
        assert len(upstream.requests) == before
        assert {r["headers"]["authorization"] for r in second.requests} == {"Bearer sk-second"}

        # Deleted: the next request is a 404 (the cache no longer knows it; the database agrees).
        await sync_to_async(Model.objects.filter(pk=model.pk).delete)()
        await watcher_cleanup.refresh_now()
        answer = await _post(key, "ext")
        assert answer["status"] == 404 and b"model_not_found" in answer["body"], answer
    finally:
        second.stop()


async def test_a_warm_replica_request_runs_no_query(watcher_cleanup, monkeypatch, make_model, upstream, flushed):
    _, key = await sync_to_async(ApiKey.create_key)("hot")
    model = await sync_to_async(make_model)("local")
    await sync_to_async(serve)(model, upstream.port)
    await watcher_cleanup.refresh_now()
    answer = await _post(key, "local")
    assert answer["status"] == 200, answer
    headers = {name.lower(): value for name, value in answer["headers"]}
    assert headers.get(b"x-llmgw-replica", b"").split(b"@")[0].isdigit(), headers  # a replica's answer

    await _served_without_queries(Queries().install(monkeypatch), key, "local")


async def test_once_a_held_request_was_served_the_next_runs_no_query(
        watcher_cleanup, monkeypatch, make_model, upstream, flushed):
    from fleet.models import Replica

    _, key = await sync_to_async(ApiKey.create_key)("hot")
    model = await sync_to_async(make_model)("cold")
    replica = await sync_to_async(serve)(model, upstream.port)
    await sync_to_async(Replica.objects.filter(pk=replica.pk).update)(state="starting")  # coming up
    await watcher_cleanup.refresh_now()
    held = asyncio.ensure_future(_post(key, "cold"))
    await asyncio.sleep(0.3)
    assert not held.done()  # held: its replica is not ready yet
    await sync_to_async(Replica.objects.filter(pk=replica.pk).update)(state="ready")
    answer = await held
    assert answer["status"] == 200, answer  # served once its replica was ready

    await _served_without_queries(Queries().install(monkeypatch), key, "cold")



async def test_a_warm_request_makes_no_thread_hop(watcher_cleanup, monkeypatch, make_model, upstream, flushed):
    """Django's handler hops to a thread three times per request (request_started,
    request_finished, response.close); under ``/v1/`` none is made while the request
    signals ran within ``DB_HYGIENE_INTERVAL_S`` — and after an hour without them, one."""
    import time

    from asgiref import sync

    from llmgw.asgi import LeanASGIHandler

    _, key = await sync_to_async(ApiKey.create_key)("hot")
    model = await sync_to_async(make_model)("hops")
    await sync_to_async(serve)(model, upstream.port)
    await watcher_cleanup.refresh_now()
    assert (await _post(key, "hops"))["status"] == 200

    hops: list[str] = []
    original = sync.SyncToAsync.__call__

    async def counted(self, *args, **kwargs):
        stack = "".join(traceback.format_stack(limit=40))
        if not any(name in stack for name in _BACKGROUND):
            hops.append(getattr(self.func, "__qualname__", repr(self.func)))
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(sync.SyncToAsync, "__call__", counted)
    monkeypatch.setattr(LeanASGIHandler, "_hygiene_at", time.monotonic())
    for stream in (False, True):
        assert (await _post(key, "hops", stream))["status"] == 200
    assert hops == []
    monkeypatch.setattr(LeanASGIHandler, "_hygiene_at", time.monotonic() - 3600)
    assert (await _post(key, "hops"))["status"] == 200
    assert hops == ["_request_signals"]  # the connections' check, in the shared sync thread
