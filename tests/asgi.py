"""The web app driven in-process over ASGI, as uvicorn would drive it."""

from __future__ import annotations

from channels.testing import ApplicationCommunicator


def chat_request(key: str) -> ApplicationCommunicator:
    """A ``POST /v1/chat/completions`` to ``llmgw.asgi.application`` with ``key``, its body
    not sent yet (``send_input({"type": "http.request", "body": …})``)."""
    from llmgw.asgi import application

    return ApplicationCommunicator(application, {
        "type": "http", "http_version": "1.1", "method": "POST", "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "", "scheme": "http",
        "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                    (b"authorization", f"Bearer {key}".encode())],
        "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80)})
