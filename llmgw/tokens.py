"""High-entropy tokens stored as SHA-256, looked up by a short visible prefix
(docs/architecture.md, "Security": tokens, and "Decisions"). Not Django's password hashers:
thousands of PBKDF2 rounds per request or reconnect would cripple the gateway and the agents.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Collection, Iterable
from typing import TypeVar

T = TypeVar("T")

PREFIX_LEN = 12


def new_token(kind: str) -> str:
    """A fresh token like ``llmgw-agent-AbC123…`` (``kind`` names what it is for)."""
    return f"llmgw-{kind}-{secrets.token_urlsafe(32)}"


def new_engine_key() -> str:
    """A fresh per-replica engine key: 64 hex digits (256 bits). Hex, not URL-safe base64:
    one key in 64 of those starts with "-", and an engine given it on its command line
    (``--api-key {api_key}``) reads it as an option and exits ("expected one argument").
    The agent starts the replica's engine with it and only the gateway sends
    it, so an engine port cannot be used around the gateway (docs/architecture.md, "Security":
    engine keys). Stored in clear on the Replica row: the gateway must present it, not merely
    check it."""
    return secrets.token_hex(32)


def token_prefix(token: str) -> str:
    """The part stored in clear to find the row: ``llmgw-<kind>-`` and the first
    ``PREFIX_LEN`` characters of the secret. The secret itself may contain ``-``
    (``token_urlsafe``), so the split is on the first two dashes, never the last one —
    otherwise most of the secret would be stored in clear. Anything else: its first
    ``PREFIX_LEN`` characters."""
    brand, kind, secret = (token.split("-", 2) + ["", ""])[:3]
    if brand == "llmgw" and kind and secret:
        return f"llmgw-{kind}-{secret[:PREFIX_LEN]}"
    return token[:PREFIX_LEN]


def token_hash(token: str) -> str:
    """The SHA-256 of ``token`` as 64 hex digits: what is stored instead of the token."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token: str, stored_hash: str) -> bool:
    """Constant-time comparison of a presented token with a stored SHA-256."""
    return hmac.compare_digest(token_hash(token), stored_hash)


def token_from_authorization(header: str | None, schemes: Collection[str] = ("bearer",)) -> str | None:
    """The token of an ``Authorization`` header value ``SCHEME TOKEN``, or None.

    ``header`` is the raw value (ASGI callers decode theirs, latin-1); ``schemes`` the
    accepted schemes, compared case-insensitively (the REST API takes ``("token",
    "bearer")``, everything else only Bearer). The scheme ends at the first space; the
    token is what follows, without surrounding white space. None for no header, another
    scheme, a scheme with no space after it, or an empty token. Raises nothing."""
    scheme, space, token = (header or "").partition(" ")
    token = token.strip()
    if not space or not token or scheme.lower() not in {s.lower() for s in schemes}:
        return None
    return token


def find_by_token(candidates: Iterable[T], token: str, hash_attr: str = "sha256") -> T | None:
    """The first of ``candidates`` whose stored SHA-256 (the attribute ``hash_attr``)
    matches ``token``, compared in constant time; None for none, or for an empty token.

    ``candidates`` are the rows (or cached entries) found by the token's visible prefix —
    ``filter(prefix=token_prefix(token))`` — the first step of every lookup
    (docs/architecture.md, "Security": tokens); a candidate with no stored hash never matches.
    Revocation, expiry and the like are the caller's to check on what is returned."""
    if not token:
        return None
    for candidate in candidates:
        stored = getattr(candidate, hash_attr)
        if stored and token_matches(token, stored):
            return candidate
    return None
