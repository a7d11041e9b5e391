"""REST API for teams and for keys' team, priority, limits and model budgets (/api/teams/,
/api/keys/): what is stored, what detail answers say of usage, field messages for bad
values. Who may call each endpoint is tests/llmgw/test_permissions.py's."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from gateway import tenants
from gateway.models import ApiKey, ModelBudget, Priority, Team
from tests.ops.test_api import basic, grant_every_llmgw_permission

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(django_user_model, settings):
    grant_every_llmgw_permission(django_user_model.objects.create_user("ops", password="pw", is_staff=True))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=basic("ops", "pw"))
    settings.REDIS_URL = ""  # embedded mode, as the usage source asserted below
    tenants.use_backend(None)
    yield client
    tenants.use_backend(None)


@pytest.fixture
def models(make_model):
    return make_model("chat"), make_model("embed")


def test_a_team_is_created_with_limits_priority_weight_and_budgets(api, models):
    answer = api.post("/api/teams/", {"name": "research", "priority": "high", "weight": 2.5,
                                      "requests_per_minute": 600, "tokens_per_day": 1_000_000,
                                      "model_budgets": [{"model": "chat", "tokens_per_month": 5000}]}, format="json")
    assert answer.status_code == 201, answer.content
    team = Team.objects.get(name="research")
    assert (team.priority, team.weight, team.requests_per_minute, team.tokens_per_day) == (
        Priority.HIGH, 2.5, 600, 1_000_000)
    assert list(team.model_budgets.values_list("model__name", "tokens_per_day", "tokens_per_month")) == [
        ("chat", None, 5000)]
    body = answer.json()
    assert body["priority"] == "high" and body["members"] == 0
    assert body["model_budgets"] == [{"model": "chat", "tokens_per_day": None, "tokens_per_month": 5000}]


def test_team_detail_says_its_usage_and_the_list_its_members(api, models):
    team = Team.objects.create(name="research", requests_per_minute=100)
    ApiKey.create_key("a", team=team)
    ApiKey.create_key("b", team=team)
    (listed,) = api.get("/api/teams/").json()
    assert listed["members"] == 2 and "usage" not in listed
    usage = api.get(f"/api/teams/{team.pk}/").json()["usage"]
    assert usage["source"] == "usage records" and usage["subject"] == "team"
    assert usage["limits"]["requests_per_minute"]["limit"] == 100
    assert usage["limits"]["requests_per_minute"]["used"] == 0


def test_writing_budgets_replaces_them_and_leaving_them_out_keeps_them(api, models):
    team = Team.objects.create(name="research")
    ModelBudget.objects.create(team=team, model=models[0], tokens_per_day=10)
    assert api.patch(f"/api/teams/{team.pk}/", {"model_budgets": [{"model": "embed", "tokens_per_day": 7}]},
                     format="json").status_code == 200
    assert list(team.model_budgets.values_list("model__name", "tokens_per_day")) == [("embed", 7)]
    assert api.patch(f"/api/teams/{team.pk}/", {"weight": 3}, format="json").status_code == 200
    assert team.model_budgets.count() == 1
    assert api.patch(f"/api/teams/{team.pk}/", {"model_budgets": []}, format="json").status_code == 200
    assert not team.model_budgets.exists()


@pytest.mark.parametrize(("body", "field", "message"), [
    ({"requests_per_minute": 0}, "requests_per_minute", "greater than or equal to 1"),
    ({"tokens_per_day": -5}, "tokens_per_day", "greater than or equal to"),
    ({"weight": 0}, "weight", "greater than or equal to 0.01"),
    ({"priority": "urgent"}, "priority", "is not a valid choice"),
    ({"model_budgets": [{"model": "chat"}]}, "model_budgets", "Give a token budget per day, per month or both"),
    ({"model_budgets": [{"model": "nope", "tokens_per_day": 1}]}, "model_budgets", "does not exist"),
    ({"model_budgets": [{"model": "chat", "tokens_per_day": 1}, {"model": "chat", "tokens_per_month": 2}]},
     "model_budgets", "One budget per model: chat"),
])
def test_bad_values_are_field_messages_and_nothing_is_stored(api, models, body, field, message):
    answer = api.post("/api/teams/", {"name": "t", **body}, format="json")
    assert answer.status_code == 400, answer.content
    assert message in str(answer.json()[field]), answer.json()
    assert not Team.objects.exists() and not ModelBudget.objects.exists()


@pytest.mark.parametrize("kind", ["teams", "keys"])
def test_a_partial_update_with_a_budget_missing_its_model_is_a_400(api, models, kind):
    """PATCH is partial, and DRF passes that down to the budgets' items, where a missing
    ``model`` would otherwise be allowed through (a 500 found by schemathesis)."""
    owner = Team.objects.create(name="research") if kind == "teams" else ApiKey.create_key("a")[0]
    answer = api.patch(f"/api/{kind}/{owner.pk}/", {"model_budgets": [{"tokens_per_day": 5}]}, format="json")
    assert answer.status_code == 400, answer.content
    assert "model" in str(answer.json()["model_budgets"]), answer.json()
    assert not ModelBudget.objects.exists()


def test_a_team_name_is_unique(api):
    Team.objects.create(name="research")
    answer = api.post("/api/teams/", {"name": "research"}, format="json")
    assert answer.status_code == 400 and "name" in answer.json()
    assert Team.objects.count() == 1


def test_deleting_a_team_keeps_its_keys_without_a_team(api):
    team = Team.objects.create(name="research")
    key, _ = ApiKey.create_key("a", team=team)
    assert api.delete(f"/api/teams/{team.pk}/").status_code == 204
    key.refresh_from_db()
    assert key.team is None and key.revoked_at is None and not Team.objects.exists()


def test_a_key_is_created_in_a_team_with_its_priority_limits_and_budgets(api, models):
    Team.objects.create(name="research")
    answer = api.post("/api/keys/", {"name": "ci", "team": "research", "priority": "low", "requests_per_minute": 5,
                                     "max_concurrent_requests": 2,
                                     "model_budgets": [{"model": "chat", "tokens_per_day": 100}]}, format="json")
    assert answer.status_code == 201, answer.content
    key = ApiKey.objects.get(name="ci")
    assert (key.team.name, key.priority, key.requests_per_minute, key.max_concurrent_requests) == (
        "research", Priority.LOW, 5, 2)
    assert list(key.model_budgets.values_list("model__name", "tokens_per_day")) == [("chat", 100)]
    body = answer.json()
    assert body["key"].startswith("llmgw-key-") and body["team"] == "research" and body["priority"] == "low"


def test_an_unknown_team_is_a_field_message_and_no_key_is_made(api):
    answer = api.post("/api/keys/", {"name": "ci", "team": "nope"}, format="json")
    assert answer.status_code == 400 and "team" in answer.json()
    assert not ApiKey.objects.exists()


def test_a_keys_limits_are_changed_and_cleared_like_any_change(api, models):
    team = Team.objects.create(name="research")
    key, _ = ApiKey.create_key("ci", requests_per_minute=5, priority=Priority.HIGH)
    answer = api.patch(f"/api/keys/{key.pk}/", {"requests_per_minute": None, "tokens_per_minute": 900,
                                                "priority": None, "team": "research"}, format="json")
    assert answer.status_code == 200, answer.content
    key.refresh_from_db()
    assert (key.requests_per_minute, key.tokens_per_minute, key.priority, key.team) == (None, 900, None, team)
    detail = api.get(f"/api/keys/{key.pk}/").json()
    assert detail["usage"]["limits"] == {"tokens_per_minute": {
        "limit": 900, "used": 0, "remaining": 900, "resets_at": detail["usage"]["limits"]["tokens_per_minute"]
        ["resets_at"]}}
    assert api.patch(f"/api/keys/{key.pk}/", {"tokens_per_minute": 0}, format="json").status_code == 400
    assert ApiKey.objects.get(pk=key.pk).tokens_per_minute == 900
