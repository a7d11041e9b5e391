"""Faults with real processes: two web processes behind one address, two workers, two
agents (each behind a link a test can cut), fake engines. Each test asserts what is routed
(the replica that answered), what is placed (Replica rows) and that no request is answered
with a 500, while an agent is killed and brought back, a link is cut for less and for more
than the grace, a web process restarts, an engine crashes in a loop, and two workers race
for the pass lock. One cluster for the module; runs on the suite's database (SQLite, or
PostgreSQL + Redis in the second CI pass). PostgreSQL restarts: tests/system/test_pg_restart.py."""

from __future__ import annotations

import io
import itertools
import os
import re
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from django.core.management import call_command

from catalog.models import ClusterSettings, Model, Profile
from fleet.models import Agent, ModelState, PassLock, Replica
from tests.cluster import fake_profile
from tests.multicluster import MultiCluster, Traffic
from tests.processes import wait_until

pytestmark = [pytest.mark.timeout(150)]

FLAKY_ENGINE = Path(__file__).resolve().parent.parent / "flaky_engine.py"
ROUTE_GRACE_S, LOST_AFTER_S = 2.0, 5.0  # as in tests.multicluster.FAULT_ENV


@pytest.fixture(scope="module")
def fleet(django_db_setup, django_db_blocker, tmp_path_factory):
    with django_db_blocker.unblock():
        ClusterSettings.get_solo()
        tokens = {name: Agent.create_with_token(name)[1] for name in ("a", "b")}
        cluster = MultiCluster(tmp_path_factory.mktemp("faults"), tokens, webs=2, workers=2,
                               worker_env={"LLMGW_LOG_LEVEL": "DEBUG"})
        try:
            wait_until(lambda: Agent.objects.filter(connected=True).exclude(address="").count() == 2,
                       timeout_s=30, what="both agents to say hello")
            yield cluster
        finally:
            cluster.stop()
            call_command("flush", interactive=False, verbosity=0)


@pytest.fixture(autouse=True)
def whole_again(fleet):
    """Each test starts and ends with every process up and every link open."""
    yield
    for i, web in enumerate(fleet.webs):
        if web is None:
            fleet.start_web(i)
    for name, handle in fleet.agents.items():
        handle.link.resume()
        if handle.proc is None or handle.proc.proc.poll() is not None:
            fleet.start_agent(name)


def place(name: str, *engine_args: str, replicas: int = 1, profile: Profile | None = None) -> Model:
    model = Model(name=name, weights="file:/dev/null", profile=profile or fake_profile(f"p-{name}", *engine_args),
                  min_replicas=replicas, max_replicas=replicas)
    model.full_clean()
    model.save()
    return model


def ready(model: Model) -> list[Replica]:
    return list(Replica.objects.filter(model=model, state="ready").select_related("agent").order_by("id"))


def wait_ready(model: Model, timeout_s: float = 30) -> list[Replica]:
    return wait_until(lambda: ready(model), timeout_s=timeout_s, what=f"a ready replica of {model.name}")


def wait_for_state(fleet, replica: Replica, state: str, timeout_s: float, what: str) -> None:
    """Wait until ``replica`` is in ``state``; on a timeout, fail naming every replica row of
    its model and the cluster's logs, so a failure under load says where it got stuck."""
    try:
        wait_until(lambda: state_of(replica) == state, timeout_s=timeout_s, what=what)
    except TimeoutError:
        rows = list(Replica.objects.filter(model_id=replica.model_id).order_by("id").values_list(
            "id", "agent__name", "state", "reason", "ready_at", "state_changed_at"))
        pytest.fail(f"timed out after {timeout_s} s waiting for {what}: {rows}\n{fleet.logs()}")


def state_of(replica: Replica) -> str:
    return Replica.objects.values_list("state", flat=True).get(pk=replica.pk)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie no one has reaped yet is gone too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Stream(threading.Thread):
    """One streaming chat request read in a thread; ``first`` is set at the first chunk."""

    def __init__(self, url: str, model: str) -> None:
        super().__init__(daemon=True)
        self.url, self.model = url, model
        self.first = threading.Event()
        self.status: int | None = None
        self.body = b""
        self.start()

    def run(self) -> None:
        body = {"model": self.model, "stream": True, "messages": [{"role": "user", "content": "x"}]}
        with httpx.Client(base_url=self.url, timeout=60) as client, \
                client.stream("POST", "/v1/chat/completions", json=body) as r:
            self.status = r.status_code
            for chunk in r.iter_raw():
                self.body += chunk
                self.first.set()
        self.first.set()


def no_500(traffic: Traffic, allowed: set) -> None:
    assert traffic.answers, "no request was sent"
    assert traffic.statuses() <= allowed, traffic.summary()


def served_after(traffic: Traffic, replica: Replica, after: float) -> list:
    return [a for a in traffic.answers if a.at > after and a.replica.startswith(f"{replica.pk}@")]


# --- tests ---------------------------------------------------------------------------------

def test_two_workers_race_for_the_pass_lock_one_pass_at_a_time_nothing_placed_twice(fleet):
    from django_q.tasks import async_task

    from fleet.ops.operations import cluster_status

    profile = fake_profile("p-race")
    models = [place(f"race-{i}", profile=profile) for i in range(6)]
    for _ in range(40):  # a burst of pass requests, taken by both workers at once
        async_task("fleet.tasks.reconcile_now", sync=False)
    for m in models:
        wait_ready(m)
    pattern = re.compile(r"pass by (\S+) ran from ([\d.]+) to ([\d.]+)")

    def passes():
        return sorted((float(a), float(b), h) for w in fleet.workers for h, a, b in pattern.findall(w.log()))

    deadline = time.monotonic() + 30
    while len({h for _, _, h in passes()}) < 2 and time.monotonic() < deadline:
        for _ in range(10):
            async_task("fleet.tasks.reconcile_now", sync=False)
        time.sleep(0.5)
    time.sleep(1.0)
    ran = passes()
    assert len({h for _, _, h in ran}) >= 2, "both workers should have run passes"
    for (_, end, holder), (next_start, _, next_holder) in itertools.pairwise(ran):
        assert next_start >= end, f"{holder} and {next_holder} ran passes at the same time"
    for m in models:
        # A replica that failed (its engine too slow to answer readiness on a loaded machine:
        # this cluster's agents fail engines after 2 s) is replaced, not placed twice; any
        # other extra row — ready, draining, stopped as a surplus — is a double placement.
        placed = list(Replica.objects.filter(model=m).values_list("id", "state", "reason"))
        kept = [row for row in placed if row[1] != "failed"]
        assert len(kept) == 1, f"{m.name} was placed twice: {placed}\n" + "\n".join(
            w.log()[-3000:] for w in fleet.workers)
    status = cluster_status()
    assert status["leader"] == socket.gethostname()
    assert PassLock.objects.get(pk=1).last_pass_holder in {h for _, _, h in ran}
    roles = [(cp["role"], cp["leader"]) for cp in status["control_planes"]]
    assert ("web", False) in roles and roles.count(("worker", True)) == 1


def test_an_agent_killed_mid_stream_loses_its_replica_and_its_duplicate_stops_when_it_returns(fleet):
    model = place("steady", "--tokens", "30", "--token-delay-ms", "100")
    first = wait_ready(model)[0]
    victim = first.agent.name
    other = next(n for n in fleet.agents if n != victim)
    stream = Stream(fleet.url, "steady")
    assert stream.first.wait(10)
    with Traffic(fleet.url, "steady") as traffic:
        fleet.kill_agent(victim)
        killed_at = time.monotonic()
        stream.join(30)
        assert stream.status == 200 and stream.body.count(b"tok") == 30 and b"[DONE]" in stream.body
        second = wait_until(lambda: Replica.objects.filter(model=model, agent__name=other, state="ready").first(),
                            timeout_s=40, what="a successor on the other agent")
        assert state_of(first) == "lost" and "silent for" in Replica.objects.get(pk=first.pk).reason
        assert alive(first.pid), "the engine of a lost agent keeps running"
        time.sleep(0.5)
        fleet.start_agent(victim)  # it adopts the engine and says it runs
        wait_for_state(fleet, first, "stopped", 60, "the duplicate to stop")
        wait_until(lambda: not alive(first.pid), timeout_s=10, what="the duplicate's engine to exit")
        time.sleep(0.5)
    no_500(traffic, {200, 503})
    assert served_after(traffic, first, killed_at + ROUTE_GRACE_S + 1.5) == [], traffic.summary()
    assert traffic.answers[-1].status == 200 and traffic.answers[-1].replica == f"{second.pk}@{other}"
    assert [r.pk for r in ready(model)] == [second.pk]
    assert Replica.objects.filter(model=model).count() == 2  # the successor only, nothing more
    assert "duplicate: agent" in Replica.objects.get(pk=first.pk).reason


def test_a_partition_shorter_than_the_grace_moves_nothing(fleet):
    model = place("blip")
    replica = wait_ready(model)[0]
    link = fleet.agents[replica.agent.name].link
    with Traffic(fleet.url, "blip") as traffic:
        time.sleep(0.5)
        link.pause()
        time.sleep(0.8)
        link.resume()
        time.sleep(2.0)
    no_500(traffic, {200})
    assert traffic.served_by() == [f"{replica.pk}@{replica.agent.name}"]
    assert [r.pk for r in ready(model)] == [replica.pk] and ready(model)[0].pid == replica.pid
    assert Replica.objects.filter(model=model).count() == 1


def test_a_partition_longer_than_the_grace_moves_the_replica_and_the_duplicate_stops_on_return(fleet):
    model = place("island")
    first = wait_ready(model)[0]
    name = first.agent.name
    other = next(n for n in fleet.agents if n != name)
    link = fleet.agents[name].link
    with Traffic(fleet.url, "island") as traffic:
        link.pause()
        cut_at = time.monotonic()
        second = wait_until(lambda: Replica.objects.filter(model=model, agent__name=other, state="ready").first(),
                            timeout_s=40, what="a successor on the other agent")
        assert time.monotonic() - cut_at >= LOST_AFTER_S - 0.5, "moved before the grace was over"
        assert state_of(first) == "lost"
        time.sleep(0.5)
        link.resume()
        wait_for_state(fleet, first, "stopped", 30, "the returning duplicate to stop")
        wait_until(lambda: not alive(first.pid), timeout_s=10, what="its engine to exit")
        time.sleep(0.5)
    no_500(traffic, {200, 503})
    assert served_after(traffic, first, cut_at + ROUTE_GRACE_S + 1.5) == [], traffic.summary()
    assert traffic.served_by()[-1] == f"{second.pk}@{other}"
    assert [r.pk for r in ready(model)] == [second.pk]
    assert Replica.objects.filter(model=model).count() == 2


def test_restarting_a_web_process_keeps_a_stream_on_the_other_and_places_nothing(fleet):
    model = place("longstream", "--tokens", "40", "--token-delay-ms", "100")
    replica = wait_ready(model)[0]
    # Replicas that run (a previous test's may still be on their way out: they may finish).
    serving = ("placing", "downloading", "starting", "ready")
    before = set(Replica.objects.filter(state__in=serving).values_list("id", "state", "pid"))
    stream = Stream(fleet.web_url(1), "longstream")
    assert stream.first.wait(10)
    with Traffic(fleet.url, "longstream", stream=False) as traffic:
        time.sleep(0.3)
        fleet.stop_web(0)
        stopped_at = time.monotonic()
        time.sleep(0.5)
        fleet.start_web(0)
        time.sleep(3.0)
    stream.join(30)
    assert stream.status == 200 and stream.body.count(b"tok") == 40 and b"[DONE]" in stream.body
    # A request in flight on the web process as it stopped gets no answer at all (at most
    # one per client thread); every answer given is a 200.
    no_500(traffic, {200, None})
    lost = [a for a in traffic.answers if a.status is None]
    assert len(lost) <= 2 and all(abs(a.at - stopped_at) < 1.5 for a in lost), traffic.summary()
    assert traffic.answers[-1].status == 200
    assert set(traffic.served_by()) == {f"{replica.pk}@{replica.agent.name}"}
    wait_until(lambda: Agent.objects.filter(connected=True).count() == 2, timeout_s=15, what="agents to reconnect")
    assert set(Replica.objects.filter(state__in=serving).values_list("id", "state", "pid")) == before


def test_an_engine_crash_loop_backs_off_shows_its_log_lines_then_recovers(fleet, tmp_path):
    flag = tmp_path / "broken"
    flag.touch()
    profile = Profile(name="p-flaky", engine=Profile.Engine.CUSTOM,
                      command=f"{{python}} {FLAKY_ENGINE} --crash-while {flag} --host {{host}} --port {{port}}"
                              " --served-name {served_name} --api-key {api_key}",
                      gpus_needed=0, cpu_cores=0.1, memory_mib=64, readiness_path="/v1/models", startup_timeout_s=30)
    profile.full_clean()
    profile.save()
    model = place("flaky", profile=profile)
    with Traffic(fleet.url, "flaky") as traffic:
        wait_until(lambda: Replica.objects.filter(model=model, state="failed").count() >= 4, timeout_s=40,
                   what="four failures")
        failed = list(Replica.objects.filter(model=model).order_by("id"))
        # Each attempt waits base · 2^(n-1) after the n-th failure in a row (0.5, 1, 2 s).
        for n, (prev, nxt) in enumerate(itertools.pairwise(failed[:4]), start=1):
            waited = (nxt.created_at - prev.state_changed_at).total_seconds()
            assert waited >= 0.5 * 2 ** (n - 1) - 0.1, f"attempt {n + 1} came {waited:.2f} s after failure {n}"
        reason = ModelState.objects.get(model=model).reason
        assert reason.startswith("crash loop: "), reason
        assert reason.endswith("last error: engine exited with code 1 while starting: "
                               "RuntimeError: CUDA out of memory (simulated by tests/flaky_engine.py)")
        assert not Replica.objects.filter(model=model, state__in=["starting", "placing"],
                                          created_at__lt=failed[3].state_changed_at).exists()
        error = failed[0].error
        assert error.startswith("engine exited with code 1 while starting") and "allocating KV cache" in error
        out = io.StringIO()
        call_command("llmgw", "explain", "flaky", stdout=out)
        shown = out.getvalue()  # why, then the newest failure with the engine's last log lines
        assert "why:         crash loop:" in shown and "last failure:" in shown
        assert "    RuntimeError: CUDA out of memory" in shown and "allocating KV cache" in shown

        flag.unlink()  # fixed: the next attempt (after at most the 4 s cap) comes up
        recovered = wait_ready(model, timeout_s=30)[0]
        for _ in range(2):  # killed soon after each start: failed and replaced, still backing off
            victim = wait_ready(model, timeout_s=30)[0]
            os.kill(victim.pid, signal.SIGKILL)
            wait_until(lambda v=victim: state_of(v) == "failed", timeout_s=10, what="the killed engine to be failed")
            victim.refresh_from_db()
            assert "engine killed by signal 9" in victim.error
            successor = wait_until(lambda v=victim: Replica.objects.filter(model=model, pk__gt=v.pk).first(),
                                   timeout_s=30, what="a replacement")
            # Ready for less than LLMGW_BACKOFF_RESET_AFTER: the crash loop goes on, at the 4 s cap.
            assert (successor.created_at - victim.state_changed_at).total_seconds() >= 4 - 0.1
            wait_until(lambda s=successor: state_of(s) == "ready", timeout_s=30, what="the replacement to be ready")
        time.sleep(0.5)
    # Before it recovered: 503 with the crash-loop reason; a killed engine: at most a 502.
    no_500(traffic, {200, 502, 503})
    loops = [a for a in traffic.answers if a.status == 503 and "crash loop" in a.error]
    assert loops, traffic.summary()
    assert traffic.answers[-1].status == 200
    assert recovered.pk < ready(model)[0].pk
    assert Replica.objects.filter(model=model, state="ready").count() == 1
