"""A recording OpenAI-compatible upstream for tests of what the gateway sends and relays:
an HTTP server in a thread of the test process that records every request it receives
(method, the request target exactly as sent, headers, body) and answers like an engine or
provider — including response headers a client must never see (``Set-Cookie``…)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SERVED = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")

#: Sent with every answer: the first group must not reach the gateway's clients.
UNSAFE_HEADERS = {
    "Set-Cookie": "session=upstream-session; Path=/; HttpOnly",
    "Set-Cookie2": "legacy=1",
    "WWW-Authenticate": 'Bearer realm="upstream"',
    "Strict-Transport-Security": "max-age=31536000; includeSubDomains",
    "Alt-Svc": 'h3=":443"; ma=86400',
    "Access-Control-Allow-Origin": "*",
    "OpenAI-Organization": "org-operator",
}
SAFE_HEADERS = {"X-Request-Id": "req-upstream-1", "OpenAI-Processing-Ms": "7"}
#: Headers that would send the client elsewhere, or pass for the gateway's own.
SPOOFING_HEADERS = {
    "Location": "https://evil.example.com/v1/chat/completions",
    "Content-Location": "https://evil.example.com/",
    "Refresh": "0; url=https://evil.example.com/",
    "Link": "<https://evil.example.com/x.js>; rel=preload; as=script",
    "X-Llmgw-Replica": "999@upstream-says",
    "X-Llmgw-Overhead-Ms": "123456.00",
    "X-Llmgw-Anything": "upstream",
}


class RecordingUpstream:
    """Start with :meth:`start`; ``requests`` lists dicts ``{method, target, headers, body}``
    (header names lower-cased) in arrival order; ``stop()`` shuts it down."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with upstream.lock:
                    upstream.requests.append({"method": self.command, "target": self.path,
                                              "headers": {k.lower(): v for k, v in self.headers.items()},
                                              "body": body})
                if self.command != "POST" or self.path.partition("?")[0] not in SERVED:
                    return self._send(404, b'{"detail": "Not Found"}', "application/json")
                try:
                    req = json.loads(body or b"{}")
                except ValueError:
                    req = {}
                if req.get("stream"):
                    chunk = {"id": "c1", "object": "chat.completion.chunk", "model": req.get("model"),
                             "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
                    data = b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"
                    return self._send(200, data, "text/event-stream")
                if self.path.partition("?")[0] == "/v1/embeddings":
                    answer = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.1]}],
                              "model": req.get("model"), "usage": {"prompt_tokens": 1, "total_tokens": 1}}
                else:
                    answer = {"id": "c1", "object": "chat.completion", "model": req.get("model"),
                              "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                           "text": "hi", "finish_reason": "stop"}],
                              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
                self._send(200, json.dumps(answer).encode(), "application/json")

            def _send(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for name, value in {**UNSAFE_HEADERS, **SAFE_HEADERS, **SPOOFING_HEADERS}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET = do_PUT = do_DELETE = do_PATCH = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> "RecordingUpstream":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def count(self) -> int:
        with self.lock:
            return len(self.requests)

    def since(self, start: int) -> list[dict]:
        """The requests received after the first ``start`` ones."""
        with self.lock:
            return list(self.requests[start:])
