"""High-entropy tokens stored as SHA-256, looked up by a short visible prefix (DESIGN,
Decisions: "Keys and tokens"). Not Django's password hashers: thousands of PBKDF2 rounds
per request or reconnect would cripple the gateway and the agents.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

PREFIX_LEN = 12


def new_token(kind: str) -> str:
    """A fresh token like ``llmgw-agent-AbC123…`` (``kind`` names what it is for)."""
    return f"llmgw-{kind}-{secrets.token_urlsafe(32)}"


def new_engine_key() -> str:
    """A fresh per-replica engine key (``secrets.token_urlsafe(32)``: 43 URL-safe
    characters). The agent starts the replica's engine with it and only the gateway sends
    it, so an engine port cannot be used around the gateway (issue 12). Stored in clear on
    the Replica row: the gateway must present it, not merely check it."""
    return secrets.token_urlsafe(32)


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
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token: str, stored_hash: str) -> bool:
    """Constant-time comparison of a presented token with a stored SHA-256."""
    return hmac.compare_digest(token_hash(token), stored_hash)
