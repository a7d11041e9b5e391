"""API keys on /v1/: ``Authorization: Bearer KEY`` (a key sent another way is answered 401
saying how to send it), found by the key's visible prefix and
compared by SHA-256 in constant time. Keys are read from memory (``gateway.cache``, refreshed
with the routing table every ``LLMGW_WATCH_INTERVAL``), so a revocation or expiry applies
within a fraction of a second (one refresh, ≤ 0.2 s by default); expiry is checked against
the clock on every request. A key the cache does not know yet (created a moment ago) is
looked up in the database (one indexed query), so it works at once."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from llmgw import tokens
from gateway import cache
from gateway.database import database_checked
from gateway.errors import openai_error
from gateway.models import LIMIT_FIELDS, ApiKey
from gateway.quotas import UNLIMITED, Tenancy


@dataclass(frozen=True)
class Caller:
    """Who is calling. ``key_id`` None when authentication is switched off;
    ``allowed_model_ids`` None means every model."""

    key_id: int | None
    name: str
    allowed_model_ids: frozenset[int] | None
    team_id: int | None = None
    #: Its limits, fair-share tenant and priority (``gateway.quotas``).
    tenancy: Tenancy = UNLIMITED

    def may_use(self, model_id: int) -> bool:
        return self.allowed_model_ids is None or model_id in self.allowed_model_ids


ANONYMOUS = Caller(None, "anonymous", None)


def _unauthorized(message: str) -> HttpResponse:
    return openai_error(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


_SEND_BEARER = "send 'Authorization: Bearer YOUR_KEY'"
#: Schemes shown back to the client by name: the well-known ones only (any other first word
#: may be part of a key, and is never echoed).
_KNOWN_SCHEMES = {"basic", "token", "apikey", "api-key", "key", "digest", "negotiate", "hoba", "mutual", "aws4-hmac-sha256",
                  "dpop", "gnap"}


def missing_key_message(header: str | None, other_headers: Collection[str] = ()) -> str:
    """Why a request carries no usable ``Bearer`` key, in words that say how to send one;
    never the key itself. ``header`` is the raw ``Authorization`` value (None when absent),
    ``other_headers`` the request's header names, lower case (a key sent as ``api-key`` or
    ``x-api-key``, as other providers take it, is named).

    Shapes: no header → "Missing API key: send …"; a bare key (``Authorization:
    llmgw-key-…``) → "…has no scheme: send …"; ``Token KEY`` → "…uses the scheme 'Token'
    …"; ``Bearer:`` → "…no colon after Bearer…"; ``Bearer`` alone → "…no key after Bearer"."""
    value = (header or "").strip()
    if not value:
        for name in ("x-api-key", "api-key"):
            if name in other_headers:
                return (f"The gateway does not read the {name} header: {_SEND_BEARER} "
                        "(create a key with `llmgw keys create`).")
        return f"Missing API key: {_SEND_BEARER} (create one with `llmgw keys create`)."
    scheme, space, rest = value.partition(" ")
    if scheme.lower() == "bearer":
        return f"Missing API key after 'Bearer' in the Authorization header: {_SEND_BEARER}."
    if scheme.lower().startswith("bearer:"):
        return f"The Authorization header has a colon after Bearer: {_SEND_BEARER} (Bearer, a space, the key)."
    if value[:6].lower() == "bearer":  # "Bearer<TAB>KEY", "Bearer,KEY", a non-breaking space…
        return (f"The Authorization header has Bearer followed by {_separator(value[6:7])}, not a space: "
                f"{_SEND_BEARER} (Bearer, one space, the key).")
    if not space or not rest.strip():
        return f"The Authorization header lacks the word Bearer before the key: {_SEND_BEARER}."
    word = scheme.rstrip(":").lower()
    if word in _KNOWN_SCHEMES:
        return (f"The Authorization header uses the scheme '{scheme.rstrip(':')}', which the gateway does not take: "
                f"{_SEND_BEARER}.")
    return f"The Authorization header does not start with the word Bearer: {_SEND_BEARER}."


def _separator(char: str) -> str:
    """What follows "Bearer" instead of a space, in words: "a tab", "a comma", "U+00A0"."""
    named = {"\t": "a tab", ",": "a comma", ";": "a semicolon", "=": "an equals sign", "\u00a0": "a non-breaking space"}
    if char in named:
        return named[char]
    return "a letter or digit" if char.isalnum() else f"U+{ord(char):04X}" if char else "nothing"


async def authenticate(request: HttpRequest) -> Caller | HttpResponse:
    """The caller, or a 401 in OpenAI's shape (missing, unknown, revoked or expired key; a
    key sent without the word Bearer is told how to send it: :func:`missing_key_message`)."""
    if not settings.LLMGW_GATEWAY_AUTH:
        return ANONYMOUS
    header = request.headers.get("Authorization")
    token = tokens.token_from_authorization(header)
    if token is None:
        return _unauthorized(missing_key_message(header, {name.lower() for name in request.headers}))
    prefix = tokens.token_prefix(token)
    entry = tokens.find_by_token(cache.keys_with_prefix(prefix) or (), token)
    if entry is not None:
        if entry.revoked:
            return _unauthorized(f"The API key {entry.prefix}… was revoked.")
        if cache.expired(entry):
            return _unauthorized(
                f"The API key {entry.prefix}… expired at {entry.expires_at:%Y-%m-%d %H:%M} UTC.")
        return Caller(entry.id, entry.name, entry.allowed_model_ids, entry.team_id, entry.tenancy)
    return await _authenticate_from_database(token, prefix)


async def _authenticate_from_database(token: str, prefix: str) -> Caller | HttpResponse:
    await database_checked()
    rows = [key async for key in ApiKey.objects.filter(prefix=prefix).only(
        "id", "name", "prefix", "sha256", "expires_at", "revoked_at", "team_id", "priority", "updated_at",
        *LIMIT_FIELDS)]
    key = tokens.find_by_token(rows, token)
    if key is None:
        return _unauthorized("Incorrect API key provided.")
    if key.revoked_at is not None:
        return _unauthorized(f"The API key {key.prefix}… was revoked.")
    if key.expires_at is not None and key.expires_at <= timezone.now():
        return _unauthorized(f"The API key {key.prefix}… expired at {key.expires_at:%Y-%m-%d %H:%M} UTC.")
    allowed = [m async for m in ApiKey.allowed_models.through.objects.filter(apikey_id=key.id).values_list(
        "model_id", flat=True)]
    return Caller(key.id, key.name, frozenset(allowed) if allowed else None, key.team_id,
                  await sync_to_async(_tenancy_from_database)(key))


def _tenancy_from_database(key: ApiKey) -> Tenancy:
    """The tenancy of a key the cache does not know yet (blocking; three queries)."""
    teams, team_budgets, key_budgets = cache.load_teams()
    return cache.tenancy(key.id, key.name, cache.key_uid(key.id, key.prefix), tuple(getattr(key, f) for f in LIMIT_FIELDS),
                         key.priority, teams.get(key.team_id), key_budgets.get(key.id), team_budgets.get(key.team_id),
                         cache.budget_version(key.updated_at))


def forbidden(model_name: str) -> HttpResponse:
    return openai_error(403, f"This API key may not use the model '{model_name}'.", code="model_not_allowed",
                        param="model")
