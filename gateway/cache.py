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

from catalog.models import Model
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
    """The few fields of a catalog ``Model`` the proxy reads (same attribute names)."""

    id: int
    name: str
    on_demand: bool
    external_base_url: str
    external_api_key: str
    default_max_tokens: int | None = None
    served_endpoints: frozenset[str] = frozenset()
    external_forward_org_headers: bool = False

    @property
    def is_external(self) -> bool:
        return bool(self.external_base_url)


def load() -> dict[str, Any]:
    """Every key and every model name/alias (blocking; three queries)."""
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
    for model_id, name, aliases, on_demand, base_url, api_key, max_tokens, served, forward_org in (
        Model.objects.values_list("id", "name", "aliases", "on_demand", "external_base_url", "external_api_key",
                                  "default_max_tokens", "endpoints", "external_forward_org_headers")
    ):
        entry = CachedModel(model_id, name, bool(on_demand), base_url or "", api_key or "", max_tokens,
                            Model.parse_endpoints(served), bool(forward_org))
        by_name[name] = entry
        for alias in (a.strip() for a in (aliases or "").split(",")):
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
