"""Token counts from engines' tokenizer endpoints (``gateway.tokenize``), against a small
aiohttp server on a real port that answers like llama-cpp-python, llama-server and vLLM
(one word = one token), and like broken ones."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.tokenize import TOKENIZE_PATHS, count_tokens, token_count, tokenize_body

KEY = "sk-engine-key"


def ids(text: str) -> list[int]:
    return list(range(100, 100 + len(text.split())))


class Engine:
    """Handlers that answer in each engine's shape and record what they were sent."""

    def __init__(self, tokenize_shape: str = "llama_server") -> None:
        self.tokenize_shape = tokenize_shape
        self.requests: list[dict] = []
        self.release = asyncio.Event()

    async def _record(self, request: web.Request) -> dict:
        body = await request.json()
        self.requests.append({"path": request.path, "body": body,
                              "authorization": request.headers.get("Authorization")})
        return body

    def _denied(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") != f"Bearer {KEY}"

    async def extras_tokenize(self, request: web.Request) -> web.Response:  # llama-cpp-python
        body = await self._record(request)
        if self._denied(request):
            return web.json_response({"detail": "Invalid API key"}, status=401)
        if not isinstance(body.get("input"), str):
            return web.json_response({"detail": [{"loc": ["body", "input"], "msg": "Field required"}]}, status=422)
        return web.json_response({"tokens": ids(body["input"])})

    async def extras_count(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        return web.json_response({"count": len(ids(body["input"]))})

    async def tokenize(self, request: web.Request) -> web.Response:  # llama-server or vLLM
        body = await self._record(request)
        if self.tokenize_shape == "vllm":
            if not isinstance(body.get("prompt"), str):
                return web.json_response({"object": "error", "message": "prompt: Field required"}, status=400)
            tokens = ids(body["prompt"])
            return web.json_response({"count": len(tokens), "max_model_len": 4096, "tokens": tokens})
        # llama-server: without "content" an empty list, which would read as 0 tokens.
        return web.json_response({"tokens": ids(body["content"]) if "content" in body else []})

    async def pieces(self, request: web.Request) -> web.Response:  # llama-server with_pieces
        body = await self._record(request)
        return web.json_response({"tokens": [{"id": i, "piece": "w"} for i in ids(body["content"])]})

    async def broken(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.Response(status=500, text="Internal Server Error")

    async def not_json(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.Response(text="<html>tokens</html>", content_type="text/html")

    async def odd(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"tokens": "many", "count": -4})

    async def slow(self, request: web.Request) -> web.Response:
        await self._record(request)
        await self.release.wait()
        return web.json_response({"tokens": [1]})


@pytest.fixture
async def engine_server():
    servers = []

    async def start(shape: str = "llama_server") -> tuple[Engine, str]:
        engine = Engine(shape)
        app = web.Application()
        app.router.add_post("/extras/tokenize", engine.extras_tokenize)
        app.router.add_post("/extras/tokenize/count", engine.extras_count)
        app.router.add_post("/tokenize", engine.tokenize)
        app.router.add_post("/pieces", engine.pieces)
        app.router.add_post("/broken", engine.broken)
        app.router.add_post("/not-json", engine.not_json)
        app.router.add_post("/odd", engine.odd)
        app.router.add_post("/slow", engine.slow)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append((server, engine))
        return engine, str(server.make_url("")).rstrip("/")

    yield start
    for server, engine in servers:
        engine.release.set()
        await server.close()


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as client:
        yield client


async def test_llama_cpp_python_is_asked_with_input_and_the_key(engine_server, session):
    engine, url = await engine_server()
    count = await count_tokens(session, url, KEY, TOKENIZE_PATHS["llama_cpp_python"], "how many tokens here")
    assert count == 4
    assert engine.requests == [{"path": "/extras/tokenize", "body": {"input": "how many tokens here"},
                                "authorization": f"Bearer {KEY}"}]


async def test_llama_cpp_pythons_count_endpoint_is_read_too(engine_server, session):
    _, url = await engine_server()
    assert await count_tokens(session, url, KEY, "/extras/tokenize/count", "one two three") == 3


async def test_llama_server_is_asked_with_content(engine_server, session):
    engine, url = await engine_server("llama_server")
    assert await count_tokens(session, url + "/", None, "/tokenize", "a b c d e", engine="llama_server") == 5
    assert engine.requests[0]["body"] == {"content": "a b c d e"}
    assert engine.requests[0]["authorization"] is None  # no key, no header


async def test_vllm_is_asked_with_prompt_and_its_count_is_read(engine_server, session):
    engine, url = await engine_server("vllm")
    assert await count_tokens(session, url, KEY, "/tokenize", "x y", engine="vllm") == 2
    assert engine.requests[0]["body"] == {"prompt": "x y"}


@pytest.mark.parametrize("shape", ["llama_server", "vllm"])
async def test_a_bare_tokenize_path_works_for_both_engines_that_share_it(engine_server, session, shape):
    engine, url = await engine_server(shape)
    assert await count_tokens(session, url, KEY, "/tokenize", "p q r") == 3
    assert engine.requests[0]["body"] == {"content": "p q r", "prompt": "p q r"}


async def test_tokens_as_pieces_are_counted(engine_server, session):
    _, url = await engine_server()
    assert await count_tokens(session, url, KEY, "/pieces", "a b") == 2


async def test_empty_text_is_zero_without_a_request(engine_server, session):
    engine, url = await engine_server()
    assert await count_tokens(session, url, KEY, "/tokenize", "") == 0
    assert engine.requests == []


@pytest.mark.parametrize("path, key", [
    ("/extras/tokenize", "sk-wrong"),  # 401
    ("/broken", KEY),  # 500
    ("/not-json", KEY),
    ("/odd", KEY),
    ("/missing", KEY),  # 404
])
async def test_a_failing_tokenizer_gives_none(engine_server, session, path, key):
    engine, url = await engine_server()
    assert await count_tokens(session, url, key, path, "some words") is None
    assert len(engine.requests) == (0 if path == "/missing" else 1)


async def test_a_tokenizer_that_does_not_answer_in_time_gives_none(engine_server, session):
    engine, url = await engine_server()
    started = asyncio.get_running_loop().time()
    assert await count_tokens(session, url, KEY, "/slow", "words", timeout_s=0.3) is None
    assert asyncio.get_running_loop().time() - started < 20  # bounded by the timeout, not the engine
    assert len(engine.requests) == 1


async def test_an_engine_that_is_not_listening_gives_none(session):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert await count_tokens(session, f"http://127.0.0.1:{port}", KEY, "/tokenize", "words") is None


async def test_a_base_url_that_is_no_url_gives_none(session):
    assert await count_tokens(session, "not a url", KEY, "/tokenize", "words") is None


@pytest.mark.parametrize("answer, count", [
    ({"tokens": [1, 2, 3]}, 3), ({"count": 7, "tokens": [1]}, 7), ({"count": True, "tokens": [1, 2]}, 2),
    ({"count": -1}, None), ({"tokens": None}, None), ([1, 2], None), ("3", None),
])
def test_token_count_reads_only_counts(answer, count):
    assert token_count(answer) == count


@pytest.mark.parametrize("path, engine, body", [
    ("/extras/tokenize", None, {"input": "t"}), ("/extras/tokenize/count", "vllm", {"input": "t"}),
    ("/tokenize", "llama_server", {"content": "t"}), ("/tokenize", "vllm", {"prompt": "t"}),
    ("/tokenize", None, {"content": "t", "prompt": "t"}),
])
def test_the_body_follows_the_path(path, engine, body):
    assert tokenize_body(path, "t", engine) == body
