"""The admin for teams, keys' team, priority, limits and model budgets, and the cluster's
admission settings: what is stored, the usage panel, field messages for bad values, and
budgets edited with their owner's permissions."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from catalog.models import ClusterSettings
from gateway import tenants
from gateway.models import ApiKey, ModelBudget, Priority, Team

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_live_counters(settings):
    settings.REDIS_URL = ""
    tenants.use_backend(None)
    yield
    tenants.use_backend(None)


def budgets(*rows, initial: int = 0) -> dict:
    """An inline formset's POST data for budgets ``(model id, per day, per month, [id])``."""
    data = {"model_budgets-TOTAL_FORMS": str(len(rows)), "model_budgets-INITIAL_FORMS": str(initial),
            "model_budgets-MIN_NUM_FORMS": "0", "model_budgets-MAX_NUM_FORMS": "1000"}
    for i, row in enumerate(rows):
        model_id, per_day, per_month = row[:3]
        data.update({f"model_budgets-{i}-model": str(model_id), f"model_budgets-{i}-tokens_per_day": per_day,
                     f"model_budgets-{i}-tokens_per_month": per_month})
        if len(row) > 3:
            data[f"model_budgets-{i}-id"] = str(row[3])
    return data


def team_form(**fields) -> dict:
    data = {"name": "research", "priority": str(Priority.NORMAL.value), "weight": "1.0", "requests_per_minute": "",
            "tokens_per_minute": "", "max_concurrent_requests": "", "tokens_per_day": "", "tokens_per_month": ""}
    return {**data, **fields}


def test_a_team_is_added_with_limits_and_a_model_budget(admin_client, make_model):
    chat = make_model("chat")
    answer = admin_client.post("/admin/gateway/team/add/", {
        **team_form(priority=str(Priority.HIGH.value), weight="2", requests_per_minute="600"),
        **budgets((chat.pk, "1000", ""))})
    assert answer.status_code == 302, answer.content.decode()[:2000]
    team = Team.objects.get()
    assert (team.priority, team.weight, team.requests_per_minute) == (Priority.HIGH, 2.0, 600)
    assert list(team.model_budgets.values_list("model__name", "tokens_per_day", "tokens_per_month")) == [
        ("chat", 1000, None)]


@pytest.mark.parametrize(("fields", "rows", "message"), [
    ({"requests_per_minute": "0"}, (), "Ensure this value is greater than or equal to 1."),
    ({"weight": "0"}, (), "Ensure this value is greater than or equal to 0.01."),
    ({}, ((None, "", ""),), ModelBudget.EMPTY),
])
def test_bad_values_are_shown_on_the_form_and_nothing_is_stored(admin_client, make_model, fields, rows, message):
    chat = make_model("chat")
    rows = [(chat.pk, *row[1:]) for row in rows]
    answer = admin_client.post("/admin/gateway/team/add/", {**team_form(**fields), **budgets(*rows)})
    assert answer.status_code == 200
    assert message in answer.content.decode()
    assert not Team.objects.exists() and not ModelBudget.objects.exists()


def test_the_team_list_shows_members_and_limits_and_the_change_page_its_usage(admin_client):
    team = Team.objects.create(name="research", requests_per_minute=60, tokens_per_minute=10_000)
    ApiKey.create_key("a", team=team)
    ApiKey.create_key("b", team=team)
    listed = admin_client.get("/admin/gateway/team/").content.decode()
    assert "60 RPM, 10,000 TPM" in listed and '<td class="field-members">2</td>' in listed
    page = admin_client.get(f"/admin/gateway/team/{team.pk}/change/").content.decode()
    assert 'class="tenant-usage"' in page and "requests per minute" in page and "Source: usage records" in page


def test_the_key_change_page_has_team_priority_limits_budgets_and_usage(admin_client, make_model):
    chat = make_model("chat")
    team = Team.objects.create(name="research")
    key, _ = ApiKey.create_key("ci", max_concurrent_requests=3)
    page = admin_client.get(f"/admin/gateway/apikey/{key.pk}/change/").content.decode()
    for text in ("Team and priority", "Limits", "Usage now", "Token budgets for single models",
                 "— (live in the web process)"):
        assert text in page, text
    answer = admin_client.post(f"/admin/gateway/apikey/{key.pk}/change/", {
        "name": "ci", "team": str(team.pk), "priority": str(Priority.LOW.value), "requests_per_minute": "30",
        "max_concurrent_requests": "", "expires_at_0": "", "expires_at_1": "", **budgets((chat.pk, "", "5000"))})
    assert answer.status_code == 302, answer.content.decode()[:3000]
    key.refresh_from_db()
    assert (key.team, key.priority, key.requests_per_minute, key.max_concurrent_requests) == (
        team, Priority.LOW, 30, None)
    assert list(key.model_budgets.values_list("model__name", "tokens_per_month")) == [("chat", 5000)]
    listed = admin_client.get("/admin/gateway/apikey/").content.decode()
    assert "research" in listed and "30 RPM" in listed


def test_a_keys_budgets_need_the_change_permission_of_keys_not_of_budgets(client, django_user_model, make_model):
    chat = make_model("chat")
    key, _ = ApiKey.create_key("ci")
    form = {"name": "ci", "expires_at_0": "", "expires_at_1": "", **budgets((chat.pk, "100", ""))}
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_apikey"))
    client.login(username="viewer", password="pw")
    assert client.post(f"/admin/gateway/apikey/{key.pk}/change/", form).status_code == 403
    assert not ModelBudget.objects.exists()
    client.logout()
    editor = django_user_model.objects.create_user("editor", password="pw", is_staff=True)
    editor.user_permissions.add(*Permission.objects.filter(codename__in=["view_apikey", "change_apikey"]))
    client.login(username="editor", password="pw")
    answer = client.post(f"/admin/gateway/apikey/{key.pk}/change/", form)
    assert answer.status_code == 302, answer.content.decode()[:3000]
    assert list(key.model_budgets.values_list("tokens_per_day", flat=True)) == [100]


def test_the_cluster_settings_admin_shows_the_admission_settings(admin_client):
    ClusterSettings.get_solo()
    listed = admin_client.get("/admin/catalog/clustersettings/").content.decode()
    assert "field-rate_limits_without_redis" in listed and "field-admission_wait_s" in listed
    page = admin_client.get("/admin/catalog/clustersettings/1/change/").content.decode()
    assert 'name="rate_limits_without_redis"' in page and 'name="admission_wait_s"' in page
