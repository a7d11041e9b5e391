"""The tenants' limit rules (``gateway.quotas``) and the in-process counters, without a
database: each limit at its edge, reservation and settlement, the stricter of key and team,
budgets seeded, headers and refusals as OpenAI words them."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from gateway import quotas
from gateway.counters import LocalCounters, NeedSeed
from gateway.quotas import Subject, Tenancy

NOW = datetime(2026, 12, 1, 10, 0, 30, tzinfo=timezone.utc).timestamp()  # 30 s into a minute


def tenancy(key: dict | None = None, team: dict | None = None) -> Tenancy:
    subjects = []
    if key is not None:
        subjects.append(Subject("key", 1, "ci", **key))
    if team is not None:
        subjects.append(Subject("team", 7, "research", **team))
    return Tenancy(tuple(subjects), "team:7" if team is not None else "key:1")


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def admit(counters, t: Tenancy, reserve: int = 10, model_id: int = 1, member: str = "m"):
    checks = quotas.checks(t, model_id, "gemma", reserve, counters.clock())
    verdict = await counters.admit(checks, member)
    return checks, verdict


async def test_requests_per_minute_admits_the_limit_and_refuses_one_more_until_the_minute_ends():
    counters, clock = LocalCounters(Clock()), None
    t = tenancy(key={"requests_per_minute": 3})
    for _ in range(3):
        _, verdict = await admit(counters, t)
        assert verdict.admitted
    checks, verdict = await admit(counters, t)
    assert not verdict.admitted
    refused = quotas.refusal(checks, verdict, NOW, "gemma")
    assert refused.code == "rate_limit_exceeded" and refused.type == "requests" and refused.retryable
    assert refused.retry_after_s == pytest.approx(30.0)
    assert "Limit 3, Used 3, Requested 1" in refused.message and "key 'ci'" in refused.message
    clock = counters.clock
    clock.now += 30  # the next minute
    assert (await admit(counters, t))[1].admitted


async def test_tokens_per_minute_reserve_at_admission_and_settle_with_the_real_count():
    counters = LocalCounters(Clock())
    t = tenancy(key={"tokens_per_minute": 100})
    checks, verdict = await admit(counters, t, reserve=60)
    assert verdict.admitted
    # A second request of 60 does not fit while the first holds its reservation…
    assert not (await admit(counters, t, reserve=60))[1].admitted
    # …and does once the first settles at its real 20 tokens (60 reserved − 40).
    counters.settle_now([(c.key, 20 - 60) for c in checks if c.kind == "tokens"])
    assert (await admit(counters, t, reserve=60))[1].admitted  # 20 + 60 ≤ 100
    assert (await admit(counters, t, reserve=20))[1].admitted  # exactly at the edge: 100
    assert not (await admit(counters, t, reserve=1))[1].admitted


async def test_a_request_larger_than_the_limit_itself_is_not_worth_retrying():
    counters = LocalCounters(Clock())
    checks, verdict = await admit(counters, tenancy(key={"tokens_per_minute": 100}), reserve=101)
    refused = quotas.refusal(checks, verdict, NOW, "gemma")
    assert not refused.retryable and "Request too large" in refused.message
    assert quotas.retry_headers(refused) == {"x-should-retry": "false"}


async def test_concurrency_counts_until_release():
    counters = LocalCounters(Clock())
    t = tenancy(key={"max_concurrent_requests": 2})
    a, _ = await admit(counters, t, member="a")
    await admit(counters, t, member="b")
    checks, verdict = await admit(counters, t, member="c")
    assert not verdict.admitted
    assert quotas.refusal(checks, verdict, NOW, "gemma").type == "concurrency"
    counters.settle_now([], [(c.key, "a") for c in a if c.kind == "concurrency"])
    assert (await admit(counters, t, member="c"))[1].admitted


@pytest.mark.parametrize("kind", ["tokens_per_day", "tokens_per_month"])
async def test_budgets_need_a_seed_then_refuse_as_insufficient_quota(kind):
    counters = LocalCounters(Clock())
    t = tenancy(team={kind: 1000})
    checks, verdict = await admit(counters, t, reserve=100)
    assert isinstance(verdict, NeedSeed)  # never decided from an empty counter
    budget = checks[verdict.missing[0]]
    await counters.seed(budget.key, 950, budget.ttl_s)  # what usage records say was spent
    checks, verdict = await admit(counters, t, reserve=50)
    assert verdict.admitted  # 950 + 50 = 1000, the edge
    checks, verdict = await admit(counters, t, reserve=1)
    refused = quotas.refusal(checks, verdict, NOW, "gemma")
    assert refused.code == "insufficient_quota" and not refused.retryable
    assert "team 'research' has used 1,000 of its 1,000 tokens" in refused.message
    await counters.seed(budget.key, 0, budget.ttl_s)  # a second seed never overwrites
    assert not (await admit(counters, t, reserve=1))[1].admitted


async def test_a_budget_renews_with_the_utc_day_and_month():
    day = quotas.checks(tenancy(key={"tokens_per_day": 5}), 1, "m", 1, NOW)[0]
    month = quotas.checks(tenancy(key={"tokens_per_month": 5}), 1, "m", 1, NOW)[0]
    assert day.reset_at_s == datetime(2026, 12, 2, tzinfo=timezone.utc).timestamp()
    assert day.period_start_s == datetime(2026, 12, 1, tzinfo=timezone.utc).timestamp()
    assert month.reset_at_s == datetime(2027, 1, 1, tzinfo=timezone.utc).timestamp()
    assert month.period_start_s == datetime(2026, 12, 1, tzinfo=timezone.utc).timestamp()
    assert day.ttl_s > day.reset_at_s - NOW  # kept past its period for late settlements


async def test_a_model_budget_counts_apart_from_the_budget_for_every_model():
    subject = Subject("key", 1, "ci", tokens_per_day=1000, model_budgets={5: (100, None)})
    t = Tenancy((subject,), "key:1")
    checks = quotas.checks(t, 5, "gemma", 10, NOW)
    assert [(c.kind, c.model_id) for c in checks] == [("day", None), ("day", 5)]
    assert checks[0].key != checks[1].key
    assert [(c.kind, c.model_id) for c in quotas.checks(t, 6, "other", 10, NOW)] == [("day", None)]


async def test_the_stricter_of_key_and_team_wins_and_nothing_is_counted_when_refused():
    counters = LocalCounters(Clock())
    t = tenancy(key={"requests_per_minute": 10}, team={"requests_per_minute": 2})
    assert (await admit(counters, t))[1].admitted
    assert (await admit(counters, t))[1].admitted
    checks, verdict = await admit(counters, t)
    assert not verdict.admitted and [checks[i].subject.kind for i in verdict.refused] == ["team"]
    # The refused request counted nowhere: the key's counter says 2, not 3.
    assert await counters.peek([checks[0].key]) == [2]


async def test_headers_show_the_tightest_limit_and_its_reset():
    t = tenancy(key={"requests_per_minute": 10, "tokens_per_minute": 1000},
                team={"requests_per_minute": 4, "tokens_per_minute": 5000})
    checks = quotas.checks(t, 1, "m", 100, NOW)
    after = [3 if c.kind == "requests" and c.subject.kind == "team" else 1 if c.kind == "requests" else 100
             for c in checks]
    h = quotas.headers(checks, after, NOW)
    assert h == {"x-ratelimit-limit-requests": "4", "x-ratelimit-remaining-requests": "1",
                 "x-ratelimit-reset-requests": "30s", "x-ratelimit-limit-tokens": "1000",
                 "x-ratelimit-remaining-tokens": "900", "x-ratelimit-reset-tokens": "30s"}
    assert quotas.headers(quotas.checks(tenancy(key={"max_concurrent_requests": 1}), 1, "m", 1, NOW), [1], NOW) == {}


@pytest.mark.parametrize("seconds,text", [(0.25, "250ms"), (0.0001, "1ms"), (1.5, "1.5s"), (59.999, "59.999s"),
                                          (360, "6m0s"), (7380, "2h3m0s")])
def test_durations_read_like_openai_headers(seconds, text):
    assert quotas.duration_text(seconds) == text


def test_retry_headers_round_up_and_say_whether_to_retry():
    refused = quotas.Refusal("rate_limit_exceeded", "requests", "…", 2.2, True)
    assert quotas.retry_headers(refused) == {"Retry-After": "3", "retry-after-ms": "2200", "x-should-retry": "true"}


@pytest.mark.parametrize("prompt,completion,reserved,answered,charged", [
    (10, 5, 100, True, 15), (None, 7, 100, True, 7), (None, None, 100, True, 100), (None, None, 100, False, 0)])
def test_settled_tokens(prompt, completion, reserved, answered, charged):
    assert quotas.settled_tokens(prompt, completion, reserved, answered) == charged


async def test_counters_expire_with_their_window():
    clock = Clock()
    counters = LocalCounters(clock)
    t = tenancy(key={"requests_per_minute": 1})
    checks, _ = await admit(counters, t)
    clock.now += quotas.MINUTE_TTL_S + 1
    assert await counters.peek([checks[0].key]) == [None]
    counters.settle_now([(checks[0].key, 5)])  # a settlement never brings a counter back
    assert await counters.peek([checks[0].key]) == [None]


async def test_a_counter_made_again_during_a_request_gets_what_it_really_used():
    """A budget counter lost mid-request (a Redis that lost its data) and seeded again from
    the records never held the request's reservation: its settlement adds what it used,
    not real − reserved (which would erase what the records already counted)."""
    clock = Clock()
    counters = LocalCounters(clock)
    t = tenancy(key={"tokens_per_day": 100_000})
    checks = quotas.checks(t, 1, "m", 5000, clock.now)
    await counters.seed(checks[0].key, 5000, checks[0].ttl_s)
    assert (await counters.admit(checks, "a")).admitted  # 10,000 with the reservation
    admitted_s = clock.now
    counters._values.clear()  # lost
    clock.now += 3
    await counters.seed(checks[0].key, 5000, checks[0].ttl_s)  # the records: the request's not written yet
    counters.settle_now([(checks[0].key, 400 - 5000, 400, admitted_s)])
    assert await counters.peek([checks[0].key]) == [5400]
    # A counter that held the reservation gets real − reserved.
    assert (await counters.admit(checks, "b")).admitted  # 10,400
    counters.settle_now([(checks[0].key, 400 - 5000, 400, clock.now)])
    assert await counters.peek([checks[0].key]) == [5800]


def test_a_budget_set_again_counts_afresh_from_the_records():
    """Budget counters are named by when the budget was set: removed and set again (or
    changed), it is seeded again from the usage records, not read from a counter that did
    not count meanwhile."""
    before = quotas.checks(Tenancy((Subject("key", 1, "ci", "1.a", tokens_per_day=10, budget_version="1.0",
                                            model_budgets={5: (10, None, "2.0")}),)), 5, "m", 1, NOW)
    after = quotas.checks(Tenancy((Subject("key", 1, "ci", "1.a", tokens_per_day=10, budget_version="3.0",
                                           model_budgets={5: (10, None, "4.0")}),)), 5, "m", 1, NOW)
    assert {c.key for c in before}.isdisjoint(c.key for c in after)


def test_settlement_charges_the_prompt_estimate_when_the_answer_counts_only_completion():
    from gateway.tenants import Admitted, settle_items

    checks = quotas.checks(tenancy(key={"tokens_per_day": 1000, "requests_per_minute": 5}), 1, "m", 110, NOW)
    admitted = Admitted(checks, "m", 110, None, NOW, prompt_estimate=100)
    items, _ = settle_items(admitted, None, 7, answered=True)
    assert [(delta, used) for _, delta, used, _ in items] == [(107 - 110, 107)]
    # The gateway's own 400 after admission: the request is taken back, nothing charged.
    items, _ = settle_items(admitted, None, None, answered=False, refused_here=True)
    assert sorted((c.split(":")[0], delta) for c, delta, _, _ in items) == [("d", -110), ("r", -1)]


def test_a_list_of_token_id_prompts_reserves_a_completion_for_each():
    from types import SimpleNamespace

    from gateway.tenants import reservation_parts

    model = SimpleNamespace(default_max_tokens=None, token_limits=lambda: (None, None))
    texts = reservation_parts("completions", {"prompt": ["a"] * 10, "max_tokens": 100}, 0, model)
    ids = reservation_parts("completions", {"prompt": [[1]] * 10, "max_tokens": 100}, 0, model)
    assert texts[1] == ids[1] == 1000


async def test_a_verdict_reached_on_the_last_seeding_round_is_kept(monkeypatch):
    from types import SimpleNamespace

    from gateway import tenants

    class SlowToSeed(LocalCounters):
        """Asks for a seed three times (seeded counters expired meanwhile), then decides."""

        calls = 0

        async def admit(self, checks, member):
            self.calls += 1
            return NeedSeed((0,)) if self.calls <= 3 else await super().admit(checks, member)

    monkeypatch.setattr(tenants, "spent_tokens", lambda check: 0)
    tenants.use_backend(SlowToSeed())
    try:
        model = SimpleNamespace(id=1, name="m", default_max_tokens=None, token_limits=lambda: (None, None))
        admitted, _, refused = await tenants.admit(tenancy(key={"tokens_per_day": 100}), model, "embeddings",
                                                   {"input": "x"}, 1)
    finally:
        tenants.use_backend(None)
    assert refused is None and admitted is not None
