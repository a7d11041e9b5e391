"""The stack's floor, for bench/gateway.py: the least an HTTP proxy written on llmgw's stack
(uvicorn with uvloop and httptools, aiohttp's client) can do per request, with none of llmgw.

A bare ASGI app, no framework: it reads the request body, POSTs it with the client's
``Authorization`` to one upstream (``LLMGW_FLOOR_UPSTREAM``, e.g.
``http://127.0.0.1:8001``) on one shared ``aiohttp.ClientSession`` configured as
``gateway.upstream.upstream_client``'s, and relays the answer: a JSON body whole, an event
stream chunk by chunk as aiohttp hands it over. No keys, no model, no routing, no usage, no
metrics, no error mapping, no disconnect watch.

Its CPU per request, measured in the same run as llmgw's, is what uvicorn, the event loop
and aiohttp cost on this machine by themselves; llmgw's figure minus it is what llmgw's own
work costs (its request object, keys, limits, routing, usage, metrics, relay checks).

    LLMGW_FLOOR_UPSTREAM=http://127.0.0.1:8001 uvicorn bench._floor_proxy:app --loop uvloop --http httptools
"""

from __future__ import annotations

import os

import aiohttp

UPSTREAM = os.environ.get("LLMGW_FLOOR_UPSTREAM", "http://127.0.0.1:8001").rstrip("/")
_client: aiohttp.ClientSession | None = None


def client() -> aiohttp.ClientSession:
    """The one upstream session (made on first use, on the server's loop)."""
    global _client
    if _client is None:
        _client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1000, limit_per_host=0, keepalive_timeout=4.0),
            timeout=aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=300.0),
            cookie_jar=aiohttp.DummyCookieJar(),
        )
    return _client


async def app(scope, receive, send):
    """Forward one HTTP request to ``UPSTREAM`` + its path; relay the answer."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if _client is not None:
                    await _client.close()
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    headers = {"content-type": "application/json"}
    for name, value in scope["headers"]:
        if name == b"authorization":
            headers["authorization"] = value.decode("latin-1")
    async with client().post(UPSTREAM + scope["path"], data=b"".join(chunks), headers=headers) as upstream:
        content_type = upstream.headers.get("content-type", "application/json").encode("latin-1")
        if b"text/event-stream" not in content_type:
            body = await upstream.read()
            await send({"type": "http.response.start", "status": upstream.status,
                        "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await send({"type": "http.response.start", "status": upstream.status,
                    "headers": [(b"content-type", content_type), (b"cache-control", b"no-cache")]})
        async for chunk in upstream.content.iter_any():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
