"""Choosing a ready replica for a request by its model's routing policy
(``fleet.planning.routing``: least-loaded, prefix-affinity, session; docs/architecture.md,
"Gateway rules": routing).

This module turns a request into what those rules route by (:func:`route_keys`): the prompt
as its engine will see it, in order — tools, then each message's role and content, or the
completion prompt — cut into :data:`BLOCK_BYTES`-byte blocks hashed chained (BLAKE2b, 64
bits: the same in every process), at most :data:`MAX_BLOCKS` of them; and the session, from
``X-Session-Id`` or else the body's ``user``. It counts each choice in ``/metrics``.
"""

from __future__ import annotations

import hashlib
import json

from fleet import live
from fleet.live import NO_KEYS, Endpoint, RouteKeys
from gateway import metrics

#: Bytes per prefix block (about 64 tokens of English).
BLOCK_BYTES = 256
#: Blocks hashed at most (the first 16 KiB of the prompt): deeper blocks change nothing a
#: router can use, and a huge prompt is not hashed whole.
MAX_BLOCKS = 64
#: The header naming a conversation or session (``session`` policy; else the body's ``user``).
SESSION_HEADER = "X-Session-Id"

_KEYED = ("chat/completions", "completions", "responses")
_SEP = b"\x1e"


def _text(value) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if value is None:
        return b""
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):  # content parts: the text of each
        return b"".join(_text(p.get("text")) if p.get("type") == "text" else
                        json.dumps(p, sort_keys=True, default=str).encode() for p in value)
    return json.dumps(value, sort_keys=True, default=str).encode()


def prompt_bytes(path: str, body: dict) -> bytes:
    """The request's prompt as bytes in the order its engine reads it (``b""`` when the
    endpoint has no prompt to share): the tools (engines render them first), then for chat
    each message's role and content (text parts by their text), for a completion its prompt
    (the first of a list). Only a prefix of it is hashed (messages past the first
    ``BLOCK_BYTES · MAX_BLOCKS`` bytes are left out)."""
    parts: list[bytes] = []
    tools = body.get("tools")
    if tools:  # the whole list as JSON: read as content parts, each tool would lose its bounds
        parts.append(json.dumps(tools, sort_keys=True, default=str).encode())
    if path == "chat/completions":
        size, enough = 0, BLOCK_BYTES * MAX_BLOCKS
        for message in body.get("messages") or ():
            if isinstance(message, dict):
                parts.append(_text(message.get("role")) + b":" + _text(message.get("content")))
                size += len(parts[-1]) + 1
                if size >= enough:  # the rest is never hashed
                    break
    elif path == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        parts.append(_text(prompt))
    elif path == "responses":
        if body.get("instructions"):
            parts.append(_text(body.get("instructions")))
        parts.append(_text(body.get("input")))
    return _SEP.join(parts)


def block_hashes(data: bytes) -> tuple[int, ...]:
    """The chained hashes of ``data``'s whole :data:`BLOCK_BYTES`-byte blocks, at most
    :data:`MAX_BLOCKS`: the *i*-th names ``data[:(i + 1) · BLOCK_BYTES]``."""
    whole = min(len(data) // BLOCK_BYTES, MAX_BLOCKS)
    if not whole:
        return ()
    hasher = hashlib.blake2b(digest_size=8)
    out = []
    view = memoryview(data)
    for i in range(whole):
        hasher.update(view[i * BLOCK_BYTES:(i + 1) * BLOCK_BYTES])
        out.append(int.from_bytes(hasher.copy().digest(), "little"))
    return tuple(out)


def session_hash(session: str) -> int:
    """A session id's 64-bit hash (the same in every process)."""
    return int.from_bytes(hashlib.blake2b(session.encode("utf-8", "surrogatepass"), digest_size=8,
                                          person=b"llmgw-session").digest(), "little")


def route_keys(policy: str, path: str, body: dict, headers) -> RouteKeys:
    """What a request to ``path`` with ``body`` and request ``headers`` is routed by under
    ``policy``: nothing for least-loaded, or an endpoint without a prompt (embeddings…)."""
    if policy == live.LEAST_LOADED or path not in _KEYED:
        return NO_KEYS
    session = headers.get(SESSION_HEADER)
    if not session:
        user = body.get("user")
        session = user if isinstance(user, str) and user else None
    return RouteKeys(block_hashes(prompt_bytes(path, body)), session_hash(session[:512]) if session else None)


def choose(endpoints: tuple[Endpoint, ...], exclude: set[int] = frozenset(), policy: str = live.LEAST_LOADED,
           keys: RouteKeys = NO_KEYS, model_name: str = "") -> Endpoint | None:
    """The endpoint that takes the request (``fleet.live.route``), counted in
    ``llmgw_routing_decisions_total``; None if every endpoint is excluded."""
    chosen = live.route(endpoints, policy, keys, exclude)
    if chosen is None:
        return None
    endpoint, decision = chosen
    if model_name:
        metrics.child(metrics.ROUTING, model_name, policy, decision.outcome).inc()
    return endpoint
