"""``llmgw teams …`` and ``llmgw keys create|set|list|budget`` with teams, priorities,
limits and model budgets: what is stored, what is printed, and the exit codes (0 ok,
1 not found, 2 bad usage)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from gateway import tenant_usage, tenants
from gateway.models import ApiKey, ModelBudget, Priority, Team, UsageRecord
from tests.cli import llmgw

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_live_counters(settings):
    """A CLI process in embedded mode: no counters of its own."""
    settings.REDIS_URL = ""
    tenants.use_backend(None)
    yield
    tenants.use_backend(None)


def test_teams_create_list_show_set_and_delete(make_model):
    code, out, err = llmgw("teams", "create", "research", "--rpm", "600", "--tokens-per-day", "1000000",
                           "--priority", "high", "--weight", "2")
    assert code == 0, err
    assert "created team research" in out and "600 RPM" in out
    team = Team.objects.get()
    assert (team.requests_per_minute, team.tokens_per_day, team.priority, team.weight) == (
        600, 1_000_000, Priority.HIGH, 2.0)
    ApiKey.create_key("ci", team=team)
    code, out, _ = llmgw("teams", "list")
    assert code == 0 and "research" in out and "600 RPM" in out and "RPM 0/600" in out
    assert "usage from usage records" in out
    (listed,) = json.loads(llmgw("teams", "list", "--json")[1])
    assert listed["members"] == 1 and listed["limits"]["requests_per_minute"] == 600
    assert listed["usage"]["source"] == "usage records"
    code, out, _ = llmgw("teams", "show", "research")
    assert code == 0 and "ci" in out and "requests per minute" in out and "600" in out
    assert llmgw("teams", "set", "research", "--rpm", "none", "--tpm", "5000")[0] == 0
    team.refresh_from_db()
    assert (team.requests_per_minute, team.tokens_per_minute) == (None, 5000)
    code, out, _ = llmgw("teams", "delete", "research")
    assert code == 0 and "1 key(s) now have no team" in out
    assert not Team.objects.exists() and ApiKey.objects.get().team is None


@pytest.mark.parametrize(("args", "message"), [
    (("teams", "create", "t", "--rpm", "0"), "--rpm must be at least 1"),
    (("teams", "create", "t", "--tpm", "lots"), "--tpm must be a whole number or 'none'"),
    (("teams", "create", "t", "--priority", "urgent"), "--priority must be low, normal or high"),
    (("teams", "create", "t", "--weight", "0"), "weight: Ensure this value is greater than or equal to 0.01."),
    (("teams", "create"), "teams create needs the team's NAME"),
    (("keys", "create", "k", "--team", "nope"), "no team called 'nope'"),
    (("keys", "create", "k", "--concurrency", "-1"), "--concurrency must be at least 1"),
    (("teams", "create", "t", "--weight", "nan"), "weight: The weight must be a number"),
    (("teams", "create", "t\nx"), "cannot contain control characters"),
    (("keys", "create", "k", "--rpm", "99999999999999999999"), "less than or equal to"),
])
def test_bad_values_and_unknown_teams_are_bad_usage_and_change_nothing(args, message):
    code, _, err = llmgw(*args)
    assert code == 2 and message in err, err
    assert not Team.objects.exists() and not ApiKey.objects.exists()


def test_a_team_that_does_not_exist_is_not_found_and_a_second_of_a_name_refused():
    assert llmgw("teams", "show", "ghost")[0] == 1
    assert llmgw("teams", "create", "research")[0] == 0
    code, _, err = llmgw("teams", "create", "research")
    assert code == 1 and "exists" in err and Team.objects.count() == 1


def test_keys_create_in_a_team_with_limits_and_priority():
    Team.objects.create(name="research")
    code, out, err = llmgw("keys", "create", "ci", "--team", "research", "--rpm", "10", "--tpm", "1000",
                           "--concurrency", "2", "--tokens-per-day", "100", "--tokens-per-month", "1000",
                           "--priority", "low")
    assert code == 0, err
    assert "team research, priority low" in out
    key = ApiKey.objects.get()
    assert (key.team.name, key.priority, key.requests_per_minute, key.tokens_per_minute,
            key.max_concurrent_requests, key.tokens_per_day, key.tokens_per_month) == (
        "research", Priority.LOW, 10, 1000, 2, 100, 1000)


def test_keys_set_changes_and_clears_limits_team_and_priority():
    team = Team.objects.create(name="research")
    key, _ = ApiKey.create_key("ci", requests_per_minute=10, priority=Priority.HIGH)
    code, out, err = llmgw("keys", "set", "ci", "--rpm", "none", "--tpm", "900", "--team", "research",
                           "--priority", "none")
    assert code == 0, err
    key.refresh_from_db()
    assert (key.requests_per_minute, key.tokens_per_minute, key.team, key.priority) == (None, 900, team, None)
    assert llmgw("keys", "set", key.prefix[:14], "--team", "none")[0] == 0  # by prefix
    key.refresh_from_db()
    assert key.team is None
    assert llmgw("keys", "set", "ghost", "--rpm", "1")[0] == 1
    code, _, err = llmgw("keys", "set", "ci")
    assert code == 2 and "needs something to set" in err
    code, _, err = llmgw("keys", "set", "ci", "--team", "nope")
    assert code == 2 and "no team called 'nope'" in err
    assert ApiKey.objects.get().tokens_per_minute == 900


def test_keys_list_shows_team_limits_and_usage_and_where_it_comes_from():
    team = Team.objects.create(name="research")
    key, _ = ApiKey.create_key("ci", team=team, requests_per_minute=10, max_concurrent_requests=2)
    code, out, _ = llmgw("keys", "list")
    assert code == 0
    assert "research" in out and "10 RPM, 2 at once" in out and "RPM 0/10" in out and "—/2" in out
    assert "usage from usage records; requests at once: — (live in the web process)" in out
    (row,) = json.loads(llmgw("keys", "list", "--json")[1])
    assert row["team"] == "research" and row["limits"]["requests_per_minute"] == 10
    assert row["usage"]["limits"]["max_concurrent_requests"]["used"] is None


def test_keys_list_says_a_key_without_limits_has_none_to_count_against():
    ApiKey.create_key("free")
    code, out, _ = llmgw("keys", "list")
    assert code == 0 and "no limits" in out


def test_budgets_for_one_model_are_set_kept_and_removed(make_model):
    make_model("chat")
    Team.objects.create(name="research")
    ApiKey.create_key("ci")
    assert llmgw("teams", "budget", "research", "--model", "chat", "--tokens-per-day", "100")[0] == 0
    assert llmgw("teams", "budget", "research", "--model", "chat", "--tokens-per-month", "2000")[0] == 0
    assert list(ModelBudget.objects.values_list("team__name", "tokens_per_day", "tokens_per_month")) == [
        ("research", 100, 2000)]
    code, out, _ = llmgw("keys", "budget", "ci", "--model", "chat", "--tokens-per-day", "5", "--json")
    assert code == 0 and json.loads(out)["model_budgets"] == {"chat": {"tokens_per_day": 5, "tokens_per_month": None}}
    code, _, err = llmgw("keys", "budget", "ci", "--model", "nope", "--tokens-per-day", "5")
    assert code == 2 and "no model called 'nope'" in err
    code, _, err = llmgw("keys", "budget", "ci", "--model", "chat")
    assert code == 2 and "--tokens-per-day" in err
    code, out, _ = llmgw("teams", "budget", "research", "--model", "chat", "--tokens-per-day", "none",
                         "--tokens-per-month", "none")
    assert code == 0 and "removed" in out
    assert list(ModelBudget.objects.values_list("key__name", flat=True)) == ["ci"]


def test_status_shows_the_admission_settings(settings):
    settings.REDIS_URL = "redis://127.0.0.1:6379/15"
    code, out, _ = llmgw("status")
    assert code == 0 and "while Redis is unreachable, limited keys are admitted uncounted" in out
    assert "rate_limits_without_redis=open" in out
    settings.REDIS_URL = ""  # embedded mode: no Redis to lose, the web process counts
    code, out, _ = llmgw("status")
    assert code == 0 and "counted by the web process (embedded mode, no Redis)" in out
    assert "rate_limits_without_redis" not in out
    assert json.loads(llmgw("status", "--json")[1])["admission"] == {"rate_limits_without_redis": "open",
                                                                     "admission_wait_s": 30}


def test_keys_list_counts_requests_per_minute_as_the_limiter_does_not_every_usage_record(monkeypatch):
    key, _ = ApiKey.create_key("ci", requests_per_minute=60)
    now_s = (int(time.time() // 60) - 1) * 60 + 30.0  # the middle of a minute, whenever the test runs
    monkeypatch.setattr(tenant_usage, "time", SimpleNamespace(time=lambda: now_s))
    at = datetime.fromtimestamp(now_s - 1, tz=UTC)
    for status, upstream in ((200, 200), (200, 200), (502, None), (499, None), (400, 400),  # admitted: 5
                             (404, None), (400, None), (429, None), (403, None)):  # refused before or at admission
        UsageRecord.objects.create(at=at, key=key, model_name="chat", path="chat/completions", status=status,
                                   upstream_status=upstream, total_ms=1)
    assert "RPM 5/60" in llmgw("keys", "list")[1]
    data = json.loads(llmgw("keys", "list", "--json")[1])
    assert data[0]["usage"]["limits"]["requests_per_minute"]["used"] == 5
