"""The rules of tenants' limits, pure: which counters a request touches, whether it fits,
what the client is told (docs/architecture.md, "Tenants").

A request of a key is checked against the key's limits and its team's; every limit must
admit it (so the stricter wins). Each limit is one counter:

* ``requests`` — requests per minute: +1 at admission;
* ``tokens`` — tokens per minute: the request's *reservation* at admission (its prompt,
  estimated, plus the most it may generate), settled with the real count at the end;
* ``concurrency`` — requests at once: +1 at admission, −1 at the end;
* ``day`` / ``month`` — token budgets (for every model, or for one), reserved and settled as
  tokens per minute; kept for the whole UTC day or month and *seeded* from usage records
  when a counter is missing (a restart, a Redis that lost its data, a new day), so a restart
  is never a way around a spent budget.

Minutes are fixed windows (epoch minutes): a client may use a limit at the end of one minute
and again at the start of the next; the headers say when the window resets.

Everything here is a pure function of the limits, the request and ``now_s`` (epoch seconds);
the counters live in ``gateway.counters`` (this process, or Redis), which apply
:func:`decide` atomically.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone

#: Kinds of counter, as :class:`Check` names them.
REQUESTS, TOKENS, CONCURRENCY, DAY, MONTH = "requests", "tokens", "concurrency", "day", "month"
BUDGETS = (DAY, MONTH)

#: How long a minute counter outlives its window (seconds): settlements of long requests
#: still find it.
MINUTE_TTL_S = 3600
#: A day or month counter is kept this long past its period (seconds).
BUDGET_TTL_EXTRA_S = 2 * 86400


@dataclass(frozen=True)
class Subject:
    """A key or a team that carries limits. ``kind``: ``"key"`` or ``"team"``; limits in
    requests or tokens, None for none; ``model_budgets``: model id → (tokens per day,
    tokens per month[, version]) for that model alone."""

    kind: str
    id: int
    name: str
    #: What names its counters: never shared with another key or team, even one that got
    #: this one's id after it was deleted (a key's prefix; a team's id and creation time).
    uid: str = ""
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent_requests: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    model_budgets: dict[int, tuple] = field(default_factory=dict)
    #: When its budgets were last set (its row's ``updated_at``): part of the budget
    #: counters' names, so a budget removed and set again, or changed, counts afresh from
    #: the usage records rather than from a counter that stopped counting meanwhile. A
    #: model budget's third element is its own.
    budget_version: str = ""

    @property
    def tag(self) -> str:
        """``k…`` / ``t…``: the subject in counter names."""
        return f"{self.kind[0]}{self.uid or self.id}"

    @property
    def label(self) -> str:
        """How messages name it: ``key 'ci'`` / ``team 'research'``."""
        return f"{self.kind} '{self.name}'"

    def limits_anything(self) -> bool:
        return any(v is not None for v in (self.requests_per_minute, self.tokens_per_minute,
                                           self.max_concurrent_requests, self.tokens_per_day,
                                           self.tokens_per_month)) or bool(self.model_budgets)


@dataclass(frozen=True)
class Tenancy:
    """What a caller brings to admission: the subjects whose limits apply (its key and its
    key's team, those that limit something), who it is in the fair share (``tenant``: the
    team, or the key without one), its ``weight`` there and its ``priority`` class
    (``gateway.models.Priority``)."""

    subjects: tuple[Subject, ...] = ()
    tenant: str = "anonymous"
    weight: float = 1.0
    priority: int = 1

    @property
    def limited(self) -> bool:
        return bool(self.subjects)


UNLIMITED = Tenancy()


@dataclass(frozen=True)
class Check:
    """One counter a request touches. ``key``: the counter's name (unique per subject, model,
    kind and window); ``limit`` and ``amount`` in requests or tokens; ``ttl_s``: how long the
    counter lives once made; ``reset_at_s``: epoch seconds when the window ends (None: no
    window — concurrency); ``model_id``/``model_name``: set for a budget of one model;
    ``period_start_s``: for a budget, the start of its period (what a seed sums from)."""

    kind: str
    subject: Subject
    key: str
    limit: int
    amount: int
    ttl_s: int
    reset_at_s: float | None
    model_id: int | None = None
    model_name: str = ""
    period_start_s: float | None = None

    @property
    def is_budget(self) -> bool:
        return self.kind in BUDGETS


def _day_bounds(now_s: float) -> tuple[int, float, float]:
    day = int(now_s // 86400)
    return day, day * 86400.0, (day + 1) * 86400.0


def _month_bounds(now_s: float) -> tuple[int, float, float]:
    at = datetime.fromtimestamp(now_s, tz=timezone.utc)
    start = datetime(at.year, at.month, 1, tzinfo=timezone.utc)
    end = datetime(at.year + (at.month == 12), at.month % 12 + 1, 1, tzinfo=timezone.utc)
    return at.year * 12 + at.month - 1, start.timestamp(), end.timestamp()


def checks(tenancy: Tenancy, model_id: int, model_name: str, reserve_tokens: int, now_s: float) -> list[Check]:
    """The counters one request for model ``model_id`` touches, with ``reserve_tokens``
    (prompt estimate + the most it may generate) as its token amount."""
    out: list[Check] = []
    minute = int(now_s // 60)
    minute_end = (minute + 1) * 60.0
    day, day_start, day_end = _day_bounds(now_s)
    month, month_start, month_end = _month_bounds(now_s)
    for s in tenancy.subjects:
        tag = s.tag
        if s.requests_per_minute is not None:
            out.append(Check(REQUESTS, s, f"r:{tag}:{minute}", s.requests_per_minute, 1, MINUTE_TTL_S, minute_end))
        if s.tokens_per_minute is not None:
            out.append(Check(TOKENS, s, f"t:{tag}:{minute}", s.tokens_per_minute, reserve_tokens, MINUTE_TTL_S,
                             minute_end))
        if s.max_concurrent_requests is not None:
            out.append(Check(CONCURRENCY, s, f"c:{tag}", s.max_concurrent_requests, 1, 0, None))
        budgets = [(None, "", s.tokens_per_day, s.tokens_per_month, s.budget_version)]
        if model_id in s.model_budgets:
            per_day, per_month, *version = s.model_budgets[model_id]
            budgets.append((model_id, model_name, per_day, per_month, version[0] if version else ""))
        for mid, mname, per_day, per_month, version in budgets:
            scope = ("*" if mid is None else str(mid)) + (f"@{version}" if version else "")
            if per_day is not None:
                out.append(Check(DAY, s, f"d:{tag}:{scope}:{day}", per_day, reserve_tokens,
                                 int(day_end - now_s) + BUDGET_TTL_EXTRA_S, day_end, mid, mname, day_start))
            if per_month is not None:
                out.append(Check(MONTH, s, f"m:{tag}:{scope}:{month}", per_month, reserve_tokens,
                                 int(month_end - now_s) + BUDGET_TTL_EXTRA_S, month_end, mid, mname, month_start))
    return out


@dataclass(frozen=True)
class Verdict:
    """:func:`decide`'s answer: ``admitted``; ``values``: each check's counter before this
    request (same order as the checks); ``refused``: the indexes of the checks it would
    exceed (empty when admitted)."""

    admitted: bool
    values: tuple[int, ...]
    refused: tuple[int, ...] = ()


def decide(checks_: list[Check], values: list[int]) -> Verdict:
    """Admit only if every counter has room: ``value + amount ≤ limit`` for each (the
    counters' backends apply the same rule atomically; a test keeps them equal)."""
    refused = tuple(i for i, (c, v) in enumerate(zip(checks_, values)) if v + c.amount > c.limit)
    return Verdict(not refused, tuple(values), refused)


def settled_tokens(prompt_tokens: int | None, completion_tokens: int | None, reserved: int,
                   answered: bool) -> int:
    """The tokens a finished request is charged: its real count where the answer had one
    (prompt + completion; a missing half counts 0 when the other is known), else — an answer
    that came without usage — its reservation (the engine worked; we cannot say how much),
    or 0 for a request no engine answered (refused, failed, the client gone before)."""
    if prompt_tokens is not None or completion_tokens is not None:
        return (prompt_tokens or 0) + (completion_tokens or 0)
    return reserved if answered else 0


# ---- what the client is told -------------------------------------------------------------

def duration_text(seconds: float) -> str:
    """OpenAI's style for the ``x-ratelimit-reset-*`` headers: ``250ms``, ``1.5s``, ``6m0s``,
    ``2h3m0s``."""
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    if seconds < 60:
        text = f"{seconds:.3f}".rstrip("0").rstrip(".")
        return f"{text}s"
    total = int(seconds)
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m}m{s}s" if h else f"{m}m{s}s"


def _tightest(checks_: list[Check], after: list[int], kind: str) -> tuple[Check, int] | None:
    best = None
    for c, used in zip(checks_, after):
        if c.kind == kind:
            remaining = max(0, c.limit - used)
            if best is None or remaining < best[1]:
                best = (c, remaining)
    return best


def headers(checks_: list[Check], after: list[int], now_s: float) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers for the tightest requests-per-minute and
    tokens-per-minute limits among ``checks_``, ``after`` being each counter's value once
    this request is counted (or as it stands, for a refused one). Limits the caller does not
    have get no header."""
    out: dict[str, str] = {}
    for kind, suffix in ((REQUESTS, "requests"), (TOKENS, "tokens")):
        tight = _tightest(checks_, after, kind)
        if tight is None:
            continue
        check, remaining = tight
        out[f"x-ratelimit-limit-{suffix}"] = str(check.limit)
        out[f"x-ratelimit-remaining-{suffix}"] = str(remaining)
        out[f"x-ratelimit-reset-{suffix}"] = duration_text((check.reset_at_s or now_s) - now_s)
    return out


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: HTTP 429 with ``code`` (``rate_limit_exceeded``,
    ``insufficient_quota``), the error's ``type`` (``requests``, ``tokens``,
    ``concurrency``, ``insufficient_quota``), a message, how long to wait (seconds) and
    whether waiting helps (``retryable``: False for a spent budget or a request larger than
    the limit itself; the ``openai`` SDK reads ``x-should-retry``)."""

    code: str
    type: str
    message: str
    retry_after_s: float
    retryable: bool


_PER = {REQUESTS: "requests per minute (RPM)", TOKENS: "tokens per minute (TPM)",
        CONCURRENCY: "concurrent requests"}


def refusal(checks_: list[Check], verdict: Verdict, now_s: float, model_name: str) -> Refusal:
    """The answer for a refused request, from the checks it would exceed. A spent budget
    comes first (waiting a minute does not help), then a request larger than a limit itself,
    then the rate limit that frees last."""
    failing = [(checks_[i], verdict.values[i]) for i in verdict.refused]
    for c, used in failing:
        if c.is_budget:
            period = "today (UTC)" if c.kind == DAY else "this month (UTC)"
            scope = f" for '{c.model_name}'" if c.model_id is not None else ""
            wait_s = (c.reset_at_s or now_s) - now_s
            return Refusal(
                "insufficient_quota", "insufficient_quota",
                f"You exceeded your current quota: {c.subject.label} has used {used:,} of its {c.limit:,} tokens"
                f"{scope} {period}; this request may use up to {c.amount:,}. The budget renews in "
                f"{_readable(wait_s)}.", wait_s, False)
    for c, used in failing:
        if c.kind in (TOKENS, REQUESTS) and c.amount > c.limit:
            return Refusal(
                "rate_limit_exceeded", c.kind,
                f"Request too large for '{model_name}': {c.subject.label} has a limit of {c.limit:,} "
                f"{_PER[c.kind]}, and this request may use up to {c.amount:,} (its prompt and max_tokens). "
                "Lower max_tokens or shorten the prompt.", 0.0, False)
    worst = max(failing, key=lambda f: (f[0].reset_at_s is not None, f[0].reset_at_s or 0.0))
    c, used = worst
    if c.kind == CONCURRENCY:
        wait_s = 1.0
        detail = f"Limit {c.limit}, in progress {used}. Try again when one of them ends."
    else:
        wait_s = max(0.001, (c.reset_at_s or now_s) - now_s)
        detail = (f"Limit {c.limit:,}, Used {used:,}, Requested {c.amount:,}. Please try again in "
                  f"{duration_text(wait_s)}.")
    return Refusal("rate_limit_exceeded", c.kind,
                   f"Rate limit reached for '{model_name}' on {_PER[c.kind]} of {c.subject.label}: {detail}",
                   wait_s, True)


def _readable(seconds: float) -> str:
    seconds = max(0, int(math.ceil(seconds)))
    d, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m = rest // 60
    if d:
        return f"{d} d {h} h"
    if h:
        return f"{h} h {m} min"
    return f"{max(m, 1)} min" if seconds >= 60 else f"{seconds} s"


def retry_headers(refused: Refusal) -> dict[str, str]:
    """``Retry-After`` (whole seconds, at least 1), ``retry-after-ms`` and
    ``x-should-retry`` for a 429: the ``openai`` SDK waits what they say (when ≤ 60 s) and does
    not retry a refusal that waiting does not cure. A request larger than the limit itself
    gets only ``x-should-retry: false`` (no wait would help); a spent budget, the time until
    it renews."""
    if not refused.retryable and refused.retry_after_s <= 0:
        return {"x-should-retry": "false"}  # too large for the limit: no wait makes it fit
    wait_s = max(refused.retry_after_s, 0.001)
    return {"Retry-After": str(max(1, math.ceil(wait_s))), "retry-after-ms": str(max(1, math.ceil(wait_s * 1000))),
            "x-should-retry": "true" if refused.retryable else "false"}
