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


def token_prefix(token: str) -> str:
    """The part stored in clear to find the row: the kind and a few random characters."""
    head, _, tail = token.rpartition("-")
    return f"{head}-{tail[:PREFIX_LEN]}" if head else token[:PREFIX_LEN]


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token: str, stored_hash: str) -> bool:
    """Constant-time comparison of a presented token with a stored SHA-256."""
    return hmac.compare_digest(token_hash(token), stored_hash)
