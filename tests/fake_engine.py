"""Fake OpenAI-compatible LLM engine, run by tests as a real separate process.

    python tests/fake_engine.py --port 8011 [--tokens 16] [--token-delay-ms 50] ...

Standard library only (asyncio + a tiny hand-written HTTP/1.1 server with
keep-alive), so it starts in a few tens of milliseconds.

Endpoints: GET /v1/models, GET /health, GET /metrics (per --metrics-kind),
POST /v1/chat/completions, POST /v1/completions (both with SSE streaming),
POST /v1/embeddings.  Everything else is a 404 as FastAPI apps answer it (vLLM,
llama-cpp-python): {"detail": "Not Found"}, not OpenAI's shape.

Output is --tokens tokens "tok0 tok1 ..." (or the characters of --text),
capped by the request's max_tokens.  --capacity limits concurrent requests
(the rest wait and show as "waiting" in /metrics), --fail-status makes every
POST fail, --record appends JSON lines (request / completed / cancelled),
--exit-after-s simulates a crash, and SIGTERM exits 0 at once.

--api-key K (as vLLM's --api-key): every request without ``Authorization: Bearer K`` is
answered 401, health and metrics included. --dump-env PATH writes the environment it was
started with (JSON) to PATH.

For the agent's identity and restart tests: --term-delay-s S exits only S seconds after
SIGTERM (an engine slow to stop; SIGKILL still ends it), --stay-on-bind-error keeps running,
listening nowhere, when its port is taken (an engine that cannot bind and does not exit).

For the soak (tests/soak.py): --echo-pid puts ``system_fingerprint: fake-engine-pid-PID``
in completions (chunks too), naming the process that answered.

For error mapping and the engines' quirks (issue 15; gateway/engine_errors.py):
--error-status S --error-body TEXT|@FILE [--error-content-type T] answers every inference POST
with status S and exactly that body (tests/fixtures/engine_errors/ has real ones);
--fastapi-422 answers 422 with FastAPI's validation ``detail`` list for max_tokens, as vLLM
and llama-cpp-python do; by default ``n`` is ignored (one choice, as llama-cpp-python does),
--honor-n returns n choices (as vLLM does); --no-usage-chunk never sends the usage chunk,
even when stream_options.include_usage asks for it; --cancel-log PATH (or the environment's
FAKE_ENGINE_CANCEL_LOG) watches the socket of a non-streamed request while it "generates"
(--token-delay-ms per token) and appends a JSON line "cancelled" (the client closed first)
or "completed" to PATH.

A prefill model, for the prefix-routing benchmark (issue 17; bench/prefix_routing.py), off by
default: --prefill-ms-per-token X makes a chat or completions request wait X ms for each
prompt token it must evaluate before its first token (after it got its turn: with
--capacity 1 one request is served at a time, as llama-cpp-python does), and
--prompt-cache-slots N keeps the last N prompts evaluated (LRU, per process = per replica).
Tokens are whitespace words of the prompt (as usage and /extras/tokenize count them; a chat
prompt is its messages' contents). A request evaluates its tokens beyond the longest common
prefix with any cached prompt (at least one, as an engine always computes the last token's
logits); then it replaces that cached prompt when they share at least half of it (a slot
reused, as llama-server's --slot-prompt-similarity 0.5 does), else it is added, the least
recently used dropped beyond N. /metrics (served with either option even under
--metrics-kind none) counts ``fake:prompt_tokens_evaluated_total`` and
``fake:prompt_tokens_cached_total``; --record writes a "prefill" event per request.
"""
import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import os
import signal
import struct
import sys
import time
import uuid
from collections import OrderedDict

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 422: "Unprocessable Entity",
           429: "Too Many Requests", 500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}
TOOL_ARGS = ['{"city', '": "', 'Par', 'is"}']  # joined: {"city": "Paris"}
INFERENCE_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")


class ClientGone(Exception):
    """The client closed the connection while we were streaming."""


def dumps(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def error_body(message, type_, code):
    return {"error": {"message": message, "type": type_, "code": code}}


class Engine:
    def __init__(self, args):
        self.args = args
        self.sem = asyncio.Semaphore(args.capacity) if args.capacity > 0 else None
        self.running = 0
        self.waiting = 0
        #: The prefill model's prompt cache (word tuples, least recently used first) and counters.
        self.prompt_cache: OrderedDict[tuple[str, ...], None] = OrderedDict()
        self.prompt_tokens_evaluated = 0
        self.prompt_tokens_cached = 0

    @property
    def models_prefill(self) -> bool:
        """Whether the prefill model is on (--prefill-ms-per-token or --prompt-cache-slots)."""
        return bool(self.args.prefill_ms_per_token or self.args.prompt_cache_slots)

    # ---------------------------------------------------------------- helpers
    def record(self, event, **fields):
        if self.args.record:
            with open(self.args.record, "a", encoding="utf-8") as f:
                f.write(json.dumps({"event": event, **fields}) + "\n")

    def pieces(self, max_tokens):
        """Return (list of output pieces, finish_reason)."""
        a = self.args
        pieces = list(a.text) if a.text is not None else [f"tok{i} " for i in range(a.tokens)]
        if a.piece_bytes:  # big chunks: enough of them fill every socket buffer on the way
            pieces = [p + "x" * a.piece_bytes for p in pieces]
        if isinstance(max_tokens, int) and 0 <= max_tokens < len(pieces):
            return pieces[:max_tokens], "length"
        return pieces, "stop"

    # ------------------------------------------------------------ connection
    async def handle_conn(self, reader, writer):
        try:
            while True:
                req = await read_request(reader, writer)
                if req is None:
                    break
                method, path, headers, body = req
                keep = headers.get("connection", "").lower() != "close"
                self.authorization = headers.get("authorization", "")
                self.content_type = headers.get("content-type", "")
                keep = await self.dispatch(method, path, body, reader, writer, keep) and keep
                if not keep:
                    break
        except (ConnectionError, OSError, asyncio.IncompleteReadError, ValueError, ClientGone):
            pass
        finally:
            try:
                writer.close()
            except Exception:
                pass

    async def dispatch(self, method, path, body, reader, writer, keep):
        """Serve one request; returns False when the connection must close."""
        path = path.split("?", 1)[0]
        name = self.args.served_name
        if self.args.api_key and not hmac.compare_digest(
                getattr(self, "authorization", "").encode(), f"Bearer {self.args.api_key}".encode()):
            self.record("refused", path=path, method=method, authorization=getattr(self, "authorization", ""))
            return await send_json(writer, 401, error_body("Invalid API key", "invalid_request_error",
                                                           "invalid_api_key"), keep)
        if method == "GET" and path == "/v1/models":
            data = {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "fake",
                                                "created": int(time.time())}]}
            return await send_json(writer, 200, data, keep)
        if method == "GET" and path == "/health":
            return await send_json(writer, 200, {"status": "ok"}, keep)
        if method == "GET" and path == "/metrics" and (self.args.metrics_kind != "none" or self.models_prefill):
            return await send(writer, 200, self.metrics_text().encode(),
                              "text/plain; version=0.0.4; charset=utf-8", keep)
        if method == "POST" and path == "/extras/tokenize":  # llama-cpp-python's tokenizer: a token per word
            try:
                text = json.loads(body or b"{}").get("input", "")
            except (ValueError, AttributeError):
                text = ""
            self.record("tokenize", path=path, input=text)
            return await send_json(writer, 200, {"tokens": list(range(len(str(text).split())))}, keep)
        if method != "POST" or path not in INFERENCE_PATHS:
            return await send_json(writer, 404, {"detail": "Not Found"}, keep)
        try:
            req = json.loads(body or b"{}")
            if not isinstance(req, dict):
                raise ValueError("body must be a JSON object")
        except ValueError as e:
            return await send_json(writer, 400, error_body(
                f"invalid JSON body: {e}", "invalid_request_error", 400), keep)
        stream = bool(req.get("stream"))
        self.record("request", path=path, model=req.get("model"), stream=stream,
                    authorization=getattr(self, "authorization", ""),
                    content_type=getattr(self, "content_type", ""),
                    stream_options=req.get("stream_options"), max_tokens=req.get("max_tokens"),
                    max_completion_tokens=req.get("max_completion_tokens"), n=req.get("n"),
                    roles=[m.get("role") for m in req.get("messages") or [] if isinstance(m, dict)],
                    contents=[m.get("content") for m in req.get("messages") or [] if isinstance(m, dict)],
                    prompt=req.get("prompt"), echo=req.get("echo"))
        if self.args.fail_status:
            code = self.args.fail_status
            return await send_json(writer, code, error_body("fake failure", "fake", code), keep)
        if self.args.error_status:  # a given engine's own error answer, byte for byte
            return await send(writer, self.args.error_status, error_bytes(self.args.error_body),
                              self.args.error_content_type, keep)
        if self.args.fail_in_stream:
            if stream:  # the answer has begun when the engine finds out
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked"
                             b"\r\nConnection: close\r\n\r\n0\r\n\r\n")
                await writer.drain()
                return False
            return await send_json(writer, 400, {"error": {
                "message": "This model's maximum context length is 512 tokens. However, you requested 900 tokens "
                           "(900 in the messages, 0 in the completion).", "type": "invalid_request_error",
                "param": "messages", "code": "context_length_exceeded"}}, keep)
        if self.args.fastapi_422:
            return await send_json(writer, 422, {"detail": [{
                "type": "int_parsing", "loc": ["body", "max_tokens"],
                "msg": "Input should be a valid integer, unable to parse string as an integer",
                "input": req.get("max_tokens")}]}, keep)
        self.waiting += 1
        try:
            if self.sem:
                await self.sem.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            if self.models_prefill and path != "/v1/embeddings":
                await self.prefill(path, req)
            if path == "/v1/embeddings":
                ok = await send_json(writer, 200, self.embeddings(req), keep)
            elif stream:
                ok = await self.stream(path, req, reader, writer)
            else:
                ok = await self.complete(path, req, reader, writer, keep)
            self.record("completed", path=path)
            return ok
        except (ConnectionError, OSError, ClientGone):
            self.record("cancelled", path=path)
            raise
        finally:
            self.running -= 1
            if self.sem:
                self.sem.release()

    def prefill_cost(self, words: tuple[str, ...]) -> tuple[int, int]:
        """``(evaluated, cached)`` prompt tokens of a prompt of ``words`` against the prompt
        cache, which it then updates (the module's rules): evaluated = its tokens beyond the
        longest common prefix with a cached prompt, at least 1; cached = the rest."""
        best, best_common = None, 0
        for cached in self.prompt_cache:
            common = 0
            for a, b in zip(cached, words):
                if a != b:
                    break
                common += 1
            if common > best_common:
                best, best_common = cached, common
        evaluated = max(1, len(words) - best_common)
        slots = self.args.prompt_cache_slots
        if slots > 0:
            if best is not None and 2 * best_common >= len(best):
                del self.prompt_cache[best]
            self.prompt_cache.pop(words, None)
            self.prompt_cache[words] = None
            while len(self.prompt_cache) > slots:
                self.prompt_cache.popitem(last=False)
        return evaluated, max(0, len(words) - evaluated)

    async def prefill(self, path, req):
        """The prefill model: wait --prefill-ms-per-token for each prompt token evaluated,
        count it, record a "prefill" event."""
        words = tuple(self.prompt_text(path, req).split())
        evaluated, cached = self.prefill_cost(words)
        self.prompt_tokens_evaluated += evaluated
        self.prompt_tokens_cached += cached
        self.record("prefill", path=path, prompt_tokens=len(words), evaluated=evaluated, cached=cached,
                    cache_entries=len(self.prompt_cache))
        if self.args.prefill_ms_per_token:
            await asyncio.sleep(evaluated * self.args.prefill_ms_per_token / 1000)

    def prefill_metrics(self) -> list[str]:
        out = []
        for name, value, help_ in (
                ("fake:prompt_tokens_evaluated_total", self.prompt_tokens_evaluated, "prompt tokens evaluated"),
                ("fake:prompt_tokens_cached_total", self.prompt_tokens_cached, "prompt tokens found in the cache")):
            out += [f"# HELP {name} fake engine: {help_}", f"# TYPE {name} counter", f"{name} {value}"]
        out += ["# HELP fake:prompt_cache_entries fake engine: prompts in the cache",
                "# TYPE fake:prompt_cache_entries gauge", f"fake:prompt_cache_entries {len(self.prompt_cache)}"]
        return out

    def metrics_text(self):
        kind, name = self.args.metrics_kind, self.args.served_name
        if kind == "none":  # only the prefill model's counters (dispatch serves none otherwise)
            return "\n".join(self.prefill_metrics()) + "\n"
        label = f'{{model_name="{name}"}}'
        running, waiting = {
            "vllm": ("vllm:num_requests_running" + label, "vllm:num_requests_waiting" + label),
            "sglang": ("sglang:num_running_reqs" + label, "sglang:num_queue_reqs" + label),
            "llamacpp": ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
        }[kind]
        out = []
        for metric, value in ((running, self.running), (waiting, self.waiting)):
            base = metric.split("{", 1)[0]
            out += [f"# HELP {base} fake engine gauge", f"# TYPE {base} gauge", f"{metric} {value}"]
        if self.models_prefill:
            out += self.prefill_metrics()
        return "\n".join(out) + "\n"

    # ------------------------------------------------------------- responses
    def embeddings(self, req):
        inputs = req.get("input", "")
        if not isinstance(inputs, list) or (inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        data = []
        for i, item in enumerate(inputs):
            digest = hashlib.sha256(json.dumps(item).encode()).digest()
            vec = [round(b / 255.0 - 0.5, 6) for b in digest[:8]]
            emb = (base64.b64encode(struct.pack("<8f", *vec)).decode()
                   if req.get("encoding_format") == "base64" else vec)
            data.append({"object": "embedding", "index": i, "embedding": emb})
        n = sum(len(str(x).split()) for x in inputs)
        return {"object": "list", "data": data, "model": req.get("model") or self.args.served_name,
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    def base(self, path, req, chunk=False):
        chat = path == "/v1/chat/completions"
        obj = ("chat.completion" if chat else "text_completion") + (".chunk" if chunk and chat else "")
        out = {"id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], "object": obj,
               "created": int(time.time()), "model": req.get("model") or self.args.served_name}
        if self.args.echo_pid:  # --echo-pid (the soak): which process answered
            out["system_fingerprint"] = f"fake-engine-pid-{os.getpid()}"
        return out

    @staticmethod
    def prompt_text(path, req) -> str:
        """The prompt as this engine counts it: a chat's messages' contents, else ``prompt``."""
        if path == "/v1/chat/completions":
            return " ".join(str(m.get("content") or "") for m in req.get("messages") or [] if isinstance(m, dict))
        return str(req.get("prompt") or "")

    @staticmethod
    def prompt_tokens(path, req):
        return max(1, len(Engine.prompt_text(path, req).split()))

    def tool_mode(self, path):
        return self.args.tool_call and path == "/v1/chat/completions"

    async def complete(self, path, req, reader, writer, keep):
        pieces, finish = self.pieces(req.get("max_tokens"))
        if self.args.token_delay_ms:
            delay_s = len(pieces) * self.args.token_delay_ms / 1000
            if self.args.cancel_log:
                keep = await self.generate_watching(path, delay_s, reader, writer) and keep
            else:
                await asyncio.sleep(delay_s)
        resp = self.base(path, req)
        if self.tool_mode(path):
            call = {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "".join(TOOL_ARGS)}}
            choice = {"index": 0, "message": {"role": "assistant", "content": None,
                                              "tool_calls": [call]}, "finish_reason": "tool_calls"}
            n_out = len(TOOL_ARGS)
        elif path == "/v1/chat/completions":
            choice = {"index": 0, "message": {"role": "assistant", "content": "".join(pieces)},
                      "finish_reason": finish}
            n_out = len(pieces)
        else:
            choice = {"index": 0, "text": "".join(pieces), "logprobs": None, "finish_reason": finish}
            n_out = len(pieces)
        p = self.prompt_tokens(path, req)
        n = req.get("n") if self.args.honor_n and isinstance(req.get("n"), int) and req.get("n") > 1 else 1
        resp["choices"] = [{**choice, "index": i} for i in range(n)]
        resp["usage"] = {"prompt_tokens": p, "completion_tokens": n_out * n, "total_tokens": p + n_out * n}
        return await send_json(writer, 200, resp, keep)

    async def generate_watching(self, path, delay_s, reader, writer) -> bool:
        """Sleep ``delay_s`` ("generating") while watching the socket; log "cancelled" and
        raise ClientGone if the client closes it first, else log "completed". False when the
        watcher swallowed bytes of a pipelined request (the connection must not be reused)."""
        started = time.monotonic()
        watcher = asyncio.ensure_future(reader.read(65536))
        try:
            await asyncio.wait({watcher}, timeout=delay_s)
            try:
                self.check_alive(watcher, writer)
            except ClientGone:
                self.log_cancel("cancelled", path, started)
                raise
            self.log_cancel("completed", path, started)
        finally:
            swallowed = await self.stop_watching(watcher)
        return not swallowed

    def log_cancel(self, event, path, started):
        with open(self.args.cancel_log, "a", encoding="utf-8") as f:
            f.write(json.dumps({"event": event, "path": path, "stream": False,
                                "after_s": round(time.monotonic() - started, 3)}) + "\n")

    async def stream(self, path, req, reader, writer):
        chat = path == "/v1/chat/completions"
        pieces, finish = self.pieces(req.get("max_tokens"))
        if self.tool_mode(path):
            pieces, finish = TOOL_ARGS, "tool_calls"
        head = self.base(path, req, chunk=True)
        delay = self.args.token_delay_ms / 1000
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        # Watch the socket: EOF (or an error) means the client went away.
        watcher = asyncio.ensure_future(reader.read(65536))
        pipelined = False
        try:
            for i, piece in enumerate(pieces):
                if i and delay:
                    await asyncio.wait({watcher}, timeout=delay)
                self.check_alive(watcher, writer)
                if self.tool_mode(path):
                    call = {"index": 0, "function": {"arguments": piece}}
                    if i == 0 or self.args.repeat_tool_names:
                        call = {"index": 0, "id": "call_1", "type": "function",
                                "function": {"name": "get_weather", "arguments": piece}}
                    delta = {"tool_calls": [call]}
                    if self.args.repeat_tool_names:
                        delta["function_call"] = {"name": "get_weather", "arguments": piece}
                elif chat:
                    delta = {"content": piece}
                if chat:
                    if i == 0:
                        delta = {"role": "assistant", **delta}
                    choice = {"index": 0, "delta": delta, "finish_reason": None}
                else:
                    choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": None}
                await self.write_event(writer, dumps({**head, "choices": [choice]}))
                if self.args.stream_error and i == 1:  # an engine failing mid-answer, as vLLM reports it
                    await self.write_event(writer, dumps({"error": {"message": self.args.stream_error,
                                                                    "type": "InternalServerError", "code": 500}}))
                    await self.write_event(writer, b"[DONE]")
                    await self.stop_watching(watcher)
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
                    return False
            if delay:
                await asyncio.wait({watcher}, timeout=delay)
            self.check_alive(watcher, writer)
            last = ({"index": 0, "delta": {}, "finish_reason": finish} if chat else
                    {"index": 0, "text": "", "logprobs": None, "finish_reason": finish})
            await self.write_event(writer, dumps({**head, "choices": [last]}))
            if (req.get("stream_options") or {}).get("include_usage") and not self.args.no_usage_chunk:
                p, n = self.prompt_tokens(path, req), len(pieces)
                usage = {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}
                await self.write_event(writer, dumps({**head, "choices": [], "usage": usage}))
            if not self.args.no_done:
                await self.write_event(writer, b"[DONE]")
            if self.args.reset_after_done:  # a rough goodbye: no end of body, a reset
                await writer.drain()
                writer.transport.abort()
                raise ClientGone()
            if self.args.linger_after_done_ms:  # the end of the body comes a little later
                await asyncio.sleep(self.args.linger_after_done_ms / 1000)
            # Stop watching *before* the end of the body: once the client has it, it may send
            # its next request on this connection, and the watcher would swallow it.
            pipelined = await self.stop_watching(watcher)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        finally:
            pipelined = await self.stop_watching(watcher) or pipelined
        return not pipelined  # bytes swallowed by the watcher: don't reuse the connection

    @staticmethod
    async def stop_watching(watcher) -> bool:
        """Cancel the disconnect watcher and wait until it is gone (the connection's next
        read must not race it); True if it had read bytes, which are lost."""
        swallowed = watcher.done() and not watcher.cancelled() and not watcher.exception() and bool(watcher.result())
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        return swallowed

    @staticmethod
    def check_alive(watcher, writer):
        if writer.is_closing():
            raise ClientGone()
        if watcher.done() and (watcher.cancelled() or watcher.exception() or not watcher.result()):
            raise ClientGone()

    async def write_event(self, writer, payload):
        data = b"data: " + payload + b"\n\n"
        cut = next((i + 1 for i, b in enumerate(data) if b >= 0xC0), None)
        if self.args.split_bytes and cut:
            # Two HTTP chunks, split inside a multi-byte UTF-8 character.
            first, second = data[:cut], data[cut:]
            writer.write(b"%x\r\n%s\r\n" % (len(first), first))
            await writer.drain()
            await asyncio.sleep(0.02)
            data = second
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await writer.drain()


# ------------------------------------------------------------------ HTTP I/O
async def read_request(reader, writer):
    """Parse one HTTP/1.1 request; None on clean EOF between requests."""
    line = await reader.readline()
    while line in (b"\r\n", b"\n"):
        line = await reader.readline()
    if not line:
        return None
    method, target, _version = line.decode("latin-1").split(None, 2)
    headers = {}
    while True:
        h = await reader.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    if headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    body = b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                break
            body += await reader.readexactly(size)
            await reader.readline()
    elif int(headers.get("content-length") or 0):
        body = await reader.readexactly(int(headers["content-length"]))
    return method.upper(), target, headers, body


async def send(writer, status, body, ctype, keep):
    head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: {'keep-alive' if keep else 'close'}\r\n\r\n")
    writer.write(head.encode() + body)
    await writer.drain()
    return keep


def error_bytes(spec):
    """--error-body: the text itself, or the bytes of the file after '@'."""
    if spec.startswith("@"):
        with open(spec[1:], "rb") as f:
            return f.read()
    return spec.encode()


async def send_json(writer, status, obj, keep):
    return await send(writer, status, dumps(obj), "application/json", keep)


# ---------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--served-name", default="fake-model")
    p.add_argument("--startup-delay-s", type=float, default=0.0)
    p.add_argument("--token-delay-ms", type=float, default=0.0)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--capacity", type=int, default=0)
    p.add_argument("--fail-status", type=int, default=0)
    p.add_argument("--metrics-kind", choices=["none", "vllm", "sglang", "llamacpp"], default="vllm")
    p.add_argument("--record", default=None)
    p.add_argument("--text", default=None)
    p.add_argument("--split-bytes", action="store_true")
    p.add_argument("--tool-call", action="store_true")
    p.add_argument("--exit-after-s", type=float, default=0.0)
    p.add_argument("--linger-after-done-ms", type=float, default=0.0)
    p.add_argument("--reset-after-done", action="store_true")
    p.add_argument("--api-key", default="")
    p.add_argument("--dump-env", default=None)
    p.add_argument("--term-delay-s", type=float, default=0.0)
    p.add_argument("--stay-on-bind-error", action="store_true")
    # The soak (tests/soak.py): answers name the process that gave them.
    p.add_argument("--echo-pid", action="store_true",
                   help="completions carry system_fingerprint 'fake-engine-pid-PID' (default off)")
    # Engines' errors and quirks (issue 15).
    p.add_argument("--error-status", type=int, default=0,
                   help="answer every inference POST with this status and --error-body")
    p.add_argument("--error-body", default='{"detail":"fake failure"}', help="the body: text, or @FILE")
    p.add_argument("--error-content-type", default="application/json")
    p.add_argument("--fail-in-stream", action="store_true",
                   help="llama-cpp-python on a prompt over its context: a stream's headers, then the end; "
                        "a non-streamed request: 400 context_length_exceeded")
    p.add_argument("--piece-bytes", type=int, default=0, help="pad every output piece with this many bytes")
    p.add_argument("--no-done", action="store_true", help="end streams after their chunks without [DONE]")
    p.add_argument("--repeat-tool-names", action="store_true",
                   help="with --tool-call: id, type, name and a function_call in every delta (llama-cpp-python)")
    p.add_argument("--stream-error", default="", help="end streams after two chunks with this error event")
    p.add_argument("--fastapi-422", action="store_true", help="answer 422 with FastAPI's detail list")
    p.add_argument("--honor-n", action="store_true", help="n choices (default: n is ignored, one choice)")
    p.add_argument("--no-usage-chunk", action="store_true",
                   help="no usage chunk in streams, even when include_usage asks for it")
    p.add_argument("--cancel-log", default=os.environ.get("FAKE_ENGINE_CANCEL_LOG") or None,
                   help="log cancelled/completed non-streamed requests here (JSON lines)")
    # The prefill model (issue 17, bench/prefix_routing.py): off unless one is given.
    p.add_argument("--prefill-ms-per-token", type=float, default=0.0,
                   help="ms per prompt token evaluated before the first token (default 0: none)")
    p.add_argument("--prompt-cache-slots", type=int, default=0,
                   help="prompts kept in the prompt cache (LRU; default 0: none, every prompt evaluated whole)")
    return p.parse_args(argv)


def hard_exit(code):
    sys.stdout.flush()
    os._exit(code)


async def main(args):
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        if args.term_delay_s:
            loop.add_signal_handler(sig, loop.call_later, args.term_delay_s, hard_exit, 0)
        else:
            loop.add_signal_handler(sig, hard_exit, 0)
    if args.exit_after_s:
        loop.call_later(args.exit_after_s, hard_exit, 1)
    if args.dump_env:
        with open(args.dump_env, "w", encoding="utf-8") as f:
            json.dump(dict(os.environ), f)
    if args.startup_delay_s:
        await asyncio.sleep(args.startup_delay_s)
    engine = Engine(args)
    try:
        server = await asyncio.start_server(engine.handle_conn, args.host, args.port, reuse_address=True)
    except OSError as exc:
        if not args.stay_on_bind_error:
            raise
        print(f"fake engine cannot listen on {args.host}:{args.port} ({exc}); staying", flush=True)
        await asyncio.Event().wait()
    print(f"fake engine listening on {args.host}:{args.port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
