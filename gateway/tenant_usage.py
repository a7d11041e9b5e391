"""Where a key or a team stands against its limits, for people (the admin, the REST API,
``llmgw keys list`` / ``llmgw teams show``): for each limit it has, the limit, what is used
now, what remains and when the window resets (docs/architecture.md, "Tenants").

The counters are named exactly as the gateway names them: the subject is built with
``gateway.cache.tenancy`` (as the key cache builds it) and its counters with
``gateway.quotas.checks``. Their values come from, in order:

* ``"redis"`` — the live counters in Redis (production mode: any process can read them);
* ``"web process"`` — this process's own counters (embedded mode: the admin and the REST
  API run in the web process that admits ``/v1/`` requests), once it has made them;
* ``"usage records"`` — elsewhere (the CLI in embedded mode, or Redis away): requests and
  tokens of the records whose ``at`` is in the current epoch minute, the records' tokens of
  the day and month; requests at once are unknown there (``used`` None, shown as
  :data:`CONCURRENCY_ELSEWHERE`).

A day or month counter that does not exist yet (nothing admitted in this period since a
restart) reads as what the gateway would seed it with: the usage records' sum.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone

from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings
from django.db.models import Count, F, Q, Sum
from django.db.models.functions import Coalesce

from gateway import cache, quotas, tenants
from gateway.counters import LocalCounters, RedisCounters
from gateway.models import UsageRecord
from gateway.quotas import Check, Subject, Tenancy

SOURCE_REDIS, SOURCE_WEB, SOURCE_RECORDS = "redis", "web process", "usage records"

#: How surfaces show requests at once when only the web process knows them.
CONCURRENCY_ELSEWHERE = "— (live in the web process)"

#: The kind of counter (``quotas``) → the limit field it enforces (``gateway.models.Limits``).
FIELD_OF_KIND = {quotas.REQUESTS: "requests_per_minute", quotas.TOKENS: "tokens_per_minute",
                 quotas.CONCURRENCY: "max_concurrent_requests", quotas.DAY: "tokens_per_day",
                 quotas.MONTH: "tokens_per_month"}

#: Stands for "a model with no budget of its own" in :func:`subject_checks` (ids start at 1).
_NO_MODEL = 0


def subject_of(kind: str, obj) -> Subject | None:
    """The :class:`~gateway.quotas.Subject` the gateway admits ``obj`` (an ``ApiKey`` when
    ``kind`` is ``"key"``, a ``Team`` when ``"team"``) as, or None when it limits nothing.
    A few queries (the team, the model budgets). ValueError for another kind."""
    if kind == "key":
        team = obj.team
        tenancy = cache.tenancy(obj.pk, obj.name, cache.key_uid(obj.pk, obj.prefix),
                                tuple(obj.limit_fields().values()), obj.priority,
                                cache.team_row(team) if team else None, cache.budgets_of(obj.model_budgets.all()),
                                cache.budgets_of(team.model_budgets.all()) if team else None,
                                cache.budget_version(obj.updated_at))
    elif kind == "team":
        # A key that limits nothing is left out of a tenancy: what remains is the team.
        tenancy = cache.tenancy(0, "", "", (None,) * 5, None, cache.team_row(obj), None,
                                cache.budgets_of(obj.model_budgets.all()))
    else:
        raise ValueError(f"subject_kind must be 'key' or 'team', not {kind!r}")
    return next((s for s in tenancy.subjects if s.kind == kind), None)


def subject_checks(subject: Subject, model_names: dict[int, str], now_s: float) -> list[Check]:
    """Every counter of ``subject`` at ``now_s`` (epoch seconds), pure: those a request for a
    model without a budget of its own touches, then each model budget's (``model_names``:
    model id → its catalog name, as budget checks carry it). Amounts are 0."""
    tenancy = Tenancy((subject,))
    out: dict[str, Check] = {}
    for model_id in (_NO_MODEL, *sorted(subject.model_budgets)):
        for check in quotas.checks(tenancy, model_id, model_names.get(model_id, ""), 0, now_s):
            out.setdefault(check.key, check)
    return list(out.values())


def _iso(epoch_s: float | None) -> str | None:
    return None if epoch_s is None else datetime.fromtimestamp(epoch_s, tz=timezone.utc).isoformat()


def describe(subject: Subject, checks: Sequence[Check], used: Sequence[int | None], source: str,
             now_s: float) -> dict:
    """The answer of :func:`usage`, pure: ``{"subject", "id", "name", "source", "at",
    "limits": {field: entry}, "model_budgets": {model name: {field: entry}}}``, an entry
    being ``{"limit", "used", "remaining", "resets_at"}`` (requests or tokens; ``used`` and
    ``remaining`` None when unknown; ``resets_at`` ISO 8601 UTC, None for requests at once,
    which have no window)."""
    limits: dict[str, dict] = {}
    budgets: dict[str, dict] = {}
    for check, value in zip(checks, used):
        entry = {"limit": check.limit, "used": value,
                 "remaining": None if value is None else max(0, check.limit - value),
                 "resets_at": _iso(check.reset_at_s)}
        if check.model_id is None:
            limits[FIELD_OF_KIND[check.kind]] = entry
        else:
            budgets.setdefault(check.model_name, {})[FIELD_OF_KIND[check.kind]] = entry
    return {"subject": subject.kind, "id": subject.id, "name": subject.name, "source": source, "at": _iso(now_s),
            "limits": limits, "model_budgets": budgets}


def _unlimited(kind: str, obj, source: str, now_s: float) -> dict:
    return {"subject": kind, "id": obj.pk, "name": obj.name, "source": source, "at": _iso(now_s), "limits": {},
            "model_budgets": {}}


def live_counters():
    """The counters this process can read live (a ``RedisCounters`` in production mode, a
    ``LocalCounters`` this process has used), else None."""
    if settings.REDIS_URL:
        return tenants.backend()
    counters = tenants.backend_in_use()
    return counters if isinstance(counters, (LocalCounters, RedisCounters)) else None


def _records_of(check: Check):
    rows = UsageRecord.objects.all()
    return rows.filter(key_id=check.subject.id) if check.subject.kind == "key" else rows.filter(
        team_id=check.subject.id)


def _from_records(check: Check) -> int | None:
    """What the usage records say of one counter (blocking; one query): the current epoch
    minute's requests or tokens, the budget period's tokens; None for requests at once."""
    if check.is_budget:
        return tenants.spent_tokens(check)
    if check.kind == quotas.CONCURRENCY:
        return None
    end_s = check.reset_at_s or 0.0
    rows = _records_of(check).filter(at__gte=datetime.fromtimestamp(end_s - 60, tz=timezone.utc),
                                     at__lt=datetime.fromtimestamp(end_s, tz=timezone.utc))
    if check.kind == quotas.REQUESTS:
        return counted_by_the_limiter(rows).aggregate(n=Count("id"))["n"]
    total = rows.aggregate(total=Sum(Coalesce(F("prompt_tokens"), 0) + Coalesce(F("completion_tokens"), 0)))["total"]
    return int(total or 0)


def counted_by_the_limiter(records):
    """The usage records whose requests the requests-per-minute counter counts: those
    admitted (``gateway.proxy``: ``tenants.admit``) and not taken back. A record the gateway
    answered itself (no ``upstream_status``) with a 4xx was not: refused before admission
    (400 a bad body, 401, 403, 404 an unknown model or endpoint, 413) or at it (429), or
    refused after it with a 400 that ``tenants.settle`` takes back; 499 (the client left) is
    counted, as are 5xx and everything an upstream answered. Read from records this is close,
    not exact: a 429 after a queue wait ran out was counted and a 503 of a stopped cluster
    was not."""
    return records.exclude(Q(upstream_status__isnull=True, status__gte=400, status__lt=500) & ~Q(status=499))


def _peek(counters, keys: list[str]) -> list[int | None]:
    if isinstance(counters, LocalCounters):
        return counters.peek_now(keys)
    return async_to_sync(counters.peek)(keys)


def usages(items: Iterable[tuple[str, object]], now_s: float | None = None) -> list[dict]:
    """:func:`usage` of each ``(subject_kind, obj)``, reading the live counters in one
    round trip (blocking)."""
    now_s = time.time() if now_s is None else now_s
    items = list(items)
    counters = live_counters()
    source = SOURCE_RECORDS if counters is None else SOURCE_REDIS if isinstance(counters, RedisCounters) \
        else SOURCE_WEB
    subjects, all_checks = [], []
    for kind, obj in items:
        subject = subject_of(kind, obj)
        checks = []
        if subject is not None:
            names = dict(obj.model_budgets.values_list("model_id", "model__name"))
            checks = subject_checks(subject, names, now_s)
        subjects.append(subject)
        all_checks.append(checks)
    flat = [c for checks in all_checks for c in checks]
    note = ""
    values: list[int | None] = [None] * len(flat)
    if counters is not None and flat:
        try:
            values = _peek(counters, [c.key for c in flat])
        except Exception as exc:  # noqa: BLE001 (Redis away: say so, and read the records)
            counters, source, note = None, SOURCE_RECORDS, f"Redis unreachable ({exc or type(exc).__name__})"
    filled = []
    for check, value in zip(flat, values):
        if counters is None:
            value = _from_records(check)
        elif value is None and check.is_budget:
            value = tenants.spent_tokens(check)  # what admission would seed it with
        elif value is None:
            value = 0  # no request in this window (or, for requests at once, none running)
        filled.append(value)
    out, at = [], 0
    for (kind, obj), subject, checks in zip(items, subjects, all_checks):
        if subject is None:
            result = _unlimited(kind, obj, source, now_s)
        else:
            result = describe(subject, checks, filled[at:at + len(checks)], source, now_s)
        if note:
            result["note"] = note
        at += len(checks)
        out.append(result)
    return out


def usage(subject_kind: str, obj, now_s: float | None = None) -> dict:
    """Where ``obj`` (an ``ApiKey`` for ``"key"``, a ``Team`` for ``"team"``) stands
    against each limit it has: see :func:`describe` for the shape; ``"source"`` says where
    the values come from (``"redis"``, ``"web process"``, ``"usage records"``; a ``"note"``
    says why when Redis could not be read). Blocking (a few queries, one counters round
    trip). ValueError for another kind."""
    return usages([(subject_kind, obj)], now_s)[0]


async def ausage(subject_kind: str, obj, now_s: float | None = None) -> dict:
    """:func:`usage` from async code (in a worker thread: it queries the database)."""
    return await sync_to_async(usage)(subject_kind, obj, now_s)


def entry_text(entry: dict | None) -> str:
    """One limit for a table cell: ``used / limit``, ``—`` without the limit, and
    :data:`CONCURRENCY_ELSEWHERE` for requests at once only the web process knows."""
    if entry is None:
        return "—"
    if entry["used"] is None:
        return f"{CONCURRENCY_ELSEWHERE}, limit {entry['limit']:,}"
    return f"{entry['used']:,} / {entry['limit']:,}"


#: Short names of the limits, for one-line summaries.
SHORT_NAMES = {"requests_per_minute": "RPM", "tokens_per_minute": "TPM", "max_concurrent_requests": "at once",
               "tokens_per_day": "tokens/day", "tokens_per_month": "tokens/month"}


def limits_text(limits: dict[str, int | None]) -> str:
    """A subject's limits in one line (``60 RPM, 10,000 TPM``), ``none`` without any.
    ``limits``: ``Limits.limit_fields()``."""
    return ", ".join(f"{value:,} {SHORT_NAMES[name]}" for name, value in limits.items() if value is not None) \
        or "none"
