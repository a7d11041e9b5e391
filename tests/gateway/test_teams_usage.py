"""``gateway.tenant_usage``: where a key or team stands against its limits, with the
gateway's own counter names, from this process's counters, Redis, or the usage records."""

from __future__ import annotations

import datetime
import time

import pytest
from asgiref.sync import async_to_sync
from django.test import override_settings

from gateway import cache, quotas, tenant_usage, tenants
from gateway.counters import LocalCounters, RedisCounters
from gateway.models import ApiKey, ModelBudget, Team, UsageRecord
from tests.pg import private_redis

pytestmark = pytest.mark.django_db

#: The middle of a minute: nothing here is near a window's edge.
NOW_S = (int(time.time() // 60) - 1) * 60 + 30.0


def at(seconds_before: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(NOW_S - seconds_before, tz=datetime.timezone.utc)


@pytest.fixture
def no_live_counters(settings):
    """Embedded mode, and a process that has admitted nothing (the CI's Redis pass too)."""
    settings.REDIS_URL = ""
    tenants.use_backend(None)
    yield
    tenants.use_backend(None)


@pytest.fixture
def redis_url():
    """A Redis of this test's own."""
    with private_redis() as server:
        yield server.url


@pytest.fixture
def limited(make_model, no_live_counters):
    model = make_model("chat")
    team = Team.objects.create(name="research", requests_per_minute=100, tokens_per_day=50_000)
    key, _ = ApiKey.create_key("ci", team=team, requests_per_minute=10, tokens_per_minute=1000,
                               max_concurrent_requests=2, tokens_per_month=90_000)
    ModelBudget.objects.create(key=key, model=model, tokens_per_day=500)
    return {"model": model, "team": team, "key": key}


def cached_tenancy(key: ApiKey) -> quotas.Tenancy:
    """The tenancy the gateway admits ``key``'s requests with (its key cache)."""
    (cached,) = cache.load()[cache._KEYS][key.prefix]
    return cached.tenancy


def test_the_counters_are_named_exactly_as_the_gateway_names_them(limited):
    key, model = limited["key"], limited["model"]
    gateway = {c.key for c in quotas.checks(cached_tenancy(key), model.pk, model.name, 1, NOW_S)}
    key_subject = tenant_usage.subject_of("key", key)
    team_subject = tenant_usage.subject_of("team", limited["team"])
    ours = {c.key for s in (key_subject, team_subject)
            for c in tenant_usage.subject_checks(s, {model.pk: model.name}, NOW_S)}
    assert ours == gateway


def test_a_key_that_limits_nothing_has_no_limits_to_show(no_live_counters):
    key, _ = ApiKey.create_key("free")
    found = tenant_usage.usage("key", key, NOW_S)
    assert found["limits"] == {} and found["model_budgets"] == {} and found["source"] == "usage records"


def test_this_processs_counters_are_read_live(limited):
    key, model = limited["key"], limited["model"]
    counters = LocalCounters(clock=lambda: NOW_S)
    tenants.use_backend(counters)
    checks = quotas.checks(cached_tenancy(key), model.pk, model.name, 120, NOW_S)
    for check in checks:
        if check.is_budget:
            counters._values[check.key] = [0, NOW_S + 3600, NOW_S]  # seeded: nothing spent before
    assert counters.admit_now(checks, "m1").admitted
    found = tenant_usage.usage("key", key, NOW_S)
    assert found["source"] == "web process"
    minute_end = datetime.datetime.fromtimestamp((NOW_S // 60 + 1) * 60, tz=datetime.timezone.utc).isoformat()
    assert found["limits"]["requests_per_minute"] == {"limit": 10, "used": 1, "remaining": 9,
                                                      "resets_at": minute_end}
    assert found["limits"]["tokens_per_minute"]["used"] == 120
    assert found["limits"]["max_concurrent_requests"] == {"limit": 2, "used": 1, "remaining": 1,
                                                          "resets_at": None}
    assert found["limits"]["tokens_per_month"]["remaining"] == 90_000 - 120
    assert found["model_budgets"] == {"chat": {"tokens_per_day": {
        "limit": 500, "used": 120, "remaining": 380,
        "resets_at": datetime.datetime.fromtimestamp((NOW_S // 86400 + 1) * 86400,
                                                     tz=datetime.timezone.utc).isoformat()}}}
    team = tenant_usage.usage("team", limited["team"], NOW_S)
    assert team["limits"]["requests_per_minute"]["used"] == 1 and team["limits"]["tokens_per_day"]["used"] == 120


def test_a_budget_counter_not_made_yet_reads_as_the_records_spent(limited):
    key = limited["key"]
    tenants.use_backend(LocalCounters(clock=lambda: NOW_S))
    UsageRecord.objects.create(at=at(120), key=key, team_id=limited["team"].pk, model_name="chat", path="x",
                               status=200, prompt_tokens=30, completion_tokens=12, total_ms=1)
    found = tenant_usage.usage("key", key, NOW_S)
    assert found["source"] == "web process"
    assert found["limits"]["tokens_per_month"]["used"] == 42
    assert found["limits"]["requests_per_minute"]["used"] == 0  # nothing admitted by this process


def test_without_live_counters_the_usage_records_say_it(limited):
    key, team = limited["key"], limited["team"]
    for seconds_before, tokens in ((1, 10), (20, 5), (90, 100)):  # two this minute, one the minute before
        UsageRecord.objects.create(at=at(seconds_before), key=key, team_id=team.pk, model_name="chat", path="x",
                                   status=200, prompt_tokens=tokens, completion_tokens=None, total_ms=1)
    # Refused at admission (a 429 of the gateway's own): never counted. An engine's 429 was admitted.
    UsageRecord.objects.create(at=at(2), key=key, team_id=team.pk, model_name="chat", path="x", status=429,
                               total_ms=1)
    UsageRecord.objects.create(at=at(3), key=key, team_id=team.pk, model_name="chat", path="x", status=429,
                               upstream_status=429, total_ms=1)
    found = tenant_usage.usage("key", key, NOW_S)
    assert found["source"] == "usage records"
    assert found["limits"]["requests_per_minute"]["used"] == 3
    assert found["limits"]["tokens_per_minute"]["used"] == 15
    assert found["limits"]["max_concurrent_requests"]["used"] is None
    assert found["limits"]["max_concurrent_requests"]["remaining"] is None
    assert found["limits"]["tokens_per_month"]["used"] == 115
    assert found["model_budgets"]["chat"]["tokens_per_day"]["used"] == 115
    by_team = tenant_usage.usage("team", team, NOW_S)
    assert by_team["limits"]["requests_per_minute"]["used"] == 3
    assert by_team["limits"]["tokens_per_day"]["used"] == 115
    assert tenant_usage.entry_text(found["limits"]["max_concurrent_requests"]).startswith(
        tenant_usage.CONCURRENCY_ELSEWHERE)


def test_redis_unreachable_falls_back_to_the_records_and_says_why(limited):
    tenants.use_backend(RedisCounters("redis://127.0.0.1:1/0", "test"))
    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
        found = tenant_usage.usage("key", limited["key"], NOW_S)
    assert found["source"] == "usage records" and found["note"].startswith("Redis unreachable")
    assert found["limits"]["requests_per_minute"]["used"] == 0


def test_redis_counters_are_read_live_from_any_process(limited, redis_url, settings):
    key, model = limited["key"], limited["model"]
    counters = RedisCounters(redis_url, "usage-test", clock=lambda: NOW_S)
    settings.REDIS_URL = redis_url
    tenants.use_backend(counters)
    checks = quotas.checks(cached_tenancy(key), model.pk, model.name, 50, NOW_S)
    for check in checks:
        if check.is_budget:
            async_to_sync(counters.seed)(check.key, 0, 3600)
    assert async_to_sync(counters.admit)(checks, "m1").admitted
    found = tenant_usage.usage("key", key, NOW_S)
    assert found["source"] == "redis" and "note" not in found
    assert found["limits"]["requests_per_minute"]["used"] == 1
    assert found["limits"]["tokens_per_minute"]["used"] == 50
    assert found["limits"]["max_concurrent_requests"]["used"] == 1
    assert found["model_budgets"]["chat"]["tokens_per_day"]["remaining"] == 450
    async_to_sync(counters.settle)([], [(c.key, "m1") for c in checks if c.kind == quotas.CONCURRENCY])
    assert tenant_usage.usage("key", key, NOW_S)["limits"]["max_concurrent_requests"]["used"] == 0


def test_a_kind_that_is_neither_key_nor_team_is_refused(limited):
    with pytest.raises(ValueError):
        tenant_usage.usage("user", limited["key"])


def test_limits_text_names_the_set_limits():
    assert tenant_usage.limits_text({"requests_per_minute": 60, "tokens_per_minute": 10_000,
                                     "max_concurrent_requests": None}) == "60 RPM, 10,000 TPM"
    assert tenant_usage.limits_text({"tokens_per_day": None}) == "none"


async def test_the_async_variant_answers_the_same(limited):
    assert (await tenant_usage.ausage("team", limited["team"], NOW_S))["limits"]["tokens_per_day"]["limit"] == 50_000
