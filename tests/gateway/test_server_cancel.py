"""A request the server cancels (uvicorn's shutdown, once its graceful timeout has passed)
is not a client that left: before its answer began, the client is answered 503
``shutting_down`` in OpenAI's shape (``llmgw.asgi``), the request is recorded 503 rather
than 499, and it is counted out of flight. A client that leaves is still 499."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from asgiref.sync import sync_to_async

from gateway import cache  # noqa: F401 (registers its loader, as the web app does)
from gateway import metrics
from gateway.models import ApiKey
from tests.asgi import chat_request
from tests.replicas import serve

pytestmark = [pytest.mark.django_db(transaction=True)]


class SlowEngine:
    """An engine whose answers take forever; ``asked`` is set when a request reaches it."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()

    async def chat(self, request: web.Request) -> web.Response:
        await request.json()
        self.asked.set()
        await asyncio.sleep(3600)
        return web.json_response({})


def answered(model: str, status: str) -> float:
    return metrics.REQUESTS.labels(model, status)._value.get()


def gauge(model: str) -> float:
    return metrics.IN_FLIGHT.labels(model)._value.get()


@pytest.mark.parametrize("how", ["server cancels", "client leaves"])
async def test_a_request_the_server_cancels_is_answered_and_recorded_503_not_499(watcher_cleanup, make_model, how):
    from gateway.upstream import upstream_client
    engine = SlowEngine()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", engine.chat)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    name = "stopping" if how == "server cancels" else "left"
    try:
        _, key = await sync_to_async(ApiKey.create_key)("shutdown")
        model = await sync_to_async(make_model)(name)
        await sync_to_async(serve)(model, server.port)
        await watcher_cleanup.refresh_now()
        before = {status: answered(name, status) for status in ("499", "503")}
        body = json.dumps({"model": name, "messages": [{"role": "user", "content": "x"}]}).encode()
        client = chat_request(key)
        await client.send_input({"type": "http.request", "body": body})
        await asyncio.wait_for(engine.asked.wait(), 10)
        if how == "server cancels":
            client.future.cancel()
            with pytest.raises(asyncio.CancelledError):
                await client.future
            start = client.output_queue.get_nowait()
            sent = client.output_queue.get_nowait()
            assert start["status"] == 503
            assert json.loads(sent["body"])["error"]["code"] == "shutting_down"
        else:
            await client.send_input({"type": "http.disconnect"})
            await client.wait(10)
            assert client.output_queue.empty()  # nobody to answer
        await asyncio.sleep(0.1)
        expected = "503" if how == "server cancels" else "499"
        other = "499" if expected == "503" else "503"
        assert answered(name, expected) == before[expected] + 1
        assert answered(name, other) == before[other]
        assert gauge(name) == 0
    finally:
        await server.close()
        await upstream_client().close()
