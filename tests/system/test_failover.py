"""Control-plane failover with real processes: two workers (``llmgw worker``), one web
process and an agent. One worker holds the leader lease and runs the passes; killed with
SIGKILL (its whole process group), the other takes over and passes resume within seconds,
and ``status`` names the new leader; given SIGTERM while a long task runs, a worker exits
within its grace and hands the lease over at once. A web process is listed as a control
plane from its start, before any request. Runs on the suite's database (SQLite file, or
PostgreSQL + Redis in the second CI pass)."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from catalog.models import ClusterSettings
from fleet.models import Agent, ControlPlane, LeaderLease, PassLock
from fleet.ops.operations import cluster_status
from llmgw.cli.worker import descendants
from tests.multicluster import MultiCluster
from tests.processes import free_port, wait_until, web_server

pytestmark = [pytest.mark.timeout(300)]

LEASE_S, RENEW_S, GRACE_S = 3.0, 0.5, 5.0
LEASE_ENV = {
    "LLMGW_LEADER_LEASE": f"{LEASE_S}s",
    "LLMGW_LEADER_RENEW": f"{RENEW_S}s",
    "LLMGW_PASS_LOCK_TTL": "3s",
    "LLMGW_WORKER_STOP_GRACE": f"{GRACE_S}s",
    "LLMGW_RECONCILE_INTERVAL": "0.5s",
}
HOST = socket.gethostname()


def hold(marker_dir: str, seconds: float) -> None:
    """A long task (run by a worker): says which process runs it, then sleeps."""
    Path(marker_dir, str(os.getpid())).write_text("")
    time.sleep(seconds)


@pytest.fixture(scope="module")
def planes(django_db_setup, django_db_blocker, tmp_path_factory):
    with django_db_blocker.unblock():
        ClusterSettings.get_solo()
        tokens = {"a": Agent.create_with_token("a")[1]}
        cluster = MultiCluster(tmp_path_factory.mktemp("failover"), tokens, webs=1, workers=2, env=LEASE_ENV)
        try:
            yield cluster
        finally:
            cluster.stop()
            call_command("flush", interactive=False, verbosity=0)


def leader_index(cluster: MultiCluster) -> int:
    """Which of ``cluster.workers`` holds the lease, once both have registered."""
    def found():
        listed = {c["pid"] for c in cluster_status()["control_planes"] if c["role"] == "worker"}
        if not {w.pid for w in cluster.workers} <= listed:
            return None
        holder = LeaderLease.leader(timezone.now())
        return next((i + 1 for i, w in enumerate(cluster.workers) if holder == f"{HOST}:{w.pid}"), None)

    return wait_until(found, timeout_s=60, what="both workers registered, one of them leading") - 1


def last_pass() -> tuple:
    return tuple(PassLock.objects.filter(pk=1).values_list("last_pass_at", "last_pass_holder").first() or (None, ""))


def test_a_web_process_is_listed_from_its_start_before_any_request(planes, tmp_path):
    web = web_server(free_port(), tmp_path, env=planes.env)
    try:
        wait_until(lambda: ControlPlane.objects.filter(role="web", pid=web.pid).exists(), timeout_s=60,
                   what="the new web process to register without a request")
        assert any(c["role"] == "web" and c["pid"] == web.pid for c in cluster_status()["control_planes"])
    finally:
        web.stop()


def test_a_killed_leader_is_replaced_within_seconds_and_status_names_the_new_one(planes):
    i = leader_index(planes)
    old, new = planes.workers[i], planes.workers[1 - i]
    status = cluster_status()
    assert status["leader_process"] == f"{HOST}:{old.pid}"
    assert [c["pid"] for c in status["control_planes"] if c["standby"]] == [new.pid]
    os.killpg(old.pid, signal.SIGKILL)  # the whole qcluster: sentinel, pusher, monitor, workers
    old.proc.wait(30)
    killed_at, killed = time.monotonic(), timezone.now()
    wait_until(lambda: last_pass()[1] == f"{HOST}:{new.pid}" and last_pass()[0] > killed, timeout_s=60,
               what="a pass by the standby after the leader was killed")
    took_s = time.monotonic() - killed_at
    assert took_s < 20, f"no pass for {took_s:.1f} s after the leader died (lease {LEASE_S} s)"
    for _ in range(3):  # the same answer on every call
        status = cluster_status()
        assert status["leader_process"] == f"{HOST}:{new.pid}"
        assert [c["pid"] for c in status["control_planes"] if c["leader"]] == [new.pid]
    planes.start_worker(i)  # back, as a standby
    wait_until(lambda: [c["pid"] for c in cluster_status()["control_planes"] if c["standby"]] == [planes.workers[i].pid],
               timeout_s=60, what="the restarted worker to stand by")
    assert LeaderLease.leader(timezone.now()) == f"{HOST}:{new.pid}"


def test_a_worker_given_sigterm_during_a_long_task_exits_within_its_grace_and_hands_over_at_once(planes, tmp_path):
    from django_q.tasks import async_task

    i = leader_index(planes)
    leader, standby = planes.workers[i], planes.workers[1 - i]
    for _ in range(8):  # more than both clusters hold (one task process each, one queued, one in hand)
        async_task("tests.system.test_failover.hold", str(tmp_path), 120, sync=False)

    def leaders_tasks() -> list[int]:
        under = set(descendants(leader.pid))
        return [int(p.name) for p in tmp_path.iterdir() if int(p.name) in under]

    try:
        holding = wait_until(leaders_tasks, timeout_s=60, what="the leader's task process to run a long task")
    except TimeoutError:
        pytest.fail(f"no long task under the leader {leader.pid} ({descendants(leader.pid)}): "
                    f"{sorted(p.name for p in tmp_path.iterdir())}\n{planes.logs()}")
    leader.proc.send_signal(signal.SIGTERM)
    signalled_at = time.monotonic()
    wait_until(lambda: LeaderLease.leader(timezone.now()) == f"{HOST}:{standby.pid}", timeout_s=60,
               what="the standby to take the released lease")
    handed_over_s = time.monotonic() - signalled_at
    leader.proc.wait(GRACE_S + 30)
    exited_s = time.monotonic() - signalled_at
    assert exited_s < GRACE_S + 10, f"exited {exited_s:.1f} s after SIGTERM (grace {GRACE_S} s)"
    # Released, not expired: the standby took it at a renewal, before the lease ran out.
    assert handed_over_s < exited_s or handed_over_s < LEASE_S, (handed_over_s, exited_s)
    assert "stopped in" in leader.log() and "lease released" in leader.log(), leader.log()[-3000:]
    assert not ControlPlane.objects.filter(role="worker", pid=leader.pid).exists()
    assert not [pid for pid in holding if alive(pid)], "the long task outlived its worker"


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_worker_whose_task_cluster_dies_exits_1_and_unregisters(planes):
    worker = planes.start_worker(len(planes.workers))
    wait_until(lambda: ControlPlane.objects.filter(role="worker", pid=worker.pid).exists(), timeout_s=60,
               what="the third worker to register")
    sentinel = wait_until(lambda: [int(pid) for pid in Path(f"/proc/{worker.pid}/task/{worker.pid}/children")
                                   .read_text().split()], timeout_s=60, what="its sentinel")[0]
    forks = wait_until(lambda: descendants(sentinel) if len(descendants(sentinel)) >= 3 else None, timeout_s=60,
                       what="the sentinel's pusher, monitor and task process")
    os.kill(sentinel, signal.SIGKILL)
    assert worker.proc.wait(60) == 1, worker.log()[-3000:]
    assert "the task cluster exited" in worker.log()
    assert not ControlPlane.objects.filter(role="worker", pid=worker.pid).exists()
    # Its orphaned pusher and task processes would go on taking tasks: killed on the way out.
    wait_until(lambda: not [pid for pid in forks if alive(pid)], timeout_s=30, what="the orphaned forks to be gone")
