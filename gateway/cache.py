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
from catalog.models import OPENAI_ENDPOINTS, ClusterSettings, Model, Profile, effective_context_length
from fleet import live
from gateway.models import LIMIT_FIELDS, ApiKey, ModelBudget, Priority, Team
from gateway.quotas import UNLIMITED, Subject, Tenancy

_KEYS = "gateway.keys"
_MODELS = "gateway.models"
_ADMISSION = "gateway.admission"


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
    team_id: int | None = None
    #: The limits, fair-share tenant, weight and priority its requests are admitted with.
    tenancy: Tenancy = UNLIMITED


@dataclass(frozen=True)
class CachedModel:
    """The fields of a catalog ``Model`` the proxy reads, under the same attribute names, so
    that either can be handed to it: ``served_endpoints`` (``Model.served_endpoints``),
    ``context_limit`` and ``max_output_tokens`` (tokens, None unknown; also as
    ``token_limits()``), ``engine_traits`` (``catalog.engines``; an
    external model is treated as OpenAI itself) and ``routing_policy``
    (``catalog.models.RoutingPolicy``)."""

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
    routing_policy: str = "least-loaded"

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
         context_length, max_output, weights_context, policy) in Model.objects.values_list(
            "id", "name", "aliases", "on_demand", "external_base_url", "external_api_key", "default_max_tokens",
            "endpoints", "external_forward_org_headers", "profile_id", "context_length", "max_output_tokens",
            "weights_context_length", "routing_policy"):
        traits, profile_serves = OPENAI_LIKE, frozenset(OPENAI_ENDPOINTS)
        if profile_id in profiles and not base_url:
            traits, profile_serves = profiles[profile_id]
        endpoints = Model.parse_endpoints(served) if (served or "").strip() else profile_serves
        if traits is OPENAI_LIKE:  # external (or no profile): only the operator's limit
            context = context_length
        else:
            context = effective_context_length(context_length, traits.context_length, weights_context)
        out.append((CachedModel(model_id, name, bool(on_demand), base_url or "", api_key or "", max_tokens, endpoints,
                                bool(forward_org), context, max_output, traits, policy), aliases or ""))
    return out


def _budgets(rows) -> tuple[dict[int, dict], dict[int, dict]]:
    """Model budgets by team id and by key id: owner → {model id: (per day, per month)}."""
    by_team: dict[int, dict] = {}
    by_key: dict[int, dict] = {}
    for team_id, key_id, model_id, per_day, per_month, updated_at in rows:
        if per_day is None and per_month is None:
            continue
        owner = by_team.setdefault(team_id, {}) if team_id is not None else by_key.setdefault(key_id, {})
        owner[model_id] = (per_day, per_month, budget_version(updated_at))
    return by_team, by_key


def budget_version(updated_at) -> str:
    """A row's ``updated_at`` as a budget version (``quotas.Subject.budget_version``)."""
    return "" if updated_at is None else f"{updated_at.timestamp():.6f}"


def tenancy(key_id: int, key_name: str, key_uid: str, key_limits: tuple, key_priority: int | None,
            team: tuple | None, key_budgets: dict | None = None, team_budgets: dict | None = None,
            key_budget_version: str = "") -> Tenancy:
    """A key's :class:`~gateway.quotas.Tenancy`: its limits and its team's (those that limit
    something), the team as its fair-share tenant (else the key itself), the team's weight,
    the key's priority (else the team's, else normal). ``key_limits``: the
    ``LIMIT_FIELDS`` values; ``key_uid``: :func:`key_uid`; ``team``: ``(id, name, limits,
    priority, weight, uid[, budget version])`` or None; budget versions: :func:`budget_version`
    of the row's ``updated_at``."""
    subjects = []
    key = Subject("key", key_id, key_name, key_uid, *key_limits, model_budgets=key_budgets or {},
                  budget_version=key_budget_version)
    if key.limits_anything():
        subjects.append(key)
    if team is None:
        return Tenancy(tuple(subjects), f"key:{key_id}", 1.0,
                       key_priority if key_priority is not None else Priority.NORMAL)
    team_id, team_name, team_limits, team_priority, weight, team_uid, *version = team
    team_subject = Subject("team", team_id, team_name, team_uid, *team_limits, model_budgets=team_budgets or {},
                           budget_version=version[0] if version else "")
    if team_subject.limits_anything():
        subjects.append(team_subject)
    return Tenancy(tuple(subjects), f"team:{team_id}", float(weight),
                   key_priority if key_priority is not None else team_priority)


def key_uid(key_id: int, prefix: str) -> str:
    """What names a key's counters (``quotas.Subject.uid``): its id and prefix."""
    return f"{key_id}.{prefix}"


def team_uid(team_id: int, created_at) -> str:
    """What names a team's counters (``quotas.Subject.uid``): its id and creation time, so a
    team made later with a deleted one's id starts from zero."""
    return f"{team_id}-{created_at.timestamp():.6f}"


def team_row(team: Team) -> tuple:
    """A team as :func:`tenancy` takes it: ``(id, name, limits, priority, weight, uid)``."""
    return (team.pk, team.name, tuple(team.limit_fields().values()), team.priority, team.weight,
            team_uid(team.pk, team.created_at), budget_version(team.updated_at))


def budgets_of(rows) -> dict[int, tuple[int | None, int | None]]:
    """One owner's model budgets as :func:`tenancy` takes them, from ``ModelBudget`` rows:
    model id → (tokens per day, tokens per month); rows with neither are left out."""
    return {b.model_id: (b.tokens_per_day, b.tokens_per_month, budget_version(b.updated_at)) for b in rows
            if b.tokens_per_day is not None or b.tokens_per_month is not None}


def load_teams() -> tuple[dict[int, tuple], dict[int, dict], dict[int, dict]]:
    """Teams as ``tenancy`` takes them, and the model budgets by team and by key (two queries)."""
    teams = {row[0]: (row[0], row[1], tuple(row[2:7]), row[7], row[8], team_uid(row[0], row[9]),
                      budget_version(row[10]))
             for row in Team.objects.values_list("id", "name", *LIMIT_FIELDS, "priority", "weight", "created_at",
                                                 "updated_at")}
    by_team, by_key = _budgets(ModelBudget.objects.values_list(
        "team_id", "key_id", "model_id", "tokens_per_day", "tokens_per_month", "updated_at"))
    return teams, by_team, by_key


def load() -> dict[str, Any]:
    """Every key (with its team's limits), every model name/alias and the admission settings
    (blocking; seven queries).

    The keys are read before their model limits: each query sees the database as of its own
    start (PostgreSQL's read committed), and a key is created with its limits in one
    transaction (``ApiKey.create_key``). Read the other way round, a key committed between
    the two queries was cached with no limits read — allowed every model — until the next
    refresh (seen as a 200 where a 403 was due, under load). This way a key is either
    missing (looked up in the database on first use) or complete."""
    key_rows = list(ApiKey.objects.values_list("id", "name", "prefix", "sha256", "revoked_at", "expires_at",
                                               "team_id", "priority", "updated_at", *LIMIT_FIELDS))
    allowed: dict[int, set[int]] = {}
    for key_id, model_id in ApiKey.allowed_models.through.objects.values_list("apikey_id", "model_id"):
        allowed.setdefault(key_id, set()).add(model_id)
    teams, team_budgets, key_budgets = load_teams()
    keys: dict[str, list[CachedKey]] = {}
    for row in key_rows:
        key_id, name, prefix, sha256, revoked_at, expires_at, team_id, priority, updated_at = row[:9]
        ids = allowed.get(key_id)
        team = teams.get(team_id)
        keys.setdefault(prefix, []).append(CachedKey(
            key_id, name, prefix, sha256, revoked_at is not None, expires_at,
            None if expires_at is None else expires_at.timestamp(), frozenset(ids) if ids else None,
            team_id if team else None,
            tenancy(key_id, name, key_uid(key_id, prefix), tuple(row[9:]), priority, team, key_budgets.get(key_id),
                    team_budgets.get(team_id), budget_version(updated_at))))
    by_alias: dict[str, CachedModel] = {}
    by_name: dict[str, CachedModel] = {}
    for entry, aliases in load_models():
        by_name[entry.name] = entry
        for alias in (a.strip() for a in aliases.split(",")):
            if alias:
                by_alias.setdefault(alias, entry)
    admission = ClusterSettings.objects.filter(pk=1).values_list("rate_limits_without_redis",
                                                                  "admission_wait_s").first()
    return {_KEYS: keys, _MODELS: {**by_alias, **by_name},  # a name wins over an alias
            _ADMISSION: AdmissionSettings(*admission) if admission else AdmissionSettings()}


@dataclass(frozen=True)
class AdmissionSettings:
    """The cluster settings admission reads (``catalog.models.ClusterSettings``)."""

    rate_limits_without_redis: str = "open"
    admission_wait_s: float = 30.0


def admission_settings() -> AdmissionSettings:
    """The cluster's admission settings as of the last refresh (defaults before the first)."""
    return live.current_view().extra.get(_ADMISSION) or _DEFAULT_ADMISSION


_DEFAULT_ADMISSION = AdmissionSettings()


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
