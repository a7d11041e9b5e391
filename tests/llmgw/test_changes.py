"""What changed lately (``llmgw.changes``): operators' acts are recorded by every surface
that acts (CLI, dashboard, REST API share ``fleet.ops.operations``), the timeline gathers
them with admin edits, scaling steps, failures, keys, teams, agents and models, and
``llmgw changes`` and the dashboard's "Changes" page show it."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.utils import timezone

from catalog.models import Model
from fleet.models import Agent, OperatorAction, Replica, ScalingEvent
from fleet.ops import operations
from gateway.models import ApiKey, Team
from llmgw import changes
from tests.cli import llmgw

pytestmark = pytest.mark.django_db


def _agent(name: str = "gpu-node-1") -> Agent:
    return Agent.objects.create(name=name, connected=True, last_seen_at=timezone.now(), cpu_cores=8,
                                memory_mib=16384)


def test_every_act_of_an_operator_is_recorded_with_who_did_it(make_model):
    agent = _agent()
    model = make_model("chat", on_demand=True, min_replicas=0)
    assert llmgw("stop", "--by", "alice")[0] == 0
    assert llmgw("start")[0] == 0
    assert llmgw("agents", "cordon", "gpu-node-1")[0] == 0
    assert llmgw("agents", "uncordon", "gpu-node-1")[0] == 0
    assert llmgw("agents", "drain", "gpu-node-1")[0] == 0
    operations.evict_model(model, "bob")
    assert operations.request_agent_restarts("carol (dashboard)") == [agent.name]
    acts = [(a.action, a.target) for a in OperatorAction.objects.order_by("at", "pk")]
    assert acts == [("stop", "cluster"), ("start", "cluster"), ("cordon", "gpu-node-1"), ("uncordon", "gpu-node-1"),
                    ("drain", "gpu-node-1"), ("evict", "chat"), ("restart agents", "1 agent")]
    actors = list(OperatorAction.objects.order_by("at", "pk").values_list("actor", flat=True))
    assert actors[0] == "alice" and actors[1].endswith(" (CLI)") and actors[5:] == ["bob", "carol (dashboard)"]


def test_an_act_that_changes_nothing_is_not_recorded():
    agent = _agent()
    assert operations.set_cordoned(agent, False, "alice") is False  # was not cordoned
    assert operations.start_cluster("alice") is False  # was serving
    assert not OperatorAction.objects.exists()


def test_the_timeline_gathers_every_kind_newest_first_within_the_period(make_model, django_user_model):
    now = timezone.now()
    admin_user = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    model = make_model("chat")
    team = Team.objects.create(name="research")
    key = ApiKey.objects.create(name="alice", team=team, prefix="llmgw-key-abc", sha256="0" * 64)
    ApiKey.objects.create(name="old", prefix="llmgw-key-old", sha256="1" * 64, revoked_at=now)
    agent = _agent()
    ScalingEvent.objects.create(model=model, from_replicas=1, to_replicas=2, reason="busy for 2 min")
    Replica.objects.create(model=model, model_name="chat", profile=model.profile, agent=agent, state="failed",
                           error="engine exited with code 1\nOSError: [Errno 98] address already in use")
    operations.stop_cluster("alice")
    LogEntry.objects.create(user=admin_user, content_type=ContentType.objects.get_for_model(Model),
                            object_id=str(model.pk), object_repr="chat", action_flag=CHANGE,
                            change_message=json.dumps([{"changed": {"fields": ["Max replicas"]}}]))
    # An old act is outside the last day.
    OperatorAction.objects.create(at=now - timedelta(days=2), actor="x", action="cordon", target="ancient")

    period = changes.recent(timedelta(days=1))
    kinds = {c.kind for c in period.changes}
    assert kinds == {"operator", "admin", "scaling", "failure", "key", "team", "agent"}  # the model: via admin
    whats = [c.what for c in period.changes]
    assert "stop cluster" in whats and "chat: 1 → 2 replicas" in whats and "team research created" in whats
    assert f"key {key.name} created (team research)" in whats and "key old revoked" in whats
    assert "agent gpu-node-1 registered" in whats and "changed model chat" in whats
    assert not any("ancient" in w for w in whats)
    failure = next(c for c in period.changes if c.kind == "failure")
    assert "address already in use" in failure.detail and failure.what.startswith("replica r")
    admin_change = next(c for c in period.changes if c.kind == "admin")
    assert admin_change.who == "root (admin)" and "Max replicas" in admin_change.detail
    assert [c.at for c in period.changes] == sorted((c.at for c in period.changes), reverse=True)
    assert {c.kind for c in changes.recent(timedelta(days=1), kinds=frozenset({"key"})).changes} == {"key"}
    # The model row, edited outside the admin later, says so.
    LogEntry.objects.all().delete()
    assert any(c.what == "model chat added" for c in changes.recent(timedelta(days=1)).changes)


def test_a_key_added_in_the_admin_is_said_once(django_user_model):
    admin_user = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    key = ApiKey.objects.create(name="alice", prefix="llmgw-key-abc", sha256="0" * 64)
    LogEntry.objects.create(user=admin_user, content_type=ContentType.objects.get_for_model(ApiKey),
                            object_id=str(key.pk), object_repr="alice", action_flag=ADDITION, change_message="")
    whats = [c.what for c in changes.recent(timedelta(hours=1)).changes]
    assert whats == ["added API key alice"]


@pytest.mark.parametrize("text,seconds", [("30m", 1800), ("24h", 86400), ("7d", 604800), ("90s", 90), ("1.5h", 5400)])
def test_periods_are_read_in_people_units(text, seconds):
    assert changes.parse_since(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["", "h", "24", "-1h", "0m", "1y", "abc", "99999d"])
def test_a_bad_period_is_refused_saying_what_is_accepted(text):
    with pytest.raises(ValueError, match="period"):
        changes.parse_since(text)


def test_the_cli_shows_a_table_json_a_sentence_when_empty_and_refuses_bad_usage():
    code, out, err = llmgw("changes")
    assert (code, err) == (0, "") and "nothing changed." in out
    Agent.objects.create(name="[bold]evil[/bold] [/]")  # rich markup in a name is shown as written
    operations.stop_cluster("alice")
    code, out, err = llmgw("changes", "--since", "1h")
    assert code == 0, err
    assert "stop cluster" in out and "alice" in out and "[bold]evil[/bold]" in out  # the table wraps long cells
    data = json.loads(llmgw("changes", "--json")[1])
    assert data["truncated"] is False and {c["kind"] for c in data["changes"]} == {"operator", "agent"}
    assert all(set(c) == {"at", "kind", "who", "what", "detail"} for c in data["changes"])
    code, _, err = llmgw("changes", "--since", "forever")
    assert code == 2 and "--since" in err and "24h" in err
    code, _, err = llmgw("changes", "--kind", "operator,bogus")
    assert code == 2 and "bogus" in err


def test_the_page_lists_changes_escaped_to_staff_and_hides_what_they_may_not_view(client, django_user_model):
    Agent.objects.create(name="<script>alert(1)</script>")
    operations.stop_cluster("<b>mallory</b>")
    ApiKey.objects.create(name="secret-team-key", prefix="llmgw-key-abc", sha256="0" * 64)
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(root)
    page = client.get("/admin/dashboard/changes/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "stop cluster" in html and "&lt;b&gt;mallory&lt;/b&gt;" in html and "<b>mallory</b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert(1)</script>" not in html
    assert "key secret-team-key created" in html
    assert client.get("/admin/dashboard/changes/?since=1y").status_code == 400
    assert "Nothing changed in the last hour" not in html
    # Staff who may view the cluster but not keys: the keys are left out, and the page says so.
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_clustersettings"))
    client.force_login(viewer)
    html = client.get("/admin/dashboard/changes/").content.decode()
    assert "secret-team-key" not in html and "Not shown (no permission to view them)" in html and "key" in html


def test_the_page_needs_staff_and_the_cluster_view(client, django_user_model):
    assert client.get("/admin/dashboard/changes/").status_code == 302  # to the login
    plain = django_user_model.objects.create_user("plain", password="pw", is_staff=True)
    client.force_login(plain)
    assert client.get("/admin/dashboard/changes/").status_code == 403
