"""Stopping, starting and showing the cluster: the flag, the planner's answer, the CLI's
output (human and --json), exit codes, and the admin/API doors to the same operations."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import time
from datetime import datetime, timezone as tz

import pytest
from django.core.management import call_command
from django.utils import timezone

from catalog.models import ClusterSettings, Model
from fleet.planning import planner
from fleet.models import Agent, ModelState, Replica
from fleet.ops.operations import start_cluster, stop_cluster
from fleet.control.reconciler import reconcile
from tests.cli import llmgw
from tests.processes import free_port

pytestmark = pytest.mark.django_db




@pytest.fixture
def fleet(make_model):
    agent = Agent.objects.create(name="cpu-1", connected=True, last_seen_at=timezone.now(), cpu_cores=8,
                                 memory_mib=16384, address="127.0.0.1")
    always = make_model("always", min_replicas=2, max_replicas=2)
    od = make_model("lazy", min_replicas=0, max_replicas=1, on_demand=True)
    return agent, always, od


def test_stop_wants_zero_of_every_model_including_min_and_scheduled_ones():
    models = (planner.ModelView(1, "min2", planner.ProfileView(1, cpu_cores=1), min_replicas=2, max_replicas=2),
              planner.ModelView(2, "windowed", planner.ProfileView(1, cpu_cores=1), window_min=3, max_replicas=3),
              planner.ModelView(3, "wanted", planner.ProfileView(1, cpu_cores=1), on_demand=True,
                                wanted_at=datetime(2026, 1, 1, tzinfo=tz.utc)))
    now = datetime(2026, 1, 1, tzinfo=tz.utc)
    for m in models:
        assert planner.desired_replicas(m, planner.Policy(stopped=True), now) == 0


def test_stop_drains_every_engine_and_changes_no_model(fleet):
    agent, always, od = fleet
    before = list(Model.objects.order_by("pk").values())
    reconcile()
    Replica.objects.filter(model=always).update(state="ready", port=1)
    code, out, _ = llmgw("stop", "--by", "ops")
    assert code == 0 and "cluster stopped (by ops)" in out
    reconcile()
    assert set(Replica.objects.filter(model=always).values_list("state", flat=True)) == {"draining"}
    assert ModelState.objects.get(model=always).desired == 0
    assert list(Model.objects.order_by("pk").values()) == before
    cluster = ClusterSettings.get_solo()
    assert cluster.stopped and cluster.stopped_by == "ops" and cluster.stopped_at is not None


def test_start_places_again_and_on_demand_models_stay_at_zero(fleet):
    agent, always, od = fleet
    stop_cluster("ops")
    reconcile()
    assert not Replica.objects.exists()
    code, out, _ = llmgw("start")
    assert code == 0 and "cluster started" in out
    reconcile()
    assert Replica.objects.filter(model=always).count() == 2
    assert Replica.objects.filter(model=od).count() == 0
    assert not ClusterSettings.get_solo().stopped


def test_stop_and_start_twice_say_so():
    assert stop_cluster("a") and not stop_cluster("b")
    assert ClusterSettings.get_solo().stopped_by == "a"
    assert start_cluster() and not start_cluster()


def test_status_of_a_serving_cluster(fleet):
    fleet[2].routing_policy = "session"
    fleet[2].save(update_fields=["routing_policy"])
    reconcile()
    code, out, _ = llmgw("status")
    assert code == 0
    assert "serving" in out and "STOPPED" not in out
    assert "cpu-1" in out and "always" in out and "lazy (on demand)" in out
    data = json.loads(llmgw("status", "--json")[1])
    assert data["serving"] is True and data["stopped"] is False
    assert {m["name"]: (m["desired"], m["ready"]) for m in data["models"]} == {"always": (2, 0), "lazy": (0, 0)}
    assert "placed on cpu-1" in next(m for m in data["models"] if m["name"] == "always")["reason"]
    assert {m["name"]: m["routing_policy"] for m in data["models"]} == {"always": "least-loaded", "lazy": "session"}
    assert data["agents"][0] == {**data["agents"][0], "name": "cpu-1", "connected": True, "cpu_cores": 8}
    assert len(data["replicas"]) == 2


def test_status_says_how_long_each_agent_has_been_connected(fleet):
    """An agent restarted (or cut off and back) shows it: its connection is young."""
    from datetime import timedelta

    from django.utils import timezone

    agent, _, _ = fleet
    Agent.objects.filter(pk=agent.pk).update(connected_since=timezone.now() - timedelta(seconds=12.4))
    asked = time.monotonic()
    data = json.loads(llmgw("status", "--json")[1])
    assert data["agents"][0]["connected_since"] is not None
    code, out, _ = llmgw("status")
    late_s = time.monotonic() - asked  # a loaded machine may take seconds over the commands
    row = next(line for line in out.splitlines() if line.startswith(agent.name))
    assert code == 0 and "alive" in row, out  # health, then how long connected
    connected_for = re.search(r"│ (\d+) s +│", row)
    assert connected_for and 12 <= int(connected_for[1]) <= 13 + late_s, row
    Agent.objects.filter(pk=agent.pk).update(connected_since=timezone.now() - timedelta(hours=3, minutes=5))
    row = next(line for line in llmgw("status")[1].splitlines() if line.startswith(agent.name))
    assert "3 h 5 min" in row


def test_status_of_a_stopped_cluster(fleet):
    stop_cluster("night-shift")
    reconcile()
    code, out, _ = llmgw("status")
    assert code == 0 and "STOPPED" in out and "night-shift" in out
    assert "cluster stopped" in out  # the models' "why", not an empty column
    data = json.loads(llmgw("status", "--json")[1])
    assert data["stopped"] is True and data["serving"] is False and data["stopped_by"] == "night-shift"
    assert all(m["desired"] == 0 for m in data["models"])


def test_status_names_the_lease_holder_leader_and_every_other_worker_a_standby_on_every_call():
    from fleet.models import ControlPlane, LeaderLease

    for host, role, pid in [("cp-a", "worker", 10), ("cp-a", "worker", 11), ("cp-a", "web", 12), ("cp-b", "worker", 7)]:
        ControlPlane.objects.create(host=host, role=role, pid=pid)
    ControlPlane.objects.create(host="cp-c", role="worker", pid=1, last_seen_at=timezone.now() - timezone.timedelta(
        minutes=5))  # gone: not listed
    assert LeaderLease.take_or_renew("cp-a:11", timezone.now(), 60.0)
    answers = [json.loads(llmgw("status", "--json")[1]) for _ in range(3)]
    assert answers[0]["control_planes"] == answers[1]["control_planes"] == answers[2]["control_planes"]
    data = answers[0]
    assert (data["leader"], data["leader_process"]) == ("cp-a", "cp-a:11")
    # Only this test's rows: a web process of the test run itself (its watcher, started by an
    # earlier test through the ASGI app) may have registered too.
    ours = [c for c in data["control_planes"] if c["host"].startswith("cp-")]
    assert [(c["host"], c["role"], c["pid"], c["leader"], c["standby"]) for c in ours] == [
        ("cp-a", "web", 12, False, False), ("cp-a", "worker", 10, False, True), ("cp-a", "worker", 11, True, False),
        ("cp-b", "worker", 7, False, True)]
    code, out, _ = llmgw("status")
    assert code == 0 and "leader cp-a:11" in out and out.count("standby") == 2
    LeaderLease.release("cp-a:11")
    data = json.loads(llmgw("status", "--json")[1])
    assert data["leader"] is None and not any(c["leader"] for c in data["control_planes"])
    assert "no worker leads" in llmgw("status")[1]


def test_stop_wait_times_out_with_exit_code_1(fleet):
    agent, always, _ = fleet
    Replica.objects.create(model=always, profile=always.profile, agent=agent, state="ready", port=1)
    code, out, err = llmgw("stop", "--wait", "--timeout-s", "0.3")
    assert code == 1 and "still running" in err


@pytest.mark.django_db(transaction=True)  # start's pass runs on commit (inline here: Q sync)
def test_start_wait_waits_for_ready_replicas_and_names_the_models_short_of_them(fleet):
    agent, always, _ = fleet
    stop_cluster("test")
    reconcile()
    code, out, err = llmgw("start", "--wait", "--timeout-s", "1.5")
    assert code == 1 and "always: 0 of 2 ready" in err and "lazy" not in err  # on demand: none wanted
    assert "\r" not in out  # not a terminal: one line per change, no carriage returns
    Replica.objects.filter(model=always).update(state="ready", port=1)
    code, out, err = llmgw("start", "--wait", "--timeout-s", "5")
    assert code == 0 and "already serving" in out and "every model has its replicas ready" in out


def test_stop_wait_progress_is_one_line_per_change_without_a_terminal(fleet):
    agent, always, _ = fleet
    Replica.objects.create(model=always, profile=always.profile, agent=agent, state="ready", port=1)
    code, out, err = llmgw("stop", "--wait", "--timeout-s", "1.2")
    assert code == 1 and out.count("1 replica(s) still stopping") == 1 and "\r" not in out


def test_every_command_has_help(capsys):
    from llmgw.cli import COMMANDS

    for name in COMMANDS:
        with pytest.raises(SystemExit) as exc:
            call_command("llmgw", name, "--help", stdout=io.StringIO())
        assert exc.value.code == 0
        shown = capsys.readouterr().out  # argparse prints to the process's stdout
        assert shown.startswith(f"usage: llmgw {name} [-h]") and "\noptions:\n" in shown, shown[:300]
        assert shown.split("\n\n")[1].strip(), f"llmgw {name} --help has no description"


def test_version_is_llmgws():
    import subprocess

    from tests.processes import PYTHON, ROOT

    done = subprocess.run([PYTHON, "manage.py", "llmgw", "--version"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("llmgw 0.") and "Django 5.2" in done.stdout


def fake_bin(tmp_path, name: str, body: str) -> None:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_service_without_systemd_is_a_clear_message_and_exit_3(tmp_path, monkeypatch):
    fake_bin(tmp_path, "systemctl", 'echo offline; exit 1\n')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    code, out, err = llmgw("service", "status")
    assert code == 3 and "systemd does not manage this machine's services" in err and "Traceback" not in err


def test_service_drives_systemctl(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    fake_bin(tmp_path, "systemctl", f'echo "$@" >> {calls}\n[ "$1" = is-system-running ] && echo running\nexit 0\n')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert llmgw("service", "restart", "--only", "web,worker")[0] == 0
    assert "restart llmgw-web.service llmgw-worker.service" in calls.read_text()


def test_service_install_writes_units_with_kill_mode_process_for_the_agent(tmp_path, monkeypatch):
    fake_bin(tmp_path, "systemctl", '[ "$1" = is-system-running ] && echo running\nexit 0\n')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    units = tmp_path / "units"
    assert llmgw("service", "install", "--dir", str(units))[0] == 0
    agent_unit = (units / "llmgw-agent.service").read_text()
    assert "KillMode=process" in agent_unit and "llmgw agent" in agent_unit
    assert "llmgw worker" in (units / "llmgw-worker.service").read_text()
    # The web unit runs uvicorn as `llmgw up` does, with its bounds and exposure check.
    assert "llmgw web --host ${LLMGW_HOST}" in (units / "llmgw-web.service").read_text()
    # ... with LLMGW_WEB_WORKERS processes (auto unless /etc/llmgw/llmgw.env says otherwise).
    assert "--workers ${LLMGW_WEB_WORKERS}" in (units / "llmgw-web.service").read_text()
    assert "Environment=LLMGW_WEB_WORKERS=auto\n" in (units / "llmgw-web.service").read_text()
    assert (units / "llmgw-web.service").stat().st_mode & 0o777 == 0o644


def test_llmgw_web_on_a_public_address_needs_allowed_hosts_and_starts_nothing(monkeypatch, settings):
    from llmgw.cli import web

    settings.LLMGW_ALLOWED_HOSTS = []
    execs = []
    monkeypatch.setattr(web.os, "execve", lambda *a: execs.append(a))
    err = io.StringIO()
    port = free_port()  # not 8000: a web process may be listening there on this machine
    assert web.run({"host": "0.0.0.0", "port": port}, io.StringIO(), err) == 2
    assert "LLMGW_ALLOWED_HOSTS" in err.getvalue() and execs == []
    assert web.run({"host": "127.0.0.1", "port": port, "workers": "1"}, io.StringIO(), io.StringIO()) == 1
    (path, argv, env), = execs
    assert "--limit-concurrency" in argv and "llmgw.http:HeaderTimeoutProtocol" in argv and "127.0.0.1" in argv


def test_restart_orders_agents_then_standbys_then_the_leader_then_itself(tmp_path, monkeypatch, fleet):
    import socket

    from fleet.models import ControlPlane, LeaderLease

    calls = tmp_path / "calls"
    fake_bin(tmp_path, "ssh", f'echo "ssh $@" >> {calls}\nexit 0\n')
    fake_bin(tmp_path, "systemctl", f'[ "$1" = is-system-running ] && echo running && exit 0\necho "systemctl $@" >> {calls}\n')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    me = socket.gethostname()
    for host, role in [("cp-leader", "worker"), ("cp-b", "web"), ("cp-a", "web"), (me, "web"), ("cp-leader", "web")]:
        ControlPlane.objects.create(host=host, role=role, pid=1)
    assert LeaderLease.take_or_renew("cp-leader:1", timezone.now(), 60.0)
    # The agent "comes back" at once: a connected session newer than the request.
    agent = fleet[0]
    Agent.objects.filter(pk=agent.pk).update(connected_since=timezone.now() + timezone.timedelta(seconds=5))
    code, out, err = llmgw("restart", "--timeout-s", "2")
    assert code == 0, err
    assert out.index("agents: asked 1") < out.index("cp-a") < out.index("cp-b") < out.index("cp-leader")
    lines = calls.read_text().splitlines()
    assert [line.split()[3] if line.startswith("ssh") else "self" for line in lines] == ["cp-a", "cp-b", "cp-leader", "self"]
    assert lines[-1] == "systemctl restart llmgw-web.service llmgw-worker.service"
    assert Agent.objects.get(pk=agent.pk).restart_generation == 1


def test_restart_without_systemd_says_how_to_restart_up_and_exits_3(tmp_path, monkeypatch, fleet):
    fake_bin(tmp_path, "systemctl", "echo offline\nexit 1\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    agent = fleet[0]
    Agent.objects.filter(pk=agent.pk).update(connected_since=timezone.now() + timezone.timedelta(seconds=5))
    code, out, err = llmgw("restart", "--timeout-s", "2")
    assert code == 3, err
    assert "systemd does not manage this machine's services (systemctl says: offline)" in err
    assert "under `llmgw up`: stop it with Ctrl-C and run it again" in err and "Traceback" not in err
    assert Agent.objects.get(pk=agent.pk).restart_generation == 1  # the agents were still asked


def test_admin_stops_the_cluster_only_after_confirmation(admin_client):
    ClusterSettings.get_solo()
    page = admin_client.get("/admin/catalog/clustersettings/stop/")
    assert page.status_code == 200 and b"Yes, stop the cluster" in page.content
    assert not ClusterSettings.get_solo().stopped
    admin_client.post("/admin/catalog/clustersettings/stop/")
    assert ClusterSettings.get_solo().stopped and ClusterSettings.get_solo().stopped_by == "admin"
    admin_client.post("/admin/catalog/clustersettings/start/")
    assert not ClusterSettings.get_solo().stopped


def test_rest_api_stops_and_starts_for_staff_only(admin_client, client):
    assert client.post("/api/cluster/stop/").status_code == 401
    assert not ClusterSettings.get_solo().stopped
    assert admin_client.post("/api/cluster/stop/").json() == {"stopped": True, "changed": True}
    assert admin_client.get("/api/cluster/").json()["stopped"] is True
    assert admin_client.post("/api/cluster/start/").json()["stopped"] is False


def test_revoking_a_key_twice_says_it_already_was(db):
    from gateway.models import ApiKey

    ApiKey.create_key("alice")
    code, out, _ = llmgw("keys", "revoke", "alice")
    assert code == 0 and out.startswith("revoked alice")
    code, out, _ = llmgw("keys", "revoke", "alice")
    assert code == 0 and "alice" in out and "was already revoked, at" in out


def test_the_gateways_own_4xx_answers_are_not_logged_as_django_warnings():
    import logging

    from django.test import RequestFactory

    from llmgw.logfilters import SkipGatewayAnswers

    def record(path, status, exc_info=None):
        r = logging.LogRecord("django.request", logging.WARNING, __file__, 1, "x", None, exc_info)
        r.request, r.status_code = RequestFactory().post(path), status
        return r

    keep = SkipGatewayAnswers().filter
    assert not keep(record("/v1/chat/completions", 401)) and not keep(record("/v1/x", 404))
    assert not keep(record("/v1/chat/completions", 503))
    assert keep(record("/v1/chat/completions", 500)) and keep(record("/api/models/", 400))


def test_revoking_by_a_prefix_many_keys_share_is_refused(db):
    from gateway.models import ApiKey

    ApiKey.create_key("one")
    ApiKey.create_key("two")
    code, _, err = llmgw("keys", "revoke", "llmgw-key-")
    assert code == 2 and "start of 2 keys' prefixes" in err
    assert not ApiKey.objects.filter(revoked_at__isnull=False).exists()


def test_stop_on_a_stopped_cluster_names_who_stopped_it(fleet):
    stop_cluster("night-shift")
    code, out, _ = llmgw("stop", "--by", "someone-else")
    assert code == 0 and "already stopped (by night-shift" in out


def test_status_explains_a_model_no_pass_has_looked_at(make_model):
    make_model("fresh", min_replicas=2, max_replicas=2)
    code, out, _ = llmgw("status")
    assert code == 0 and "not looked at by a reconcile pass yet" in out
