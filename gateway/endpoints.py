"""Which paths under ``/v1/`` go upstream: exactly the OpenAI endpoints the gateway serves
(docs/architecture.md, "Gateway rules": paths).

The set is :data:`catalog.models.OPENAI_ENDPOINTS` (``chat/completions``, ``completions``,
``embeddings``); a model's ``endpoints`` field may narrow it. A request path is matched by
:func:`match`, which rejects rather than repairs: the path as the client sent it (the ASGI
``raw_path``) must spell ``/v1/<endpoint>`` byte for byte, and the decoded ``path`` must say
the same. So ``/v1/../admin``, ``/v1/chat/completions/../../props``, ``%2e%2e``, an
encoded ``?`` ``#`` or ``/`` (``%3F``, ``%23``, ``%2F``), ``//``, a trailing ``/`` or
junk, ``;params`` and engine-private endpoints (llama.cpp's ``/slots``, ``/props``,
vLLM's ``/v1/load_lora_adapter``, tokenizer endpoints) match nothing: the view answers 404
``unknown_url`` with no upstream call. The URL sent upstream is built from the matched
name, never from the client's string; the query string follows as the client sent it
(``gateway.upstream.upstream_url``).

To serve another endpoint (``responses``, ``rerank``…), add it to ``OPENAI_ENDPOINTS`` and
give ``gateway.validation.check`` its checks: only listed endpoints are ever proxied.
"""

from __future__ import annotations

from catalog.models import OPENAI_ENDPOINTS

PREFIX = "/v1/"
_ENDPOINTS = frozenset(OPENAI_ENDPOINTS)


def match(path: str, raw_path: bytes | None = None) -> str | None:
    """The endpoint (``"chat/completions"``) that a request path names exactly, or None.

    ``path`` is the decoded path (ASGI ``scope["path"]``, e.g. ``"/v1/chat/completions"``);
    ``raw_path`` the bytes the client sent (``scope["raw_path"]``, without the query
    string), or None when the server gives none. Any difference between the two (percent-
    encoding of any character), and any path that is not ``/v1/`` followed by one of the
    endpoints, is None."""
    if raw_path is not None:
        try:
            if raw_path.decode("ascii") != path:
                return None
        except UnicodeDecodeError:
            return None
    if not path.startswith(PREFIX):
        return None
    name = path[len(PREFIX):]
    return name if name in _ENDPOINTS else None


def match_request(request) -> str | None:
    """:func:`match` for a Django request: from its ASGI scope when it has one (``path``
    and ``raw_path``), else from ``request.path``."""
    scope = getattr(request, "scope", None)
    if isinstance(scope, dict) and "path" in scope:
        path, raw_path = scope["path"], scope.get("raw_path")
        root = scope.get("root_path") or ""
        if root:  # served under a prefix (uvicorn --root-path): both carry it
            if not path.startswith(root) or (raw_path is not None and not raw_path.startswith(root.encode())):
                return None
            path, raw_path = path[len(root):], None if raw_path is None else raw_path[len(root.encode()):]
        return match(path, raw_path)
    return match(request.path)


def served_by(model, endpoint: str) -> bool:
    """Whether ``model`` (a catalog ``Model`` or ``gateway.cache.CachedModel``) serves
    ``endpoint``: its ``endpoints`` field, blank meaning all of them."""
    return endpoint in model.served_endpoints
