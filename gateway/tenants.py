"""Tenants' limits on ``/v1/``: admit a request against its key's and team's counters (or
answer 429), tell the client where it stands (OpenAI's ``x-ratelimit-*`` headers), and settle
the counters when the request ends (docs/architecture.md, "Tenants").

The rules are ``gateway.quotas`` (pure); the counters ``gateway.counters`` — in this process
in embedded mode, in Redis when ``LLMGW_REDIS_URL`` is set (production), so that every web
process counts against the same limits. No database on the way, except to seed a budget
counter that does not exist yet (once per key or team and period, from usage records).

When Redis cannot be reached, the cluster setting ``rate_limits_without_redis`` decides:
``open`` admits requests uncounted, ``closed`` answers 503 ``rate_limits_unavailable``. The
outage is logged once when it starts and once when it ends, never per request.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections
from django.db.models import F, Sum
from django.db.models.functions import Coalesce
from django.http import HttpResponse

from gateway import assembly, cache, quotas
from gateway.bodies import requested_tokens
from gateway.counters import CountersAway, LocalCounters, NeedSeed, RedisCounters, new_member
from gateway.errors import openai_error
from gateway.models import UsageRecord
from gateway.quotas import Check, Tenancy

log = logging.getLogger(__name__)

#: The completion tokens reserved for a request that names no limit, when its model has no
#: default either (cut to the model's output limit).
DEFAULT_COMPLETION_RESERVE_TOKENS = 1024
#: A request's prompt is estimated at this many characters per token at admission (the
#: real count settles it).
CHARS_PER_TOKEN = 4


def _make_backend():
    if settings.REDIS_URL:
        return RedisCounters(settings.REDIS_URL, settings.REDIS_PREFIX)
    return LocalCounters()


_backend = None


def backend():
    """This process's counters (made on first use from the settings)."""
    global _backend
    if _backend is None:
        _backend = _make_backend()
    return _backend


def backend_in_use():
    """This process's counters if it has made them (it admitted a request of a limited key,
    or a test set them), else None — without making them: a process that serves no
    ``/v1/`` (the CLI in embedded mode) has none, and its own would be empty."""
    return _backend


def use_backend(counters) -> None:
    """Replace this process's counters (tests; None: from the settings again)."""
    global _backend
    _backend = counters


# ---- the request's reservation -----------------------------------------------------------

def _chars(value) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_chars(v) if isinstance(v, (str, list)) else 1 for v in value)
    return 0


def estimate_prompt_tokens(path: str, body: dict, raw_size: int) -> int:
    """The prompt's tokens, estimated without a tokenizer: its text's characters / 4 (token
    ids counted as they are); for endpoints without a text prompt, the body's bytes / 4."""
    ids = assembly.prompt_token_ids_count(path, body)
    if ids is not None:
        return ids
    if assembly.kind_of(path) is not None:
        chars = len(assembly.prompt_text(path, body))
    elif path == "embeddings":
        chars = _chars(body.get("input"))
    else:
        chars = raw_size
    return max(1, math.ceil(chars / CHARS_PER_TOKEN))


def reservation(path: str, body: dict, raw_size: int, model) -> int:
    """See :func:`reservation_parts`; their sum."""
    return sum(reservation_parts(path, body, raw_size, model))


def reservation_parts(path: str, body: dict, raw_size: int, model) -> tuple[int, int]:
    """Tokens a request reserves at admission: its estimated prompt plus the most it may
    generate — ``max_tokens`` (or ``max_completion_tokens``, or the model's default) times
    ``n``; with none of them, :data:`DEFAULT_COMPLETION_RESERVE_TOKENS` cut to the model's
    output limit. Embeddings generate nothing. Returns ``(prompt, completion)``."""
    prompt = estimate_prompt_tokens(path, body, raw_size)
    if assembly.kind_of(path) is None:
        return prompt, 0
    completion = requested_tokens(body, model.default_max_tokens)
    if not completion:
        _, max_output = model.token_limits()
        completion = min(DEFAULT_COMPLETION_RESERVE_TOKENS, max_output or DEFAULT_COMPLETION_RESERVE_TOKENS)
    n = body.get("n")
    choices = n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 128 else 1
    prompts = body.get("prompt")
    legs = 1
    if isinstance(prompts, list) and prompts and all(isinstance(p, (str, list)) for p in prompts):
        legs = len(prompts)  # a list of prompts (texts, or token-id lists): each gets its completion
    return prompt, completion * choices * legs


# ---- admission ---------------------------------------------------------------------------

@dataclass
class Admitted:
    """A request counted in its counters: what :func:`settle` undoes or corrects."""

    checks: list[Check]
    member: str
    reserved: int
    counters: object
    #: When it was admitted (epoch seconds): a counter made after this never held its reservation.
    admitted_s: float = 0.0
    #: Its prompt's estimated tokens, charged when the answer says nothing of its prompt.
    prompt_estimate: int = 0


class _Outage:
    """Redis's state as admission saw it, so that an outage is logged once."""

    def __init__(self) -> None:
        self.since: float | None = None

    def failed(self, exc: Exception, policy: str) -> None:
        if self.since is None:
            self.since = time.monotonic()
            what = "admitting requests uncounted" if policy == "open" else "refusing limited keys with 503"
            log.warning("Redis unreachable for the rate-limit counters (%s): %s until it is back "
                        "(cluster setting rate_limits_without_redis=%s)", exc, what, policy)

    def recovered(self) -> None:
        if self.since is not None:
            log.warning("Redis is back for the rate-limit counters after %.1f s", time.monotonic() - self.since)
            self.since = None


outage = _Outage()


async def _seed(counters, checks: list[Check], missing: tuple[int, ...]) -> None:
    for i in missing:
        check = checks[i]
        value = await sync_to_async(_spent_tokens_closed, thread_sensitive=False)(check)
        await counters.seed(check.key, value, check.ttl_s)


def _spent_tokens_closed(check: Check) -> int:
    """:func:`spent_tokens` in a thread of the loop's executor, whose database connection
    is checked before (a PostgreSQL restart since) and closed after (as Django closes a
    request's: the executor's threads are not request threads)."""
    close_old_connections()
    try:
        return spent_tokens(check)
    finally:
        close_old_connections()


def spent_tokens(check: Check) -> int:
    """What the usage records say the check's subject spent in its budget's period so far
    (blocking; one aggregate query). The seed of a budget counter."""
    since = datetime.fromtimestamp(check.period_start_s or 0, tz=timezone.utc)
    rows = UsageRecord.objects.filter(at__gte=since)
    rows = rows.filter(key_id=check.subject.id) if check.subject.kind == "key" else rows.filter(
        team_id=check.subject.id)
    if check.model_id is not None:
        rows = rows.filter(model_name=check.model_name)
    total = rows.aggregate(total=Sum(Coalesce(F("prompt_tokens"), 0) + Coalesce(F("completion_tokens"), 0)))["total"]
    return int(total or 0)


async def admit(tenancy: Tenancy, model, path: str, body: dict, raw_size: int,
                ) -> tuple[Admitted | None, dict[str, str], HttpResponse | None]:
    """Count a request of ``tenancy`` for ``model`` in its counters. Returns what to settle
    at its end (None: nothing counted), the ``x-ratelimit-*`` headers for its answer, and
    the refusal to answer instead (429, or 503 with Redis away and the policy closed), or
    None to go on."""
    if not tenancy.limited:
        return None, {}, None
    prompt_estimate, completion_bound = reservation_parts(path, body, raw_size, model)
    reserved = prompt_estimate + completion_bound
    now_s = time.time()
    checks = quotas.checks(tenancy, model.id, model.name, reserved, now_s)
    if not checks:
        return None, {}, None
    counters = backend()
    member = new_member()
    try:
        verdict = await counters.admit(checks, member)
        for _ in range(3):  # a seeded counter may expire between the two calls: ask again
            if not isinstance(verdict, NeedSeed):
                break
            await _seed(counters, checks, verdict.missing)
            verdict = await counters.admit(checks, member)
        if isinstance(verdict, NeedSeed):
            raise CountersAway("budget counters could not be seeded")
    except CountersAway as exc:
        policy = cache.admission_settings().rate_limits_without_redis
        outage.failed(exc, policy)
        if policy == "closed":
            return None, {}, openai_error(
                503, "Rate limits cannot be checked right now (their store is unreachable); retry shortly.",
                code="rate_limits_unavailable", headers={"Retry-After": "2"})
        return None, {}, None
    outage.recovered()
    if verdict.admitted:
        after = [v + c.amount for c, v in zip(checks, verdict.values)]
        # Stamped once the counters have it: a counter this very admission made is older.
        return (Admitted(checks, member, reserved, counters, time.time(), prompt_estimate),
                quotas.headers(checks, after, now_s), None)
    refused = quotas.refusal(checks, verdict, now_s, model.name)
    answer_headers = {**quotas.headers(checks, list(verdict.values), now_s), **quotas.retry_headers(refused)}
    return None, answer_headers, openai_error(429, refused.message, code=refused.code, error_type=refused.type,
                                               headers=answer_headers)


def settle_items(admitted: Admitted, prompt_tokens: int | None, completion_tokens: int | None,
                 answered: bool, refused_here: bool = False) -> tuple[list[tuple], list[tuple[str, str]]]:
    """The corrections for a finished request (``gateway.counters``: ``(key, delta, used,
    admitted_at_s)``): each token counter's real − reserved — a prompt the answer did not
    count is charged its estimate — and each concurrency slot's ``(key, member)`` to
    release. ``refused_here``: the gateway itself answered 400 after admission (a prompt over
    the context, too many prompts × n): the request is taken back from requests per minute
    and charged nothing."""
    if refused_here:
        used = 0
    else:
        if prompt_tokens is None and completion_tokens is not None:
            prompt_tokens = admitted.prompt_estimate
        used = quotas.settled_tokens(prompt_tokens, completion_tokens, admitted.reserved, answered)
    delta = used - admitted.reserved
    items, releases = [], []
    for c in admitted.checks:
        if c.kind == quotas.CONCURRENCY:
            releases.append((c.key, admitted.member))
        elif c.kind == quotas.REQUESTS:
            if refused_here:
                items.append((c.key, -1, 0, admitted.admitted_s))
        else:
            items.append((c.key, delta, used, admitted.admitted_s))
    return items, releases


_pending: set = set()


def settle(admitted: Admitted, prompt_tokens: int | None, completion_tokens: int | None, answered: bool,
           refused_here: bool = False) -> None:
    """Correct the counters of a finished request (:func:`settle_items`; no waiting: in this
    process at once, in Redis from a task; a Redis away loses the correction, and the slot
    frees itself when its lease ends)."""
    items, releases = settle_items(admitted, prompt_tokens, completion_tokens, answered, refused_here)
    counters = admitted.counters
    if isinstance(counters, LocalCounters):
        counters.settle_now(items, releases)
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    task = loop.create_task(_settle_quietly(counters, items, releases))
    _pending.add(task)
    task.add_done_callback(_pending.discard)


async def _settle_quietly(counters, items, releases) -> None:
    try:
        await counters.settle(items, releases)
    except CountersAway:
        log.debug("a settlement was lost: Redis away")
