"""The cluster read model (``fleet.ops.cluster``): ``status``, the dashboard, ``explain``,
``/metrics`` and the REST API give one answer on what is alive, what is ready, what a
replica's state is and which models no pass has looked at yet — in each situation where
they used to disagree — and the next reconcile pass then does what they showed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from fleet.control.demand import want
from fleet.control.reconciler import reconcile
from fleet.models import Agent, ControlPlane, ModelState, Replica
from fleet.ops import cluster as read
from fleet.ops import dashboard
from fleet.ops.explain import explain_model
from fleet.ops.metrics import LIVE_STATES
from fleet.ops.operations import cluster_status, replicas_running
from fleet.ops.serializers import AgentSerializer
from fleet.states import HOLDS_RESOURCES, ReplicaState
from llmgw.metrics import render

pytestmark = pytest.mark.django_db

LOST_AFTER_S = 5.0


@pytest.fixture(autouse=True)
def short_grace(settings):
    settings.LLMGW_AGENT_LOST_AFTER_S = LOST_AFTER_S


@pytest.fixture(autouse=True)
def no_control_planes():
    """Each test says which web processes were listening: a row left by an earlier test's
    processes (committed on PostgreSQL) would make ``listening_since`` "now" — nobody
    could hear the agents — and every silent agent alive."""
    ControlPlane.objects.all().delete()


def agent(name: str, *, connected: bool = True, seen_s_ago: float | None = 0.0) -> Agent:
    seen = None if seen_s_ago is None else timezone.now() - timedelta(seconds=seen_s_ago)
    return Agent.objects.create(name=name, connected=connected, last_seen_at=seen, cpu_cores=8, memory_mib=16384,
                                address="127.0.0.1")


def replica(model, on: Agent, state: ReplicaState = ReplicaState.READY) -> Replica:
    return Replica.objects.create(model=model, profile=model.profile, agent=on, state=state.value, cpu_cores=1,
                                  memory_mib=1024, port=20000 + Replica.objects.count())


def metrics() -> dict[tuple[str, tuple], float]:
    """``/metrics``' fleet samples: (name, sorted labels) → value."""
    samples = {}
    for family in text_string_to_metric_families(render().decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def answers(model) -> dict:
    """What each surface says, in the same words: agent → alive, the model's ready count and
    reason, replica id → state; ``/metrics`` has counts only."""
    status = cluster_status()
    board = dashboard.load()
    why = explain_model(model)
    scraped = metrics()
    status_model = next(m for m in status["models"] if m["name"] == model.name)
    board_model = next(m for m in board.models if m.name == model.name)
    board_replicas = {h.replica_id: h.state for a in board.agents for g in a.gpus for h in g.holders}
    board_replicas.update({h.replica_id: h.state for a in board.agents for h in a.cpu_holders})
    return {
        "status": {"alive": {a["name"]: a["connected"] for a in status["agents"]}, "ready": status_model["ready"],
                   "reason": status_model.get("reason"), "replicas": {r["id"]: r["state"] for r in status["replicas"]}},
        "dashboard": {"alive": {a.name: a.alive for a in board.agents}, "ready": board_model.ready,
                      "reason": board_model.reason, "replicas": board_replicas, "running": board.running},
        "explain": {"ready": why["ready"], "reason": why["reason"],
                    "replicas": {r["id"]: r["state"] for r in why["replicas"]}},
        "rest": {a["name"]: a["connected"] for a in AgentSerializer(Agent.objects.all(), many=True).data},
        "metrics": {"alive": scraped[("llmgw_agents_connected", ())],
                    "replicas": {s.value: scraped[("llmgw_replicas", (("state", s.value),))] for s in LIVE_STATES},
                    "not_looked_at": scraped[("llmgw_models_not_looked_at", ())]},
    }


def assert_agents(said: dict, alive: dict[str, bool]) -> None:
    assert said["status"]["alive"] == alive
    assert said["dashboard"]["alive"] == alive
    assert said["rest"] == alive
    assert said["metrics"]["alive"] == sum(alive.values())


def assert_replicas(said: dict, model, ready: int, states: dict[int, str]) -> None:
    assert said["status"]["ready"] == said["dashboard"]["ready"] == said["explain"]["ready"] == ready
    assert said["metrics"]["replicas"]["ready"] == ready
    assert said["status"]["replicas"] == states
    assert said["explain"]["replicas"] == states
    holding = {rid: s for rid, s in states.items() if ReplicaState(s) in HOLDS_RESOURCES}
    assert said["dashboard"]["replicas"] == holding
    assert said["dashboard"]["running"] == replicas_running() == len(holding)
    for state in LIVE_STATES:  # ended replicas (failed, stopped) are history, not counted
        assert said["metrics"]["replicas"][state.value] == list(states.values()).count(state.value), state


# --- alive ------------------------------------------------------------------------------------


def test_an_agent_connected_but_silent_past_the_lost_grace_is_not_alive_anywhere(make_model):
    silent = agent("silent", connected=True, seen_s_ago=60)
    m = make_model("m", min_replicas=1)
    r = replica(m, silent)
    said = answers(m)
    assert_agents(said, {"silent": False})  # /metrics used to count it: its flag is still set
    assert_replicas(said, m, ready=0, states={r.pk: "lost"})
    reconcile()
    assert Replica.objects.get(pk=r.pk).state == ReplicaState.LOST.value  # the pass agrees


def test_an_agent_heard_from_but_disconnected_is_not_alive_and_its_replica_still_serves(make_model):
    restarting = agent("restarting", connected=False, seen_s_ago=1)
    m = make_model("m", min_replicas=1)
    r = replica(m, restarting)
    said = answers(m)
    assert_agents(said, {"restarting": False})
    assert_replicas(said, m, ready=1, states={r.pk: "ready"})
    reconcile()
    assert Replica.objects.get(pk=r.pk).state == ReplicaState.READY.value  # not lost before the grace


def test_silence_nobody_could_hear_counts_from_when_the_control_plane_listens_again(make_model):
    # A web process registered 2 s ago after a gap: the planner does not blame the agent for
    # the 60 s before, so neither does any surface.
    a = agent("a", connected=True, seen_s_ago=60)
    m = make_model("m", min_replicas=1)
    r = replica(m, a)
    now = timezone.now()
    ControlPlane.objects.create(host="h", role=ControlPlane.Role.WEB, pid=1, started_at=now - timedelta(seconds=2), last_seen_at=now)
    said = answers(m)
    assert_agents(said, {"a": True})
    assert_replicas(said, m, ready=1, states={r.pk: "ready"})
    reconcile()
    assert Replica.objects.get(pk=r.pk).state == ReplicaState.READY.value


# --- ready --------------------------------------------------------------------------------------


def test_a_replica_ready_on_a_lost_agent_is_lost_everywhere_and_only_the_others_count_as_ready(make_model):
    good = agent("good")
    gone = agent("gone", connected=False, seen_s_ago=60)
    m = make_model("m", min_replicas=2, max_replicas=2)
    serving = replica(m, good)
    stranded = replica(m, gone)
    leaving = replica(m, gone, ReplicaState.DRAINING)
    said = answers(m)
    assert_agents(said, {"good": True, "gone": False})
    assert_replicas(said, m, ready=1, states={serving.pk: "ready", stranded.pk: "lost", leaving.pk: "stopping"})
    reconcile()
    assert Replica.objects.get(pk=stranded.pk).state == ReplicaState.LOST.value
    assert Replica.objects.get(pk=leaving.pk).state == ReplicaState.STOPPING.value
    assert Replica.objects.get(pk=serving.pk).state == ReplicaState.READY.value


def test_explain_counts_every_ready_replica_not_only_the_newest_twenty(make_model):
    a = agent("a")
    m = make_model("m", min_replicas=1, max_replicas=1)
    ready = replica(m, a)
    for _ in range(25):
        replica(m, a, ReplicaState.FAILED)
    said = answers(m)
    assert said["explain"]["ready"] == said["status"]["ready"] == said["dashboard"]["ready"] == 1
    assert said["metrics"]["replicas"]["ready"] == 1
    assert ready.pk not in said["explain"]["replicas"]  # the list still shows the newest twenty


# --- not looked at yet ------------------------------------------------------------------------


def test_a_model_wanted_but_not_looked_at_by_any_pass_says_so_everywhere(make_model):
    agent("a")
    m = make_model("lazy", min_replicas=0, max_replicas=1, on_demand=True)
    want(m.pk)  # a request made its ModelState row; no pass has run
    assert ModelState.objects.filter(model=m).exists()
    said = answers(m)
    assert said["status"]["reason"] == said["dashboard"]["reason"] == said["explain"]["reason"] == read.NOT_LOOKED_AT
    assert said["metrics"]["not_looked_at"] == 1
    reconcile()
    said = answers(m)
    state = ModelState.objects.get(model=m)
    assert state.reason_at is not None
    assert said["dashboard"]["reason"] == said["explain"]["reason"] == state.reason != read.NOT_LOOKED_AT
    assert said["status"]["reason"] == state.reason
    assert said["metrics"]["not_looked_at"] == 0


def test_a_verdict_without_words_is_still_a_look(make_model):
    # What a pass leaves when a request wanted the model during it: its reason is dropped
    # (the next pass decides), the other fields and reason_at are written.
    m = make_model("served", min_replicas=1, max_replicas=1)
    replica(m, agent("a"))
    ModelState.objects.create(model=m, desired=1, reason="", reason_at=timezone.now())
    said = answers(m)
    # The dashboard used to read an empty reason as "not looked at".
    assert said["dashboard"]["reason"] == said["explain"]["reason"] == ""
    assert said["status"]["reason"] is None  # status shows a reason only when short of what is wanted
    assert said["metrics"]["not_looked_at"] == 0


def test_the_first_pass_stamps_its_verdict_even_when_it_changes_nothing(make_model):
    m = make_model("lazy", min_replicas=0, max_replicas=1, on_demand=True)
    reconcile()
    state = ModelState.objects.get(model=m)
    state.reason_at = None  # as a row made by a request and never looked at
    state.save(update_fields=["reason_at"])
    assert metrics()[("llmgw_models_not_looked_at", ())] == 1
    reconcile()  # same verdict as before: no field changes
    assert ModelState.objects.get(model=m).reason_at is not None
    assert metrics()[("llmgw_models_not_looked_at", ())] == 0


def test_an_external_model_not_looked_at_yet_says_so_on_the_dashboard_too(make_model):
    m = make_model("ext", min_replicas=0, max_replicas=1, profile=None, weights="",
                   external_base_url="https://api.example.com/v1")
    said = answers(m)
    assert said["status"]["reason"] == said["dashboard"]["reason"] == said["explain"]["reason"] == read.NOT_LOOKED_AT


# --- Outdated replicas and deleted models (docs/architecture.md, R10; deletes drain) -----------


def started_from_current_spec(m) -> Replica:
    from fleet.control.specs import spec_hash

    r = replica(m, agent("cpu-1"))
    Replica.objects.filter(pk=r.pk).update(spec_hash=spec_hash(m, m.profile), model_name=m.name)
    r.refresh_from_db()
    return r


def test_an_outdated_replica_is_shown_outdated_in_status_explain_the_dashboard_and_rest(make_model, admin_client):
    from fleet.ops.serializers import ReplicaSerializer
    from tests.cli import llmgw

    m = make_model("m")
    r = started_from_current_spec(m)
    assert cluster_status()["replicas"][0]["outdated"] is False
    assert not ReplicaSerializer(Replica.objects.select_related("model__profile").get(pk=r.pk)).data["outdated"]
    m.profile.env = {"NEW": "1"}
    m.profile.save()

    row = cluster_status()["replicas"][0]
    assert (row["outdated"], row["note"]) == (True, "outdated, being replaced")
    assert "outdated, being replaced" in llmgw("status")[1]
    assert f"replica {r.pk:>5} on cpu-1" in llmgw("explain", "m")[1]
    assert "[outdated, being replaced]" in llmgw("explain", "m")[1]
    shown = explain_model(m)["replicas"][0]
    assert (shown["outdated"], shown["note"]) == (True, "outdated, being replaced")
    holders = [h for a in dashboard.load().agents for h in a.cpu_holders]
    assert [h.label for h in holders] == ["ready, outdated, being replaced"]
    assert 'title="outdated, being replaced"' in admin_client.get("/admin/dashboard/").content.decode()
    assert ReplicaSerializer(Replica.objects.select_related("model__profile").get(pk=r.pk)).data["outdated"] is True


def test_a_failed_replica_of_an_old_spec_is_history_not_being_replaced(make_model):
    """Only a replica whose engine may still run is "being replaced"; a failed one of the
    old spec carries no note (explain lists it with its error)."""
    m = make_model("m")
    r = started_from_current_spec(m)
    Replica.objects.filter(pk=r.pk).update(state="failed", error="engine exited with code 2")
    m.profile.env = {"NEW": "1"}
    m.profile.save()
    shown = explain_model(m)["replicas"][0]
    assert shown["id"] == r.pk and shown["note"] == "" and shown["error"] == "engine exited with code 2"


def test_an_alias_edit_does_not_make_a_replica_outdated(make_model):
    m = make_model("m")
    started_from_current_spec(m)
    m.aliases = "another-name"
    m.save()
    assert cluster_status()["replicas"][0]["outdated"] is False


def test_a_deleted_models_replica_is_shown_under_its_old_name_as_draining_for_the_delete(make_model):
    from fleet.ops.serializers import ReplicaSerializer

    m = make_model("gone")
    r = started_from_current_spec(m)
    m.delete()
    row = cluster_status()["replicas"][0]
    assert (row["model"], row["outdated"]) == ("gone (deleted)", False)
    assert row["note"] == "its model was deleted: draining, then stopping"
    holders = [h for a in dashboard.load().agents for h in a.cpu_holders]
    assert [(h.model, h.label) for h in holders] == [("gone (deleted)", "ready, its model was deleted: draining, "
                                                                          "then stopping")]
    data = ReplicaSerializer(Replica.objects.get(pk=r.pk)).data
    assert (data["model"], data["model_name"], data["outdated"]) == (None, "gone (deleted)", False)


def test_the_admin_deletes_a_model_with_replicas_and_keeps_their_rows(make_model, admin_client):
    m = make_model("gone")
    running, stopped = replica(m, agent("cpu-1")), replica(m, Agent.objects.get(name="cpu-1"), ReplicaState.STOPPED)
    page = admin_client.get(f"/admin/catalog/model/{m.pk}/delete/")
    assert page.status_code == 200
    assert admin_client.post(f"/admin/catalog/model/{m.pk}/delete/", {"post": "yes"}).status_code == 302
    assert set(Replica.objects.filter(model=None).values_list("pk", flat=True)) == {running.pk, stopped.pk}
    assert str(Replica.objects.get(pk=running.pk)) == f"r{running.pk} gone (deleted) on cpu-1"
    assert admin_client.get(f"/admin/fleet/replica/{stopped.pk}/change/").status_code == 200
    assert admin_client.get("/admin/fleet/replica/").status_code == 200
