"""The REST API under /api/: who may call each endpoint (anonymous, non-staff, staff),
validation answered as field messages, the fleet actions' effects, token auth, the
OpenAPI schema, and schemathesis against a live server finding no 500s."""

from __future__ import annotations

import base64
import datetime
import io
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from catalog.models import ClusterSettings, Model, Profile, ScheduleWindow
from fleet.models import Agent, Gpu, ModelState, Replica
from fleet.control.reconciler import reconcile
from gateway.models import ApiKey, Team
from tests.processes import ROOT

pytestmark = pytest.mark.django_db


def basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def grant_every_llmgw_permission(user) -> None:
    """Every permission of the catalog, fleet and gateway apps (not a superuser: what the
    API allows must come from the permissions; tests/llmgw/test_permissions.py checks each one)."""
    from django.contrib.auth.models import Permission

    user.user_permissions.set(Permission.objects.filter(content_type__app_label__in=["catalog", "fleet", "gateway"]))


@pytest.fixture
def staff(django_user_model):
    """A staff member holding every llmgw permission (a staff member without them is
    refused: tests/llmgw/test_permissions.py)."""
    user = django_user_model.objects.create_user("ops", password="pw", is_staff=True)
    grant_every_llmgw_permission(user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=basic("ops", "pw"))
    return client


@pytest.fixture
def non_staff(django_user_model):
    django_user_model.objects.create_user("alice", password="pw")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=basic("alice", "pw"))
    return client


@pytest.fixture
def world(make_model, cpu_profile):
    """One of everything: an on-demand model with an alias and a window, an agent with a
    GPU and a ready replica, another agent, a key."""
    lazy = make_model("lazy", aliases="lz", min_replicas=0, max_replicas=1, on_demand=True)
    window = ScheduleWindow(model=lazy, weekdays="mon-fri", start=datetime.time(9), end=datetime.time(17))
    window.full_clean()
    window.save()
    now = timezone.now()
    agent = Agent.objects.create(name="gpu-1", connected=True, last_seen_at=now, cpu_cores=8, memory_mib=16384,
                                 address="127.0.0.1")
    Gpu.objects.create(agent=agent, index=0, name="H100", memory_total_mib=81920, memory_used_mib=20000)
    Agent.objects.create(name="cpu-2", connected=True, last_seen_at=now, cpu_cores=8, memory_mib=16384)
    replica = Replica.objects.create(model=lazy, profile=cpu_profile, agent=agent, state="ready", port=5001,
                                     cpu_cores=1, memory_mib=128)
    team = Team.objects.create(name="research", tokens_per_day=100_000)
    key, _ = ApiKey.create_key("ci", team=team, requests_per_minute=60)
    return {"model": lazy, "profile": cpu_profile, "window": window, "agent": agent, "replica": replica, "key": key,
            "team": team}


def new_model_body(profile_id: int) -> dict:
    return {"name": "fresh", "weights": "file:/dev/null", "profile": profile_id, "min_replicas": 0,
            "max_replicas": 1}


# (method, path template, body maker, the status staff gets)
ENDPOINTS = [
    ("get", "/api/", None, 200),
    ("get", "/api/schema/", None, 200),
    ("get", "/api/schema/ui/", None, 200),
    ("get", "/api/cluster/", None, 200),
    ("post", "/api/cluster/stop/", None, 200),
    ("post", "/api/cluster/start/", None, 200),
    ("get", "/api/models/", None, 200),
    ("post", "/api/models/", lambda w: new_model_body(w["profile"].pk), 201),
    ("get", "/api/models/{model}/", None, 200),
    ("patch", "/api/models/{model}/", lambda w: {"max_replicas": 2}, 200),
    ("delete", "/api/models/{model}/", None, 204),
    ("post", "/api/models/{model}/want/", None, 200),
    ("post", "/api/models/{model}/evict/", None, 200),
    ("get", "/api/explain/lz/", None, 200),
    ("get", "/api/profiles/", None, 200),
    ("post", "/api/profiles/", lambda w: {"name": "p2", "command": "x --port {port}", "cpu_cores": 1}, 201),
    ("get", "/api/profiles/{profile}/", None, 200),
    ("patch", "/api/profiles/{profile}/", lambda w: {"notes": "n"}, 200),
    ("delete", "/api/profiles/{profile}/", None, 409),  # still used by the model
    ("get", "/api/schedule-windows/", None, 200),
    ("post", "/api/schedule-windows/",
     lambda w: {"model": w["model"].pk, "weekdays": "sat", "start": "10:00", "end": "12:00"}, 201),
    ("get", "/api/schedule-windows/{window}/", None, 200),
    ("patch", "/api/schedule-windows/{window}/", lambda w: {"min_replicas": 2}, 200),
    ("delete", "/api/schedule-windows/{window}/", None, 204),
    ("get", "/api/agents/", None, 200),
    ("post", "/api/agents/", lambda w: {"name": "gpu-9"}, 201),
    ("get", "/api/agents/{agent}/", None, 200),
    ("post", "/api/agents/{agent}/cordon/", None, 200),
    ("post", "/api/agents/{agent}/uncordon/", None, 200),
    ("post", "/api/agents/{agent}/drain/", None, 200),
    ("get", "/api/replicas/", None, 200),
    ("get", "/api/replicas/{replica}/", None, 200),
    ("get", "/api/keys/", None, 200),
    ("post", "/api/keys/", lambda w: {"name": "k2", "allowed_models": ["lazy"]}, 201),
    ("get", "/api/keys/{key}/", None, 200),
    ("patch", "/api/keys/{key}/", lambda w: {"name": "renamed"}, 200),
    ("post", "/api/keys/{key}/revoke/", None, 200),
    ("get", "/api/teams/", None, 200),
    ("post", "/api/teams/", lambda w: {"name": "ops", "priority": "high"}, 201),
    ("get", "/api/teams/{team}/", None, 200),
    ("patch", "/api/teams/{team}/", lambda w: {"requests_per_minute": 60}, 200),
    ("delete", "/api/teams/{team}/", None, 204),
]


def call(client, world, method: str, template: str, body):
    path = template.format(**{name: obj.pk for name, obj in world.items()})
    return getattr(client, method)(path, body(world) if body else None, format="json")


@pytest.mark.parametrize("method,template,body,expected", ENDPOINTS, ids=[f"{m} {t}" for m, t, _, _ in ENDPOINTS])
def test_each_endpoint_refuses_anonymous_and_non_staff_and_serves_staff(world, staff, non_staff, method, template,
                                                                        body, expected):
    anonymous = call(APIClient(), world, method, template, body)
    if template == "/api/schema/ui/":  # a page for browsers: to the login page and back
        assert anonymous.status_code == 302 and anonymous["Location"] == "/admin/login/?next=/api/schema/ui/"
    else:
        # The first authentication class's challenge (Token): 401, never a browser's basic prompt.
        assert anonymous.status_code == 401 and anonymous["WWW-Authenticate"] == "Token"
    assert call(non_staff, world, method, template, body).status_code == 403
    answer = call(staff, world, method, template, body)
    assert answer.status_code == expected, answer.content[:500]


def test_token_auth_gets_a_token_for_a_staff_password_and_uses_it(staff):
    token = APIClient().post("/api/auth/token/", {"username": "ops", "password": "pw"}, format="json").json()["token"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/cluster/").status_code == 200
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    refused = client.get("/api/cluster/")
    assert refused.status_code == 401 and refused["WWW-Authenticate"] == "Token"


def test_model_validation_comes_back_as_the_admins_field_messages(world, staff):
    answer = staff.post("/api/models/", {"name": "bad", "aliases": "lz", "weights": "ftp:nope",
                                         "profile": world["profile"].pk, "min_replicas": 3, "max_replicas": 1},
                        format="json")
    assert answer.status_code == 400
    errors = answer.json()
    assert errors["aliases"] == ["'lz' is already the name or an alias of another model."]
    assert errors["max_replicas"] == ["Max replicas must be at least min replicas."]
    assert "weights" in errors and not Model.objects.filter(name="bad").exists()
    # A partial update is checked against the whole object as it would be saved.
    answer = staff.patch(f"/api/models/{world['model'].pk}/", {"max_replicas": 0}, format="json")
    assert answer.status_code == 400 and "max_replicas" in answer.json()
    errors = staff.post("/api/models/", {"name": "no-profile"}, format="json").json()
    assert errors["profile"] == ["Choose an engine profile (or give an external base URL)."]
    errors = staff.post("/api/models/", {"name": "no profile"}, format="json").json()
    assert "not a valid model name" in errors["name"][0]


def test_profile_and_window_rules_are_field_messages(world, staff):
    answer = staff.post("/api/profiles/", {"name": "noport", "command": "serve {model}", "cpu_cores": 1},
                        format="json")
    assert answer.status_code == 400
    assert answer.json()["command"] == ["Unknown placeholder(s): {model}",
                                        "The command must contain {port}: the agent chooses the engine's port."]
    answer = staff.post("/api/schedule-windows/", {"model": world["model"].pk, "weekdays": "mon", "start": "16:00",
                                                   "end": "18:00"}, format="json")
    assert answer.status_code == 400 and answer.json()["start"][0].startswith("Overlaps the window")


def test_external_api_key_is_written_never_read(staff):
    answer = staff.post("/api/models/", {"name": "remote", "external_base_url": "https://llm.example.com/v1",
                                         "external_api_key": "sk-secret"}, format="json")
    assert answer.status_code == 201, answer.json()
    assert "external_api_key" not in answer.json() and answer.json()["external_api_key_set"] is True
    assert Model.objects.get(name="remote").external_api_key == "sk-secret"
    assert "sk-secret" not in staff.get("/api/models/").content.decode()


def test_deleting_a_profile_in_use_says_what_uses_it(world, staff):
    answer = staff.delete(f"/api/profiles/{world['profile'].pk}/")
    assert answer.status_code == 409 and "lazy" in answer.json()["detail"]
    assert Profile.objects.filter(pk=world["profile"].pk).exists()


def test_drain_cordons_the_agent_and_moves_its_replicas_to_another(world, staff):
    agent, replica = world["agent"], world["replica"]
    starting = Replica.objects.create(model=world["model"], profile=world["profile"], agent=agent, state="starting")
    ModelState.objects.create(model=world["model"], wanted_at=timezone.now(), desired=1)
    answer = staff.post(f"/api/agents/{agent.pk}/drain/")
    assert answer.json() == {"agent": "gpu-1", "cordoned": True, "changed": True, "replicas_moved": 2}
    agent.refresh_from_db()
    assert agent.cordoned and agent.generation >= 1
    replica.refresh_from_db()
    starting.refresh_from_db()
    assert (replica.state, starting.state) == ("draining", "stopping")
    assert "agent gpu-1 drained by ops" in replica.reason
    # The pass it requested (after commit; run here by hand) places the successor elsewhere.
    reconcile()
    successor = Replica.objects.filter(model=world["model"], state="placing").get()
    assert successor.agent.name == "cpu-2"


def test_cordon_and_uncordon_say_whether_anything_changed(world, staff):
    url = f"/api/agents/{world['agent'].pk}"
    assert staff.post(f"{url}/cordon/").json()["changed"] is True
    assert staff.post(f"{url}/cordon/").json()["changed"] is False
    assert Agent.objects.get(pk=world["agent"].pk).cordoned
    assert staff.post(f"{url}/uncordon/").json() == {"agent": "gpu-1", "cordoned": False, "changed": True,
                                                     "replicas_moved": 0}


def test_want_and_evict_an_on_demand_model(world, staff):
    lazy = world["model"]
    assert staff.post(f"/api/models/{lazy.pk}/want/").status_code == 200
    assert ModelState.objects.get(model=lazy).wanted_at is not None
    answer = staff.post(f"/api/models/{lazy.pk}/evict/")
    assert answer.json()["replicas_moved"] == 1
    assert ModelState.objects.get(model=lazy).wanted_at is None
    replica = Replica.objects.get(pk=world["replica"].pk)
    assert (replica.state, replica.reason) == ("draining", "evicted by ops")  # it was ready: it drains


def test_want_and_evict_refuse_a_model_that_is_not_on_demand(make_model, staff):
    always = make_model("always")
    for verb in ("want", "evict"):
        answer = staff.post(f"/api/models/{always.pk}/{verb}/")
        assert answer.status_code == 400 and "not an on-demand model" in answer.json()["model"][0]


def test_explain_finds_a_model_by_alias_and_404s_an_unknown_one(world, staff):
    info = staff.get("/api/explain/lz/").json()
    assert info["model"] == "lazy" and info["on_demand"] is True and info["replicas"][0]["agent"] == "gpu-1"
    assert staff.get("/api/explain/nope/").status_code == 404


def test_a_new_agent_gets_its_token_once(staff):
    answer = staff.post("/api/agents/", {"name": "gpu-7"}, format="json")
    assert answer.status_code == 201
    token = answer.json()["token"]
    assert Agent.authenticate(token).name == "gpu-7"
    assert "token" not in staff.get(f"/api/agents/{answer.json()['id']}/").json()
    assert staff.post("/api/agents/", {"name": "gpu-7"}, format="json").status_code == 400


def test_every_api_answer_with_a_secret_is_not_stored_by_caches(world, staff):
    """A new agent token, a re-key, a new API key and a REST token: ``no-store``, as the
    admin's shown-once page (issue 12: a cache in between must not keep them)."""
    created = staff.post("/api/agents/", {"name": "gpu-8"}, format="json")
    rekeyed = staff.post(f"/api/agents/{created.json()['id']}/rekey/")
    key = staff.post("/api/keys/", {"name": "team-b", "allowed_models": ["lazy"]}, format="json")
    token = APIClient().post("/api/auth/token/", {"username": "ops", "password": "pw"}, format="json")
    for answer, field, status in ((created, "token", 201), (rekeyed, "token", 200), (key, "key", 201),
                                  (token, "token", 200)):
        assert answer.status_code == status and answer.json()[field]
        assert "no-store" in answer["Cache-Control"], answer.request
    # Each is the live secret: the re-key replaced the first agent token.
    assert Agent.authenticate(rekeyed.json()["token"]).name == "gpu-8"
    assert Agent.authenticate(created.json()["token"]) is None


def test_keys_are_shown_once_limited_to_models_and_revoked(world, staff):
    answer = staff.post("/api/keys/", {"name": "team-a", "allowed_models": ["lazy"]}, format="json")
    assert answer.status_code == 201
    created = answer.json()
    assert created["key"].startswith(created["prefix"]) and created["allowed_models"] == ["lazy"]
    listed = staff.get("/api/keys/").json()
    assert "key" not in listed[0] and {k["name"] for k in listed} == {"ci", "team-a"}
    assert staff.post("/api/keys/", {"name": "x", "allowed_models": ["nope"]}, format="json").status_code == 400
    assert staff.post(f"/api/keys/{created['id']}/revoke/").json()["state"] == "revoked"
    assert ApiKey.objects.get(pk=created["id"]).revoked_at is not None


def test_replicas_filter_by_state_and_refuse_a_bad_one(world, staff):
    page = staff.get("/api/replicas/?state=ready").json()
    assert page["count"] == 1 and page["results"][0]["agent_name"] == "gpu-1"
    assert staff.get("/api/replicas/?state=sleepy").status_code == 400
    assert staff.get("/api/replicas/?model=x").json() == {"model": ["'x' is not an id."]}
    for not_an_id in ("²", "١٢", "-1", "9" * 19):  # digits int() refuses or reads; a sign; too big
        answer = staff.get("/api/replicas/", {"model": not_an_id})
        assert answer.status_code == 400 and answer.json() == {"model": [f"'{not_an_id}' is not an id."]}


def test_cluster_stop_and_start(staff):
    assert staff.post("/api/cluster/stop/").json() == {"stopped": True, "changed": True}
    assert ClusterSettings.get_solo().stopped_by == "ops"
    assert staff.get("/api/cluster/").json()["stopped"] is True
    assert staff.post("/api/cluster/start/").json() == {"stopped": False, "changed": True}


def test_the_cluster_names_each_agents_health_heartbeat_age_and_version_as_status_does(staff):
    from datetime import timedelta

    from django.utils import timezone

    from fleet.models import Agent, ControlPlane

    ControlPlane.objects.all().delete()  # silence counts from the last message (no web-process rows from other tests)
    Agent.objects.create(name="gpu-1", connected=True, last_seen_at=timezone.now() - timedelta(seconds=3),
                         version="0.9.1")
    Agent.objects.create(name="silent", connected=True, last_seen_at=timezone.now() - timedelta(hours=2))
    Agent.objects.create(name="new-box")
    agents = {a["name"]: a for a in staff.get("/api/cluster/").json()["agents"]}
    assert agents["gpu-1"]["health"] == "alive" and agents["gpu-1"]["version"] == "0.9.1"
    assert 2 <= agents["gpu-1"]["heartbeat_age_s"] < 120
    assert agents["silent"]["health"] == "lost" and agents["silent"]["heartbeat_age_s"] >= 7200
    assert agents["new-box"]["health"] == "never connected" and agents["new-box"]["heartbeat_age_s"] is None


def test_the_schema_is_valid_openapi_and_lists_every_resource(staff):
    from drf_spectacular.validation import validate_schema

    schema = staff.get("/api/schema/?format=json").json()
    validate_schema(schema)
    paths = set(schema["paths"])
    for path in ("/api/models/", "/api/profiles/", "/api/schedule-windows/", "/api/agents/{id}/drain/",
                 "/api/replicas/", "/api/cluster/stop/", "/api/explain/{name}/", "/api/keys/{id}/revoke/",
                 "/api/teams/", "/api/teams/{id}/"):
        assert path in paths
    assert b"swagger" in staff.get("/api/schema/ui/").content.lower()
    assert schema["components"]["securitySchemes"]["llmgwToken"]["name"] == "Authorization"


def schemathesis_config(ids: dict[str, int], doomed: dict[str, int]) -> str:
    """Real ids for the detail routes, so generated requests reach past the 404; DELETEs get
    objects of their own, or they would pull the others' rows away early in the run."""
    routes = {"agents": "agent", "keys": "key", "models": "model", "profiles": "profile",
              "schedule-windows": "window", "replicas": "replica", "teams": "team"}
    text = '[[operations]]\ninclude-path-regex = "^/api/explain/"\nparameters = { "name" = "lz" }\n'
    for route, name in routes.items():
        text += (f'[[operations]]\ninclude-path-regex = "^/api/{route}/"\nexclude-method = "DELETE"\n'
                 f'parameters = {{ "id" = {ids[name]} }}\n')
        if name in doomed:
            text += (f'[[operations]]\ninclude-path-regex = "^/api/{route}/"\ninclude-method = "DELETE"\n'
                     f'parameters = {{ "id" = {doomed[name]} }}\n')
    return text


@pytest.mark.timeout(150)
def test_schemathesis_finds_no_server_errors(live_server, world, make_model, django_user_model, tmp_path, settings):
    """Every operation of /api/schema/, with generated valid and invalid data, as a staff
    member (basic auth) against a live server; real ids so detail routes are reached."""
    # Generated wrong passwords (POST /api/auth/token/) would lock 127.0.0.1 out of password
    # logins after five, and every later operation would be a 429 that tests nothing.
    settings.LLMGW_AUTH_FAILURE_LIMIT = 1_000_000
    grant_every_llmgw_permission(django_user_model.objects.create_user("fuzz", password="pw", is_staff=True))
    spare = Profile.objects.create(name="spare", command="x --port {port}", cpu_cores=1)
    doomed = make_model("doomed", min_replicas=0, on_demand=True)
    window = ScheduleWindow.objects.create(model=world["model"], weekdays="sat", start=datetime.time(1),
                                           end=datetime.time(2))
    config = tmp_path / "schemathesis.toml"
    config.write_text(schemathesis_config({name: obj.pk for name, obj in world.items()},
                                          {"model": doomed.pk, "profile": spare.pk, "window": window.pk,
                                           "team": Team.objects.create(name="doomed").pk}))
    report = ROOT / "test-artifacts" / "schemathesis"
    report.mkdir(parents=True, exist_ok=True)
    argv = [str(Path(sys.executable).parent / "schemathesis"), "--config-file", str(config), "--no-color", "run",
            f"{live_server.url}/api/schema/", "--auth", "fuzz:pw", "--checks", "not_a_server_error",
            "--max-examples", "5", "--max-time", "40", "--workers", "1", "--seed", "8",
            "--report", "junit", "--report-dir", str(report)]
    # Run from tmp_path: schemathesis and hypothesis keep their caches in the working directory.
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "Server error" not in done.stdout


def test_api_tokens_are_stored_hashed_and_shown_once(staff):
    from fleet.models import ApiToken

    token = APIClient().post("/api/auth/token/", {"username": "ops", "password": "pw"}, format="json").json()["token"]
    row = ApiToken.objects.get()
    assert token not in (row.prefix, row.sha256) and token.startswith(row.prefix)
    assert APIClient().post("/api/auth/token/", {"username": "ops", "password": "wrong"}, format="json").status_code == 401


@pytest.mark.parametrize("secret", ["a-b-c-d-e-f-g-h-i-j-k-l-m-n-o-p-q", "-" * 43, "AbCdEfGhIjKlMnOp-rest"])
def test_a_token_prefix_never_holds_more_than_its_first_characters_of_secret(secret):
    """token_urlsafe can put "-" anywhere in the secret; the prefix is cut at the kind,
    not at the secret's last dash (which once stored nearly the whole token in clear)."""
    from llmgw import tokens

    for kind in ("api", "agent", "key"):
        token = f"llmgw-{kind}-{secret}"
        assert tokens.token_prefix(token) == f"llmgw-{kind}-{secret[:tokens.PREFIX_LEN]}"
    assert tokens.token_prefix("plain-old-secret-value") == "plain-old-se"


def test_the_swagger_page_loads_its_assets_from_here_not_a_cdn(staff):
    """Clusters are often offline: the UI's scripts and styles come from our static files."""
    import re

    from django.conf import settings
    from django.contrib.staticfiles import finders

    page = staff.get("/api/schema/ui/").content.decode()
    assert "cdn.jsdelivr.net" not in page and "unpkg.com" not in page
    assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css))"', page)
    assert any("swagger-ui-bundle" in a for a in assets), assets
    for asset in assets:
        assert asset.startswith("/" + settings.STATIC_URL.lstrip("/")), asset
        assert finders.find(asset.split(settings.STATIC_URL, 1)[1]), asset


def test_explain_shows_the_requests_queued_at_the_gateways_as_the_reconciler_counts_them(world, staff, settings):
    from fleet.models import QueueReport

    now = timezone.now()
    QueueReport.objects.create(process="web:1", model=world["model"], waiting=3, reported_at=now)
    QueueReport.objects.create(process="web:2", model=world["model"], waiting=2, reported_at=now)
    QueueReport.objects.create(process="gone:3", model=world["model"], waiting=40,
                               reported_at=now - datetime.timedelta(seconds=settings.LLMGW_LOAD_STALE_S + 1))
    other = Model.objects.create(name="other", weights="file:/dev/null", profile=world["profile"])
    QueueReport.objects.create(process="web:1", model=other, waiting=9, reported_at=now)
    assert staff.get(f"/api/explain/{world['model'].name}/").json()["queued_at_gateway"] == 5
    QueueReport.objects.filter(model=world["model"]).delete()
    assert staff.get(f"/api/explain/{world['model'].name}/").json()["queued_at_gateway"] == 0


def test_explain_says_what_capacity_load_scaling_learned(world, staff):
    ModelState.objects.update_or_create(model=world["model"], defaults={"observed_per_replica": 3, "extra_replicas": 1})
    info = staff.get(f"/api/explain/{world['model'].name}/").json()
    assert info["observed_per_replica"] == 3 and info["load_extra_replicas"] == 1
    out = io.StringIO()
    call_command("llmgw", "explain", world["model"].name, stdout=out)
    assert "capacity:    3 running per replica while requests queued" in out.getvalue()


def test_prefixes_stored_by_the_old_rule_are_recomputed_so_those_tokens_still_work(monkeypatch):
    """Before the fix a secret with '-' was cut at its last dash: the stored prefix held
    most of the secret and the new rule would not find the row. The data migrations
    recompute every stored prefix."""
    from importlib import import_module

    from django.apps import apps

    from llmgw import tokens
    from gateway.models import ApiKey

    def old_rule(token):
        head, _, tail = token.rpartition("-")
        return f"{head}-{tail[:tokens.PREFIX_LEN]}" if head else token[:tokens.PREFIX_LEN]

    secrets = iter(["AbCdEfGh-IjKlMnOpQrStUvWxYz0123456789-abcd", "no_dash_in_this_secret_at_all_0123456789ab"])
    monkeypatch.setattr(tokens.secrets, "token_urlsafe", lambda n: next(secrets))
    agent, agent_token = Agent.create_with_token("old-agent")
    key, key_token = ApiKey.create_key("old-key")
    Agent.objects.filter(pk=agent.pk).update(token_prefix=old_rule(agent_token))
    ApiKey.objects.filter(pk=key.pk).update(prefix=old_rule(key_token))
    assert Agent.authenticate(agent_token) is None  # what an upgrade without the migration did

    import_module("fleet.migrations.0007_token_prefixes_cut_at_the_kind").recompute(apps, None)
    import_module("gateway.migrations.0002_key_prefixes_cut_at_the_kind").recompute(apps, None)
    assert Agent.authenticate(agent_token) == agent
    assert Agent.objects.get(pk=agent.pk).token_prefix == "llmgw-agent-AbCdEfGh-IjK"
    assert ApiKey.objects.get(pk=key.pk).prefix == tokens.token_prefix(key_token) == "llmgw-key-no_dash_in_t"


@pytest.mark.parametrize("value, ok", [(128, True), (None, True), (0, False), (-5, False), (2**31, False),
                                       ("many", False)])
def test_default_max_tokens_is_validated_as_a_field_message(staff, cpu_profile, value, ok):
    answer = staff.post("/api/models/", {"name": "bounded", "weights": "file:/dev/null", "profile": cpu_profile.pk,
                                         "min_replicas": 0, "max_replicas": 1, "default_max_tokens": value},
                        format="json")
    assert answer.status_code == (201 if ok else 400), answer.content
    if ok:
        assert Model.objects.get(name="bounded").default_max_tokens == value
    else:
        assert "default_max_tokens" in answer.json() and not Model.objects.filter(name="bounded").exists()


def test_a_replicas_engine_key_is_in_no_api_answer_nor_admin_page(world, staff, admin_client):
    """Only the gateway and the replica's agent hold an engine key (issue 12): not the REST
    API, not the admin (its replica pages show every other field)."""
    replica = world["replica"]
    key = replica.engine_key
    assert len(key) >= 40 and Replica.objects.create(model=world["model"], profile=world["profile"],
                                                     agent=world["agent"]).engine_key != key
    answers = [staff.get("/api/replicas/"), staff.get(f"/api/replicas/{replica.pk}/"),
               staff.get("/api/explain/lazy/"),
               admin_client.get(f"/admin/fleet/replica/{replica.pk}/change/"),
               admin_client.get("/admin/fleet/replica/")]
    assert [a.status_code for a in answers] == [200] * len(answers)
    assert all(key not in a.content.decode() for a in answers)
    assert str(replica.port) in answers[3].content.decode()  # the page does show the replica


def test_explain_and_the_admin_say_when_a_profiles_engines_are_unprotected(world, staff, admin_client):
    """A custom command without {api_key} is allowed (an engine may take no key) but said."""
    assert staff.get("/api/explain/lazy/").json()["engine_protected"] is True
    bare = Profile.objects.create(name="bare", command="my-engine --port {port}", cpu_cores=1)
    Model.objects.filter(pk=world["model"].pk).update(profile=bare)
    assert staff.get("/api/explain/lazy/").json()["engine_protected"] is False
    out = io.StringIO()
    call_command("llmgw", "explain", "lazy", stdout=out)
    assert "UNPROTECTED" in out.getvalue()
    assert "UNPROTECTED" in admin_client.get(f"/admin/catalog/profile/{bare.pk}/change/").content.decode()
    guarded = admin_client.get(f"/admin/catalog/profile/{world['profile'].pk}/change/").content.decode()
    assert "UNPROTECTED" not in guarded and "only the gateway can use them" in guarded
    assert "Put {api_key} in the command" in admin_client.get("/admin/catalog/profile/add/").content.decode()


def test_the_schema_names_every_way_in_without_a_warning(tmp_path):
    """Token and basic auth both appear as security schemes; drf-spectacular warns (and
    leaves a scheme out) for an authenticator it cannot describe."""
    import yaml
    from django.core.management import call_command

    path = tmp_path / "schema.yaml"
    call_command("spectacular", "--fail-on-warn", "--file", str(path))
    schemes = yaml.safe_load(path.read_text())["components"]["securitySchemes"]
    assert schemes["basicAuth"] == {"type": "http", "scheme": "basic",
                                    "description": "A staff user's name and password (failed attempts are throttled)."}
    assert schemes["llmgwToken"]["type"] == "apiKey"


@pytest.mark.parametrize("header", ["Token wrong", "Bearer wrong", "token llmgw-api-wrong"])
def test_a_bad_token_is_called_invalid_not_missing(client, header):
    """Whatever follows our schemes, a token that is not one of ours is "Invalid token.",
    never "credentials were not provided" (which sends people looking for a header bug)."""
    answer = client.get("/api/models/", HTTP_AUTHORIZATION=header)
    assert answer.status_code == 401
    assert answer.json() == {"detail": "Invalid token."}
    assert answer["WWW-Authenticate"] == "Token"


@pytest.mark.parametrize(("path", "body"), [
    ("/api/keys/", {"name": "carol", "models": ["lazy"]}),  # the field is allowed_models
    ("/api/models/", {"name": "m2", "profile": None, "weights": "file:/dev/null", "replicas": 2}),
    ("/api/agents/", {"name": "gpu-9", "cordon": True}),
])
def test_a_field_the_api_does_not_know_is_refused_and_nothing_is_created(staff, world, path, body):
    """A misspelt field is a 400 naming it and the real fields, never silently dropped
    (a key meant for one model would otherwise serve every model)."""
    before = staff.get(path).json()
    answer = staff.post(path, body, format="json")
    assert answer.status_code == 400, answer.content
    unknown = next(name for name in body if name in answer.json())
    assert answer.json()[unknown][0].startswith("Unknown field: the fields are ")
    assert staff.get(path).json() == before


def test_deleting_a_model_over_rest_keeps_its_running_replica_to_drain(staff, world):
    """docs/architecture.md, "Deleted models drain": the row stays (the next pass drains it)
    and REST still names it."""
    replica = world["replica"]
    assert staff.delete(f"/api/models/{world['model'].pk}/").status_code == 204
    replica.refresh_from_db()
    assert (replica.model_id, replica.state) == (None, "ready")
    shown = staff.get(f"/api/replicas/{replica.pk}/").json()
    assert (shown["model"], shown["model_name"], shown["outdated"]) == (None, "lazy (deleted)", False)


@pytest.mark.django_db
def test_a_profile_is_pinned_by_replicas_that_may_still_run_not_by_their_history(staff, admin_client, make_model):
    """A profile whose models are gone can be deleted once its replicas have stopped (their
    rows keep their history, without it); while one may still run, REST answers 409 naming it
    and the admin's confirmation lists it as protected (catalog.models.Profile.in_use_checks)."""
    from catalog.models import Profile

    m = make_model("gone")
    profile = m.profile
    a = Agent.objects.create(name="cpu-9", connected=True, last_seen_at=timezone.now(), cpu_cores=4, memory_mib=8192)
    done = Replica.objects.create(model=m, profile=profile, agent=a, state="stopped")
    running = Replica.objects.create(model=m, profile=profile, agent=a, state="draining", port=20001)
    m.delete()  # the model's replicas drain (deletes drain); the profile is left
    answer = staff.delete(f"/api/profiles/{profile.pk}/")
    assert answer.status_code == 409 and f"r{running.pk}" in answer.json()["detail"], answer.content
    page = admin_client.get(f"/admin/catalog/profile/{profile.pk}/delete/").content.decode()
    assert "may still run" in page and f"r{running.pk}" in page
    Replica.objects.filter(pk=running.pk).update(state="stopped")
    assert staff.delete(f"/api/profiles/{profile.pk}/").status_code == 204
    assert not Profile.objects.filter(pk=profile.pk).exists()
    done.refresh_from_db()
    assert done.profile is None and done.state == "stopped"


def test_the_routing_policy_is_read_and_written_and_a_value_that_is_none_is_a_400_naming_the_choices(staff, world):
    """Issue 17: ``routing_policy`` over REST, as in the admin (catalog.models.RoutingPolicy)."""
    answer = staff.post("/api/models/", {**new_model_body(world["profile"].pk), "routing_policy": "session"},
                        format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["routing_policy"] == "session"
    fresh = Model.objects.get(name="fresh")
    assert fresh.routing_policy == "session"
    assert staff.get(f"/api/models/{world['model'].pk}/").json()["routing_policy"] == "least-loaded"  # the default
    answer = staff.patch(f"/api/models/{fresh.pk}/", {"routing_policy": "prefix-affinity"}, format="json")
    assert answer.status_code == 200 and answer.json()["routing_policy"] == "prefix-affinity"
    assert Model.objects.get(pk=fresh.pk).routing_policy == "prefix-affinity"
    for bad, shown in (("round-robin", "'round-robin'"), ("", "''"), (3, "'3'"), (None, "null")):
        answer = staff.patch(f"/api/models/{fresh.pk}/", {"routing_policy": bad}, format="json")
        assert answer.status_code == 400, (bad, answer.content)
        assert answer.json() == {"routing_policy": [
            f"{shown} is not a routing policy: choose least-loaded, prefix-affinity or session."]}
    assert Model.objects.get(pk=fresh.pk).routing_policy == "prefix-affinity"


def test_changing_the_routing_policy_over_rest_restarts_nothing(staff, make_model):
    """The policy shapes no engine (fleet.control.specs.engine_spec): the ready replica stays
    ready and current, and no pass places another."""
    from fleet.control.specs import spec_hash
    from tests.rows import agent, replica

    model = make_model("chat", min_replicas=1)
    running = replica(model, agent("cpu-1"), spec_hash=spec_hash(model, model.profile))
    reconcile()
    assert list(model.replicas.values_list("pk", "state")) == [(running.pk, "ready")]  # steady before the edit
    for policy in ("prefix-affinity", "session", "least-loaded"):
        answer = staff.patch(f"/api/models/{model.pk}/", {"routing_policy": policy}, format="json")
        assert answer.status_code == 200, answer.content
        reconcile()
        assert list(model.replicas.values_list("pk", "state")) == [(running.pk, "ready")], policy
        assert staff.get(f"/api/replicas/{running.pk}/").json()["outdated"] is False
        assert spec_hash(Model.objects.get(pk=model.pk), model.profile) == running.spec_hash


def test_explain_over_rest_says_the_routing_policy(world, staff):
    Model.objects.filter(pk=world["model"].pk).update(routing_policy="prefix-affinity")
    routing = staff.get("/api/explain/lz/").json()["routing"]
    assert (routing["policy"], routing["applies"]) == ("prefix-affinity", True)
    assert routing["text"].startswith("prefix-affinity — a prompt goes to the replica that most likely holds its "
                                      "prefix in its cache, unless that one already runs 2 more requests than the "
                                      "least loaded")


def test_the_schema_gives_the_routing_policy_its_choices(staff):
    schema = staff.get("/api/schema/?format=json").json()
    components = schema["components"]["schemas"]
    for name in ("Model", "ModelRequest", "PatchedModelRequest"):
        field = components[name]["properties"]["routing_policy"]
        assert field["allOf"] == [{"$ref": "#/components/schemas/RoutingPolicyEnum"}]
        assert "Changing it restarts nothing." in field["description"]
    assert components["RoutingPolicyEnum"]["enum"] == ["least-loaded", "prefix-affinity", "session"]
    assert set(components["ExplainRouting"]["properties"]) == {"policy", "applies", "text"}
    assert components["Explain"]["properties"]["routing"]["$ref"] == "#/components/schemas/ExplainRouting"
