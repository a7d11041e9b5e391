"""``llmgw agents list|add|rekey|cordon|uncordon|drain`` and the agents' own health in
``llmgw status``: what is printed, what is left in the tables, and the exit codes (0 ok,
1 no such agent, 2 bad usage)."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import Agent, Gpu, Replica
from tests.cli import llmgw

pytestmark = pytest.mark.django_db


def _agent(name: str, seen_s_ago: float | None = 2.0, connected: bool = True, **kw) -> Agent:
    seen = timezone.now() - timedelta(seconds=seen_s_ago) if seen_s_ago is not None else None
    return Agent.objects.create(name=name, connected=connected, last_seen_at=seen, cpu_cores=8, memory_mib=16384,
                                address="10.0.0.5", **kw)


def _replica(model, agent: Agent, state: str = "ready", gpus=(0,)) -> Replica:
    return Replica.objects.create(model=model, profile=model.profile, agent=agent, state=state, port=9000,
                                  gpu_indices=list(gpus), cpu_cores=1, memory_mib=128)


def test_an_empty_fleet_is_said_in_a_sentence():
    code, out, err = llmgw("agents", "list")
    assert code == 0 and err == ""
    assert "no agents registered yet" in out and "llmgw agents add NAME" in out
    assert json.loads(llmgw("agents", "list", "--json")[1]) == []


def test_list_shows_each_agents_health_heartbeat_gpus_replicas_and_version(make_model):
    model = make_model("chat")
    gpu_node = _agent("gpu-node-1", seen_s_ago=4.2, version="0.9.1")
    Gpu.objects.create(agent=gpu_node, index=0, name="H100", memory_total_mib=81920, memory_used_mib=40000,
                       utilisation_pct=87.0, temperature_c=71.0)
    Gpu.objects.create(agent=gpu_node, index=1, name="H100", memory_total_mib=81920)
    _replica(model, gpu_node, "ready", (0,))
    _replica(model, gpu_node, "starting", (1,))
    _agent("silent", seen_s_ago=3600 * 2 + 60, cordoned=True)
    _agent("new-box", seen_s_ago=None, connected=False)

    code, out, err = llmgw("agents", "list")
    assert code == 0, err
    lines = {line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0] in
             ("gpu-node-1", "silent", "new-box")}
    assert "alive" in lines["gpu-node-1"] and "4 s ago" in lines["gpu-node-1"]
    assert "2 used of 2" in lines["gpu-node-1"] and "1 ready, 1 starting" in lines["gpu-node-1"]
    assert "0.9.1" in lines["gpu-node-1"]
    assert "lost" in lines["silent"] and "2 h 1 min ago" in lines["silent"] and "yes" in lines["silent"]
    assert "never connected" in lines["new-box"] and "never" in lines["new-box"]

    rows = {a["name"]: a for a in json.loads(llmgw("agents", "list", "--json")[1])}
    node = rows["gpu-node-1"]
    assert node["health"] == "alive" and node["version"] == "0.9.1" and 3.5 < node["heartbeat_age_s"] < 60
    assert node["replicas"] == {"ready": 1, "starting": 1} and node["gpus_used"] == 2
    assert node["gpus"][0] == {"index": 0, "name": "H100", "memory_used_mib": 40000, "memory_total_mib": 81920,
                               "utilisation_pct": 87.0, "temperature_c": 71.0}
    assert node["gpus"][1]["utilisation_pct"] is None
    assert (rows["silent"]["health"], rows["silent"]["cordoned"]) == ("lost", True)
    assert (rows["new-box"]["health"], rows["new-box"]["heartbeat_age_s"]) == ("never connected", None)


def test_an_agent_that_closed_its_socket_but_is_not_lost_yet_is_disconnected():
    _agent("flaky", seen_s_ago=1.0, connected=False)
    (row,) = json.loads(llmgw("agents", "list", "--json")[1])
    assert row["health"] == "disconnected"


def test_cordon_and_uncordon_change_the_flag_once_and_say_so(make_model):
    agent = _agent("gpu-node-1")
    _replica(make_model("chat"), agent)
    code, out, _ = llmgw("agents", "cordon", "gpu-node-1")
    assert code == 0 and "cordoned gpu-node-1: nothing new is placed there" in out
    agent.refresh_from_db()
    assert agent.cordoned
    assert Replica.objects.get().state == "ready"  # what runs there keeps serving
    code, out, _ = llmgw("agents", "cordon", "gpu-node-1")
    assert code == 0 and "was already cordoned" in out
    code, out, _ = llmgw("agents", "uncordon", "gpu-node-1", "--json")
    assert code == 0 and json.loads(out) == {"agent": "gpu-node-1", "cordoned": False, "changed": True}
    agent.refresh_from_db()
    assert not agent.cordoned
    code, out, _ = llmgw("agents", "uncordon", "gpu-node-1")
    assert code == 0 and "was not cordoned" in out


def test_drain_cordons_and_moves_the_replicas_away_naming_models_left_without_a_ready_one(make_model):
    chat, embed = make_model("chat"), make_model("embed")
    node, other = _agent("gpu-node-1"), _agent("gpu-node-2")
    _replica(chat, node, "ready")
    _replica(chat, other, "ready")  # chat stays served
    _replica(embed, node, "ready")
    _replica(embed, node, "starting")
    code, out, err = llmgw("agents", "drain", "gpu-node-1")
    assert code == 0, err
    assert "draining gpu-node-1: cordoned; 3 replica(s) moving away (chat, embed)" in out
    assert "no ready replica left elsewhere for embed" in out and "for chat" not in out
    node.refresh_from_db()
    assert node.cordoned
    states = sorted(Replica.objects.filter(agent=node).values_list("model__name", "state"))
    assert states == [("chat", "draining"), ("embed", "draining"), ("embed", "stopping")]
    assert Replica.objects.get(agent=other).state == "ready"
    assert "drained by" in Replica.objects.filter(agent=node).first().reason
    code, out, _ = llmgw("agents", "drain", "gpu-node-1", "--json")
    assert code == 0 and json.loads(out)["moved"] == 0 and json.loads(out)["changed"] is False


def test_drain_of_an_agent_with_nothing_on_it_only_cordons():
    _agent("idle")
    code, out, _ = llmgw("agents", "drain", "idle")
    assert code == 0 and "idle is now cordoned; it had no ready or starting replica to move" in out
    assert Agent.objects.get().cordoned


@pytest.mark.parametrize("action", ["cordon", "uncordon", "drain", "rekey"])
def test_an_unknown_agent_is_exit_1_with_a_sentence(action):
    _agent("gpu-node-1")
    code, out, err = llmgw("agents", action, "gpu-node-9")
    assert code == 1 and out == ""
    assert "no agent named 'gpu-node-9' (`llmgw agents list` lists them)" in err
    assert not Agent.objects.get().cordoned


@pytest.mark.parametrize(("args", "message"), [
    (("agents", "cordon"), "agents cordon needs the agent's NAME"),
    (("agents", "drain"), "agents drain needs the agent's NAME"),
    (("agents", "add"), "agents add needs the agent's NAME"),
    (("agents", "list", "gpu-node-1"), "agents list takes no NAME"),
    (("agents", "add", "a\nb"), "1 to 128 printable characters"),
    (("agents", "add", "x" * 129), "1 to 128 printable characters"),
])
def test_bad_usage_is_exit_2_and_changes_nothing(args, message):
    code, _, err = llmgw(*args)
    assert code == 2 and message in err, err
    assert not Agent.objects.exists()


def test_add_prints_the_token_once_and_refuses_a_second_agent_of_that_name():
    code, out, _ = llmgw("agents", "add", "gpu-node-1")
    assert code == 0 and "agent gpu-node-1: token " in out
    token = out.split("token ", 1)[1].split()[0]
    assert Agent.authenticate(token).name == "gpu-node-1"
    code, _, err = llmgw("agents", "add", "gpu-node-1")
    assert code == 1 and "exists; `llmgw agents rekey gpu-node-1`" in err
    assert Agent.authenticate(token).name == "gpu-node-1"  # not silently re-keyed


def test_status_shows_each_agents_own_health_and_its_gpus_readings():
    node = _agent("gpu-node-1", seen_s_ago=3.0, version="0.9.1", cordoned=True)
    Gpu.objects.create(agent=node, index=0, name="H100", memory_total_mib=81920, memory_used_mib=1024,
                       utilisation_pct=42.4, temperature_c=65.0)
    Gpu.objects.create(agent=node, index=1, name="H100", memory_total_mib=81920)
    _agent("silent", seen_s_ago=600)
    code, out, _ = llmgw("status")
    assert code == 0
    line = next(line for line in out.splitlines() if line.startswith("gpu-node-1"))
    assert "3 s ago" in line and "0.9.1" in line and "yes" in line
    silent = next(line for line in out.splitlines() if line.startswith("silent"))
    assert "lost" in silent and "10 min ago" in silent
    gpu0 = next(line for line in out.splitlines() if "42%" in line)
    assert "gpu-node-1" in gpu0 and "65 °C" in gpu0 and "1,024/81,920" in gpu0
    gpu1 = [line for line in out.splitlines() if line.startswith("gpu-node-1") and "81,920" in line][1]
    assert gpu1.count("—") >= 2  # not reported: a dash, not 0%
    data = json.loads(llmgw("status", "--json")[1])
    agent = next(a for a in data["agents"] if a["name"] == "gpu-node-1")
    assert agent["health"] == "alive" and agent["version"] == "0.9.1" and agent["cordoned"] is True
    assert agent["gpus"][0]["temperature_c"] == 65.0 and 2 < agent["heartbeat_age_s"] < 60


def test_status_of_an_empty_cluster_says_so_in_sentences():
    code, out, _ = llmgw("status")
    assert code == 0
    assert "agents: no agents registered yet" in out
    assert "models: the catalog has no models yet" in out
    assert "replicas: none running" in out
    assert "GPUs" not in out  # no GPU table without GPUs


def _cells(out: str, first: str) -> list[str]:
    """The cells of the table row starting with ``first``."""
    line = next(line for line in out.splitlines() if line.startswith(first + " "))
    return [cell.strip() for cell in line.split("│")]


def test_status_shows_the_same_health_word_as_agents_list_and_how_long_each_has_been_connected():
    _agent("up-box", seen_s_ago=2.0, connected_since=timezone.now() - timedelta(seconds=91))
    _agent("flaky", seen_s_ago=1.0, connected=False)
    _agent("silent", seen_s_ago=600)
    _agent("new-box", seen_s_ago=None, connected=False)
    status_out, list_out = llmgw("status")[1], llmgw("agents", "list")[1]
    assert re.search(r"name\s+┃ health\s+┃ for\s+┃ heartbeat", status_out)  # "connected for", "last heartbeat"
    assert "NO (" not in status_out and "yes, for" not in status_out
    for name, word in (("up-box", "alive"), ("flaky", "disconnected"), ("silent", "lost"),
                       ("new-box", "never connected")):
        assert (_cells(status_out, name)[1], _cells(list_out, name)[1]) == (word, word), name
    assert re.fullmatch(r"1 min 3\d s", _cells(status_out, "up-box")[2])  # connected 91 s ago
    assert _cells(status_out, "up-box")[3] == "2 s ago"
    assert _cells(status_out, "flaky")[2:4] == ["—", "1 s ago"]
    assert _cells(status_out, "new-box")[2:4] == ["—", "never"]
