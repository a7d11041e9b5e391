"""``llmgw_requests_in_flight`` must come back to 0 however a request ends once its upstream
call began (``Exchange.note_overhead`` .. ``Exchange.finish``).

A stream that the engine ends before its first event is asked again without a stream
(``gateway.calls.probe``). A client that hung up while that probe waited for the engine's
answer cancelled the view: the CancelledError went up through ``relay`` -> ``forward`` ->
``proxy``, whose ``except BaseException`` finished only requests with admitted counters, a
queue slot or a replica count — so the gauge stayed at 1 for good and no 499 was recorded.
It finishes any request counted in flight now."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from asgiref.sync import sync_to_async

from gateway import cache  # noqa: F401 (registers its loader, as the web app does)
from gateway.models import ApiKey
from gateway import metrics
from tests.asgi import chat_request
from tests.replicas import serve

pytestmark = [pytest.mark.django_db(transaction=True)]


class EmptyStreamThenSlowAnswer:
    """An engine whose streams end before their first event (what llama-cpp-python does for
    a prompt over its context) and whose non-streamed answers take forever."""

    def __init__(self) -> None:
        self.probed = asyncio.Event()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write_eof()
            return response
        self.probed.set()
        await asyncio.sleep(3600)
        return web.json_response({})


def gauge(model: str) -> float:
    return metrics.IN_FLIGHT.labels(model)._value.get()


def answered(model: str, status: str) -> float:
    return metrics.REQUESTS.labels(model, status)._value.get()


async def test_a_client_leaving_while_an_empty_stream_is_probed_is_counted_out_of_flight(
        watcher_cleanup, make_model):
    engine = EmptyStreamThenSlowAnswer()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", engine.chat)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        _, key = await sync_to_async(ApiKey.create_key)("leak")
        model = await sync_to_async(make_model)("probed")
        await sync_to_async(serve)(model, server.port)
        await watcher_cleanup.refresh_now()
        before_499 = answered("probed", "499")

        body = json.dumps({"model": "probed", "stream": True,
                           "messages": [{"role": "user", "content": "x"}]}).encode()
        client = chat_request(key)
        await client.send_input({"type": "http.request", "body": body})
        await asyncio.wait_for(engine.probed.wait(), 10)  # the probe is waiting for the engine
        assert gauge("probed") == 1
        await client.send_input({"type": "http.disconnect"})  # the client hangs up
        await client.wait(10)
        await asyncio.sleep(0.1)
        assert gauge("probed") == 0, "llmgw_requests_in_flight leaked: the request left is still counted"
        assert answered("probed", "499") == before_499 + 1, "the request the client left was never recorded"
    finally:
        await server.close()
        from gateway.upstream import upstream_client
        await upstream_client().close()
