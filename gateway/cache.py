"""API keys and the catalog's names in memory, for ``/v1/`` without a database query.

Loaded by the per-process watcher (``fleet.live.watch``) in each refresh, in the same worker
thread as the routing table (a hook, :func:`fleet.live.add_loader`: ``fleet``
imports nothing from the gateway), so they are at most one refresh old (≤
``LLMGW_WATCH_INTERVAL``, 0.2 s by default): a revocation or expiry applies within a
fraction of a second. What the cache does not know (a key or model created a moment ago,
a process whose first refresh has not landed) is looked up in the database, once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from catalog.engines import OPENAI_LIKE, EngineTraits, engine_traits
from catalog.models import OPENAI_ENDPOINTS, Model, Profile, effective_context_length
from fleet import live
from gateway.models import ApiKey

_KEYS = "gateway.keys"
_MODELS = "gateway.models"


@dataclass(frozen=True)
class CachedKey:
    id: int
    name: str
    prefix: str
    sha256: str
    revoked: bool
    expires_at: Any  # datetime | None
    expires_ts: float | None
    allowed_model_ids: frozenset[int] | None


@dataclass(frozen=True)
class CachedModel:
    """The fields of a catalog ``Model`` the proxy reads, under the same attribute names, so
    that either can be handed to it: ``served_endpoints`` (``Model.served_endpoints``),
    ``context_limit`` and ``max_output_tokens`` (tokens, None unknown; also as
    ``token_limits()``), and ``engine_traits`` (``catalog.engines``; an
    external model is treated as OpenAI itself)."""

    id: int
    name: str
    on_demand: bool
    external_base_url: str
    external_api_key: str
    default_max_tokens: int | None = None
    served_endpoints: frozenset[str] = frozenset(OPENAI_ENDPOINTS)
    external_forward_org_headers: bool = False
    context_limit: int | None = None
    max_output_tokens: int | None = None
    engine_traits: EngineTraits = OPENAI_LIKE

    @property
    def is_external(self) -> bool:
        return bool(self.external_base_url)

    def token_limits(self) -> tuple[int | None, int | None]:
        """``(context_length, max_output_tokens)`` as ``Model.token_limits``."""
        return self.context_limit, self.max_output_tokens


def _profiles() -> dict[int, tuple[EngineTraits, frozenset[str]]]:
    """Profile id → (its engine traits, the endpoints it serves), one query; the same rules
    as ``Profile.engine_traits`` and ``Profile.served_endpoints``."""
    out = {}
    for profile_id, engine, command, endpoints in Profile.objects.values_list("id", "engine", "command", "endpoints"):
        traits = engine_traits(engine, command or "")
        out[profile_id] = (traits, Model.parse_endpoints(endpoints) if (endpoints or "").strip() else traits.endpoints)
    return out


def load_models() -> list[tuple[CachedModel, str]]:
    """Every catalog model as a :class:`CachedModel` with its aliases text (two queries:
    profiles, models). Mirrors ``Model.served_endpoints``, ``Model.token_limits`` and
    ``Model.engine_traits``; a test compares them model by model."""
    profiles = _profiles()
    out = []
    for (model_id, name, aliases, on_demand, base_url, api_key, max_tokens, served, forward_org, profile_id,
         context_length, max_output, weights_context) in Model.objects.values_list(
            "id", "name", "aliases", "on_demand", "external_base_url", "external_api_key", "default_max_tokens",
            "endpoints", "external_forward_org_headers", "profile_id", "context_length", "max_output_tokens",
            "weights_context_length"):
        traits, profile_serves = OPENAI_LIKE, frozenset(OPENAI_ENDPOINTS)
        if profile_id in profiles and not base_url:
            traits, profile_serves = profiles[profile_id]
        endpoints = Model.parse_endpoints(served) if (served or "").strip() else profile_serves
        if traits is OPENAI_LIKE:  # external (or no profile): only the operator's limit
            context = context_length
        else:
            context = effective_context_length(context_length, traits.context_length, weights_context)
        out.append((CachedModel(model_id, name, bool(on_demand), base_url or "", api_key or "", max_tokens, endpoints,
                                bool(forward_org), context, max_output, traits), aliases or ""))
    return out


def load() -> dict[str, Any]:
    """Every key and every model name/alias (blocking; four queries)."""
    allowed: dict[int, set[int]] = {}
    for key_id, model_id in ApiKey.allowed_models.through.objects.values_list("apikey_id", "model_id"):
        allowed.setdefault(key_id, set()).add(model_id)
    keys: dict[str, list[CachedKey]] = {}
    for key_id, name, prefix, sha256, revoked_at, expires_at in ApiKey.objects.values_list(
        "id", "name", "prefix", "sha256", "revoked_at", "expires_at"
    ):
        ids = allowed.get(key_id)
        keys.setdefault(prefix, []).append(CachedKey(
            key_id, name, prefix, sha256, revoked_at is not None, expires_at,
            None if expires_at is None else expires_at.timestamp(), frozenset(ids) if ids else None))
    by_alias: dict[str, CachedModel] = {}
    by_name: dict[str, CachedModel] = {}
    for entry, aliases in load_models():
        by_name[entry.name] = entry
        for alias in (a.strip() for a in aliases.split(",")):
            if alias:
                by_alias.setdefault(alias, entry)
    return {_KEYS: keys, _MODELS: {**by_alias, **by_name}}  # a name wins over an alias


def keys_with_prefix(prefix: str) -> list[CachedKey] | None:
    """Cached keys with this visible prefix; None when the cache is not loaded yet."""
    keys = live.current_view().extra.get(_KEYS)
    if keys is None:
        return None
    return keys.get(prefix, [])


def model(name: str) -> CachedModel | None:
    models = live.current_view().extra.get(_MODELS)
    return None if models is None else models.get(name)


def expired(key: CachedKey) -> bool:
    return key.expires_ts is not None and key.expires_ts <= time.time()


live.add_loader(load)
