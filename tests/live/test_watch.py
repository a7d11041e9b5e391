"""The web process's watcher on the database (``fleet.live.watch``): heartbeat stamps kept in
memory and written in batches, never backwards, kept through a failed write; a web process
registering again after a gap restarts its listening window; the model status a refresh
loads (crash loops, silent agents, the planner's verdict)."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.utils import timezone

from fleet.live.watch import HeartbeatStamps, _load_view, register_web_process
from fleet.models import Agent, ControlPlane, ModelState, Replica
from fleet.control.planes import listening_since
from tests.rows import agent, replica

pytestmark = pytest.mark.django_db


# --- heartbeat stamps ----------------------------------------------------------------------

def test_heartbeats_are_stamped_on_arrival_and_written_in_one_batch(django_assert_max_num_queries):
    agents = [agent(f"a{i}", seen_s_ago=60) for i in range(20)]
    stamps = HeartbeatStamps()
    before = timezone.now()
    for a in agents:
        stamps.stamp(a.pk)
    with django_assert_max_num_queries(3):  # one UPDATE per distinct 0.1 s
        assert stamps.flush() == 20
    for a in Agent.objects.all():
        assert before - timedelta(seconds=0.11) <= a.last_seen_at <= timezone.now()
    assert stamps.flush() == 0


def test_a_stamp_never_moves_last_seen_backwards():
    a = agent("a", seen_s_ago=0)
    stamps = HeartbeatStamps()
    stamps.pending[a.pk] = timezone.now() - timedelta(seconds=30)  # a late stamp
    stamps.flush()
    assert Agent.objects.get(pk=a.pk).last_seen_at == a.last_seen_at and not stamps.pending


def test_stamps_that_cannot_be_written_are_kept_for_the_next_flush(monkeypatch):
    a = agent("a", seen_s_ago=60)
    stamps = HeartbeatStamps()
    stamps.stamp(a.pk)

    def database_away(*args, **kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr("django.db.models.query.QuerySet.update", database_away)
    with pytest.raises(OperationalError):
        stamps.flush()
    monkeypatch.undo()
    assert list(stamps.pending) == [a.pk]
    stamps.flush()
    assert timezone.now() - Agent.objects.get(pk=a.pk).last_seen_at < timedelta(seconds=5)


# --- loads on heartbeats (issue 14) -------------------------------------------------------

def test_the_loads_of_many_heartbeats_are_written_in_the_flush_in_one_update(make_model,
                                                                             django_assert_max_num_queries):
    from tests.rows import replica

    m = make_model("m")
    agents = [agent(f"a{i}", seen_s_ago=60) for i in range(10)]
    replicas = [replica(m, a) for a in agents for _ in range(3)]
    stamps = HeartbeatStamps()
    now = timezone.now()
    for a in agents:
        stamps.stamp(a.pk, {r.pk: (r.pk % 4, None if r.pk % 5 == 0 else 1) for r in replicas if r.agent_id == a.pk},
                     now=now)
    with django_assert_max_num_queries(2):  # the agents' stamps, then every load at once
        assert stamps.flush() == 10
    for r in Replica.objects.all():
        assert (r.load_running, r.load_waiting) == (r.pk % 4, None if r.pk % 5 == 0 else 1)
        assert now - timedelta(seconds=0.11) <= r.load_reported_at <= now


def test_a_steady_load_is_rewritten_only_when_its_stamp_ages_and_a_change_at_once(make_model, settings,
                                                                                   django_assert_num_queries):
    from tests.rows import replica

    settings.LLMGW_LOAD_STALE_S = 15.0
    m = make_model("m")
    a = agent("a")
    r = replica(m, a)
    stamps = HeartbeatStamps()
    start = timezone.now()
    stamps.stamp(a.pk, {r.pk: (2, 3)}, now=start)
    stamps.flush()
    stamps.stamp(a.pk, {r.pk: (2, 3)}, now=start + timedelta(seconds=4))  # same load, stamp 4 s old: not due
    assert not stamps.pending_loads
    with django_assert_num_queries(1):  # the agent's last_seen_at only
        stamps.flush()
    stamps.stamp(a.pk, {r.pk: (2, 3)}, now=start + timedelta(seconds=5))  # a third of the stale period
    stamps.flush()
    assert Replica.objects.get(pk=r.pk).load_reported_at >= start + timedelta(seconds=4.9)
    stamps.stamp(a.pk, {r.pk: (2, 4)}, now=start + timedelta(seconds=6))  # changed: written at once
    stamps.flush()
    row = Replica.objects.get(pk=r.pk)
    assert (row.load_waiting, row.load_reported_at >= start + timedelta(seconds=5.9)) == (4, True)


def test_a_heartbeat_load_is_written_only_for_the_agents_own_replicas_and_never_backwards(make_model):
    from tests.rows import replica

    m = make_model("m")
    a, b = agent("a"), agent("b")
    theirs = replica(m, b)
    mine = replica(m, a, load_running=9, load_waiting=9, load_reported_at=timezone.now())
    stamps = HeartbeatStamps()
    stamps.stamp(a.pk, {theirs.pk: (5, 5), mine.pk: (1, 1)}, now=timezone.now() - timedelta(seconds=3))
    stamps.flush()
    assert Replica.objects.get(pk=theirs.pk).load_reported_at is None  # not a's to report
    row = Replica.objects.get(pk=mine.pk)
    assert (row.load_running, row.load_reported_at) == (9, mine.load_reported_at)  # a status wrote later


def test_counts_a_heartbeat_cannot_give_are_written_as_unknown(make_model):
    from tests.rows import replica

    m = make_model("m")
    a = agent("a")
    r = replica(m, a, load_running=4, load_waiting=4, load_reported_at=timezone.now() - timedelta(seconds=30))
    stamps = HeartbeatStamps()
    stamps.stamp(a.pk, {r.pk: (None, None)})  # every count of the flush NULL (a CASE of NULLs)
    stamps.flush()
    row = Replica.objects.get(pk=r.pk)
    assert (row.load_running, row.load_waiting) == (None, None)
    assert timezone.now() - row.load_reported_at < timedelta(seconds=5)


def test_loads_that_cannot_be_written_are_kept_for_the_next_flush(make_model, monkeypatch):
    from tests.rows import replica

    m = make_model("m")
    a = agent("a")
    r = replica(m, a)
    stamps = HeartbeatStamps()
    stamps.stamp(a.pk, {r.pk: (1, 2)})

    def database_away(*args, **kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr("django.db.models.query.QuerySet.update", database_away)
    with pytest.raises(OperationalError):
        stamps.flush()
    monkeypatch.undo()
    assert list(stamps.pending_loads) == [r.pk] and not stamps.written_loads
    stamps.flush()
    assert (Replica.objects.get(pk=r.pk).load_running, Replica.objects.get(pk=r.pk).load_waiting) == (1, 2)


def test_a_stamp_is_only_kept_in_memory(django_assert_num_queries):
    from fleet.live.watch import heartbeats

    with django_assert_num_queries(0):
        heartbeats.stamp(42)
    assert 42 in heartbeats.pending
    heartbeats.pending.clear()


# --- registering: a web process's listening window -----------------------------------------

def test_a_web_process_that_re_registers_after_a_gap_restarts_the_listening_window(settings):
    settings.LLMGW_CONTROL_PLANE_HEARTBEAT_S = 1.0
    import os

    long_ago = timezone.now() - timedelta(hours=1)
    ControlPlane.objects.create(host=socket.gethostname(), role="web", pid=os.getpid(), started_at=long_ago,
                                last_seen_at=long_ago + timedelta(minutes=50))  # then the database went away
    register_web_process()
    row = ControlPlane.objects.get(pid=os.getpid())
    assert timezone.now() - row.started_at < timedelta(seconds=5)
    assert listening_since(timezone.now()) == row.started_at
    register_web_process()  # no gap: the window stays
    assert ControlPlane.objects.get(pid=os.getpid()).started_at == row.started_at


# --- model status: what held requests are answered from --------------------------------------

@pytest.fixture(autouse=True)
def _keep_the_test_connection(monkeypatch):
    """A refresh closes old connections first (it runs in a worker thread); here it runs in
    the test's transaction, whose connection must stay open."""
    monkeypatch.setattr("fleet.live.watch.close_old_connections", lambda: None)


def _failed(model, on, failed_s_ago: float, error: str = "", ready_for_s: float | None = None):
    at = timezone.now() - timedelta(seconds=failed_s_ago)
    ready_at = None if ready_for_s is None else at - timedelta(seconds=ready_for_s)
    r = replica(model, on, state="failed", error=error, ready_at=ready_at)
    Replica.objects.filter(pk=r.pk).update(state_changed_at=at)
    return at


def test_a_refresh_carries_a_crash_loop_with_its_last_error_line_and_next_try(make_model, settings):
    settings.LLMGW_BACKOFF_BASE_S, settings.LLMGW_BACKOFF_CAP_S, settings.LLMGW_BACKOFF_RESET_AFTER_S = 5.0, 300.0, 60.0
    m, other = make_model("loopy"), make_model("fine")
    a = agent("a")
    _failed(m, a, 600, "engine exited", ready_for_s=3600)  # it ran an hour, then failed: forgives nothing older
    _failed(m, a, 500, "old")
    last = _failed(m, a, 2, "engine exited with code 1 while starting; last lines:\n  loading\n"
                            "  RuntimeError: CUDA out of memory\n\n")
    _failed(other, a, 7200, "too old to count")
    view, _ = _load_view([])
    failures = view.status[m.pk].failures
    assert failures.count == 3 and failures.last_at == last
    # The agent's words, then the log line that names the trouble (fleet.protocol.error_summary).
    assert failures.last_error == "engine exited with code 1 while starting; last lines: RuntimeError: CUDA out of memory"
    assert failures.retry_at == last + timedelta(seconds=20)  # 5 · 2^(3-1)
    assert other.pk not in view.status
    # A replica that stayed ready for LLMGW_BACKOFF_RESET_AFTER before failing starts the loop over.
    _failed(m, a, 1, "killed", ready_for_s=120)
    assert _load_view([])[0].status[m.pk].failures.count == 1


def test_the_crash_loop_is_one_query_however_many_failures(make_model):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    m = make_model("loopy")
    a = agent("a")
    with CaptureQueriesContext(connection) as counted:
        _load_view([])
    assert sum("fleet_replica" in q["sql"] for q in counted.captured_queries) == 2  # routes, failures
    for i in range(10):
        _failed(m, a, 100 - i, f"error {i}")
    with CaptureQueriesContext(connection) as again:
        view, _ = _load_view([])
    assert len(again.captured_queries) == len(counted.captured_queries)
    assert view.status[m.pk].failures.count == 10


def test_a_refresh_names_the_silent_agents_whose_ready_replicas_routing_dropped(make_model, settings):
    settings.LLMGW_AGENT_ROUTE_GRACE_S, settings.LLMGW_AGENT_LOST_AFTER_S = 2.0, 20.0
    m = make_model("on-quiet")
    quiet, loud = agent("gpu-node-2", seen_s_ago=14), agent("gpu-node-1")
    replica(m, quiet)
    view, _ = _load_view([])
    assert not view.routes.get(m.pk) and view.agent_lost_after_s == 20.0
    [silent] = view.status[m.pk].silent_agents
    assert silent.name == "gpu-node-2" and silent.silent_since == Agent.objects.get(pk=quiet.pk).last_seen_at
    replica(m, loud)  # another ready replica: served by it, the silent one is still named
    view, _ = _load_view([])
    assert [e.agent_name for e in view.routes[m.pk]] == ["gpu-node-1"]


def test_a_refresh_says_whether_a_pass_looked_at_a_model_and_what_it_wants(make_model):
    new, seen = make_model("new"), make_model("seen")
    ModelState.objects.create(model=seen, desired=1, reason="placing", reason_at=timezone.now())
    view, _ = _load_view([])
    assert new.pk not in view.status  # no row: not looked at
    assert view.status[seen.pk].looked_at and view.status[seen.pk].desired == 1


# --- routes an agent withdrew -----------------------------------------------------------------

def test_a_replica_its_agent_reports_not_ready_leaves_routing_at_once_and_stays_out_until_the_rows_agree(
        monkeypatch):
    """The agent's report reaches the consumer before its rows are written (a busy database
    can take seconds): the route goes at once, a refresh from rows not yet written does not
    bring it back, and once a refresh agrees — or the agent says ready again — the watcher
    routes by the rows alone. An agent cannot withdraw another agent's replica."""
    import asyncio

    from fleet.live import watch
    from fleet.live.watch import AgentGenerations, Endpoint, View, Watcher

    def view_with(*ids):
        return View(routes={1: tuple(Endpoint(i, 1, f"http://127.0.0.1:{20000 + i}", "gpu-a") for i in ids)})

    w = Watcher()
    w.view = view_with(7, 8)
    w.withdraw([7], "gpu-b")  # not gpu-b's replica
    assert [e.replica_id for e in w.view.routes[1]] == [7, 8]
    w.withdraw([7, 99], "gpu-a")
    assert [e.replica_id for e in w.view.routes[1]] == [8]

    rows = {"ids": (7, 8)}
    monkeypatch.setattr(watch, "_load_view", lambda *a: (view_with(*rows["ids"]), AgentGenerations()))
    asyncio.run(w._refresh())  # the failure not written yet: 7 stays out
    assert [e.replica_id for e in w.view.routes[1]] == [8]
    rows["ids"] = (8,)
    asyncio.run(w._refresh())  # written: the rows keep it out now
    assert [e.replica_id for e in w.view.routes[1]] == [8] and not w._withdrawn
    rows["ids"] = (7, 8)  # ready again later: routed by the rows
    asyncio.run(w._refresh())
    assert [e.replica_id for e in w.view.routes[1]] == [7, 8]

    w.withdraw([8], "gpu-a")
    w.readmit([8])  # the agent says it is ready again before any refresh
    asyncio.run(w._refresh())
    assert [e.replica_id for e in w.view.routes[1]] == [7, 8]


def test_a_refresh_already_reading_when_a_replica_is_withdrawn_does_not_let_it_back_in(monkeypatch):
    """A refresh that began before the agent's report may have read rows from before the
    replica was routed at all; it says nothing about whether the failure was written. Only a
    refresh begun after the withdrawal may release it, so the next refresh of rows the
    report has not reached yet keeps it out (the load-dependent failure of stop 26)."""
    import asyncio
    import threading

    from fleet.live import watch
    from fleet.live.watch import AgentGenerations, Endpoint, View, Watcher

    def view_with(*ids):
        return View(routes={1: tuple(Endpoint(i, 1, f"http://127.0.0.1:{20000 + i}", "gpu-a") for i in ids)})

    w = Watcher()
    w.view = view_with(7, 8)
    reading, go_on = threading.Event(), threading.Event()

    def slow_read_without_7(*args):  # began before 7 was ready: its rows do not route it
        reading.set()
        go_on.wait(5)
        return view_with(8), AgentGenerations()

    async def scenario():
        monkeypatch.setattr(watch, "_load_view", slow_read_without_7)
        in_flight = asyncio.create_task(w._refresh())
        await asyncio.to_thread(reading.wait, 5)
        w.withdraw([7], "gpu-a")  # the agent reports 7 failed while that refresh reads
        go_on.set()
        await in_flight
        assert [e.replica_id for e in w.view.routes[1]] == [8]
        # The next refresh reads rows the failure has not reached yet: 7 still ready there.
        monkeypatch.setattr(watch, "_load_view", lambda *a: (view_with(7, 8), AgentGenerations()))
        await w._refresh()
        assert [e.replica_id for e in w.view.routes[1]] == [8]
        # Written: a refresh begun after the withdrawal no longer routes it, and lets it go.
        monkeypatch.setattr(watch, "_load_view", lambda *a: (view_with(8), AgentGenerations()))
        await w._refresh()
        assert not w._withdrawn

    asyncio.run(scenario())


def test_a_replica_reported_not_ready_before_any_refresh_routed_it_stays_out_but_only_for_its_own_agent(
        monkeypatch):
    """An agent back after the web process restarted says hello with an engine that died
    meanwhile, before this process's first refresh routed it: the refresh from the stale row
    must not route it. Another agent naming that id withdraws nothing."""
    import asyncio

    from fleet.live import watch
    from fleet.live.watch import AgentGenerations, Endpoint, View, Watcher

    w = Watcher()
    w.withdraw([7], "gpu-a")
    w.withdraw([8], "gpu-b")  # replica 8 is gpu-a's
    rows = View(routes={1: (Endpoint(7, 1, "http://127.0.0.1:20007", "gpu-a"),
                            Endpoint(8, 1, "http://127.0.0.1:20008", "gpu-a"))})
    monkeypatch.setattr(watch, "_load_view", lambda *a: (rows, AgentGenerations()))
    asyncio.run(w._refresh())
    assert [e.replica_id for e in w.view.routes[1]] == [8]


def test_a_replica_whose_port_refused_leaves_this_processs_routes_for_a_moment(monkeypatch):
    """A refused connection means nothing listens on the replica's port: out of routing at
    once and across refreshes (the agent's report may be a heartbeat away, and another
    process could take the port meanwhile), back once the moment has passed and the rows
    still say ready."""
    import asyncio

    from fleet.live import watch
    from fleet.live.watch import AgentGenerations, Endpoint, View, Watcher

    rows = View(routes={1: (Endpoint(7, 1, "http://127.0.0.1:20007", "gpu-a"),
                            Endpoint(8, 1, "http://127.0.0.1:20008", "gpu-a"))})
    monkeypatch.setattr(watch, "_load_view", lambda *a: (rows, AgentGenerations()))
    clock = [1000.0]
    w = Watcher()
    w.clock = lambda: clock[0]
    asyncio.run(w._refresh())
    w.quarantine(7, 2.0)
    assert [e.replica_id for e in w.view.routes[1]] == [8]
    clock[0] += 1.5
    asyncio.run(w._refresh())
    assert [e.replica_id for e in w.view.routes[1]] == [8]
    clock[0] += 1.0
    asyncio.run(w._refresh())
    assert [e.replica_id for e in w.view.routes[1]] == [7, 8] and not w._quarantined


@pytest.mark.django_db
def test_just_after_no_one_could_listen_only_agents_connected_here_keep_old_stamps_routable(make_model, settings):
    """After every web process was away (the listening window just began), an agent whose
    last stamp is old is trusted only if it is connected to this process: the rows of one
    no one has heard since may hide engines that died meanwhile."""
    settings.LLMGW_AGENT_ROUTE_GRACE_S = 2.0
    m = make_model("m")
    here, elsewhere = agent("here", seen_s_ago=30), agent("elsewhere", seen_s_ago=30)
    r_here = replica(m, here)
    replica(m, elsewhere)
    ControlPlane.objects.all().delete()
    register_web_process()  # this process's window starts now: nobody listened before
    view, _ = _load_view([here.pk])
    assert [e.replica_id for e in view.routes[m.pk]] == [r_here.pk]
    assert [a.name for a in view.status[m.pk].silent_agents] == ["elsewhere"]


# --- capacity: what the gateway's admission queue admits up to ------------------------------

def _benchmark(model, profile, per_replica: int):
    from catalog.models import Benchmark

    return Benchmark.objects.create(model=model, profile=profile, max_concurrency=per_replica, slo_ttft_p95_ms=500.0)


def _other_profile(like):
    from catalog.models import Profile

    return Profile.objects.create(name="other-cpu", engine=like.engine, command=like.command, gpus_needed=0,
                                  cpu_cores=1, memory_mib=128, readiness_path=like.readiness_path)


def _only_this_web_process(monkeypatch, me=("web-b", 2)):
    """This process is ``me`` (host, pid) among the web control planes."""
    monkeypatch.setattr("fleet.control.planes.this_process", lambda: me)


def test_a_models_capacity_is_the_benchmark_of_each_routed_replica_summed(make_model, monkeypatch):
    from fleet import live
    from fleet.live import watch

    _only_this_web_process(monkeypatch)
    m, unmeasured = make_model("m"), make_model("unmeasured")
    a = agent("a")
    replica(m, a), replica(m, a), replica(unmeasured, a)
    replica(m, a, state="starting")  # not routed: no capacity yet
    replica(m, agent("silent", seen_s_ago=60))  # out of routing: its slots are not counted
    _benchmark(m, m.profile, 4)
    ModelState.objects.create(model=m, observed_per_replica=1)  # a measurement beats what was learned
    view, _ = _load_view([])
    assert view.capacity == {m.pk: (8, 8)} and view.web_slot == (0, 1)
    assert [e.concurrency for e in view.routes[m.pk]] == [4, 4] and view.routes[unmeasured.pk][0].concurrency is None
    monkeypatch.setattr(watch.watcher, "view", view)
    assert live.capacity(m.pk) == (8, 8)
    assert live.capacity(unmeasured.pk) is None  # unknown: the gateway admits without limit


def test_without_a_benchmark_a_replica_counts_what_load_scaling_learned(make_model, monkeypatch):
    _only_this_web_process(monkeypatch)
    m = make_model("m")
    a = agent("a")
    replica(m, a), replica(m, a), replica(m, a)
    ModelState.objects.create(model=m, observed_per_replica=3)
    assert _load_view([])[0].capacity == {m.pk: (9, 9)}


def test_one_routed_replica_of_unknown_concurrency_makes_the_models_capacity_unknown(make_model, monkeypatch):
    """A rolling update has moved one replica to a profile nobody benchmarked, and nothing
    was learned: the sum would undercount, so there is no limit rather than a wrong one."""
    _only_this_web_process(monkeypatch)
    m = make_model("m")
    a = agent("a")
    replica(m, a)
    moved = Replica.objects.create(model=m, profile=_other_profile(m.profile), agent=a, state="ready", port=20002,
                                   cpu_cores=1, memory_mib=128)
    _benchmark(m, m.profile, 4)
    view, _ = _load_view([])
    assert m.pk not in view.capacity
    assert {e.replica_id: e.concurrency for e in view.routes[m.pk]} == {moved.pk - 1: 4, moved.pk: None}
    _benchmark(m, moved.profile, 2)  # measured there too: known again
    assert _load_view([])[0].capacity == {m.pk: (6, 6)}


@pytest.mark.parametrize("processes", [1, 2, 3])
def test_the_live_web_processes_split_a_capacity_and_their_shares_sum_to_it(processes):
    from fleet.live.watch import capacity_share

    for total in range(processes, 40):
        shares = [capacity_share(total, i, processes) for i in range(processes)]
        assert sum(shares) == total and max(shares) - min(shares) <= 1, (total, shares)
    # Fewer slots than processes: each still gets one (over-admits by design), never zero.
    assert [capacity_share(total, i, 3) for total in (0, 1, 2) for i in range(3)] == [1] * 9


def test_a_web_process_takes_its_share_by_its_place_among_the_live_web_processes(make_model, monkeypatch, settings):
    from fleet.control.planes import control_plane_stall_s

    settings.LLMGW_CONTROL_PLANE_HEARTBEAT_S = 2.0
    m = make_model("m")
    a = agent("a")
    replica(m, a), replica(m, a)
    _benchmark(m, m.profile, 4)  # 8 slots
    now = timezone.now()
    old = now - timedelta(seconds=control_plane_stall_s() + 5)
    web = [("web-c", 3), ("web-a", 9), ("web-b", 2)]
    for host, pid in web:
        ControlPlane.objects.create(host=host, role="web", pid=pid, last_seen_at=now)
    ControlPlane.objects.create(host="web-0", role="web", pid=1, last_seen_at=old)  # stalled or gone: no share
    ControlPlane.objects.create(host="web-0", role="worker", pid=5, last_seen_at=now)  # a worker admits nothing
    shares = {}
    for me in web:
        _only_this_web_process(monkeypatch, me)
        view, _ = _load_view([])
        shares[me[0]] = (view.web_slot, view.capacity[m.pk])
    assert shares == {"web-a": ((0, 3), (8, 3)), "web-b": ((1, 3), (8, 3)), "web-c": ((2, 3), (8, 2))}


def test_a_web_process_not_registered_yet_counts_itself_as_one_more(make_model, monkeypatch):
    m = make_model("m")
    replica(m, agent("a"))
    _benchmark(m, m.profile, 5)
    ControlPlane.objects.create(host="web-a", role="web", pid=9, last_seen_at=timezone.now())
    _only_this_web_process(monkeypatch, ("web-0", 4))  # its first refresh comes before its registration
    view, _ = _load_view([])
    assert view.web_slot == (0, 2) and view.capacity == {m.pk: (5, 3)}


def test_capacity_costs_no_query_of_its_own_however_many_replicas_benchmarks_and_processes(make_model,
                                                                                             monkeypatch):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    _only_this_web_process(monkeypatch)
    m = make_model("m")
    a = agent("a")
    replica(m, a)
    with CaptureQueriesContext(connection) as one:
        _load_view([])
    for i in range(5):
        other = make_model(f"m{i}")
        replica(other, a), replica(other, a)
        _benchmark(other, other.profile, 2)
        ModelState.objects.create(model=other, observed_per_replica=1)
        ControlPlane.objects.create(host=f"web-{i}", role="web", pid=i, last_seen_at=timezone.now())
    with CaptureQueriesContext(connection) as many:
        view, _ = _load_view([])
    assert len(many.captured_queries) == len(one.captured_queries)
    assert sum("fleet_controlplane" in q["sql"] for q in many.captured_queries) == 1  # with the listening window
    assert sum("catalog_benchmark" in q["sql"] for q in many.captured_queries) == 1  # in the routes' query
    assert len(view.capacity) == 5 and view.web_slot[1] == 6


def test_a_replica_out_of_this_processs_routes_leaves_its_capacity_at_once():
    """A refused or withdrawn replica takes its slots with it: the share of the replicas
    still routed is what the gateway may have in flight."""
    from fleet.live.watch import Endpoint, View, Watcher, capacities

    routes = {1: (Endpoint(7, 1, "http://127.0.0.1:20007", "gpu-a", concurrency=4),
                  Endpoint(8, 1, "http://127.0.0.1:20008", "gpu-a", concurrency=2))}
    w = Watcher()
    w.view = View(routes=routes, capacity=capacities(routes, (1, 2)), web_slot=(1, 2))
    assert w.view.capacity == {1: (6, 3)}
    w.quarantine(7, 2.0)
    assert w.view.capacity == {1: (2, 1)}
    w.withdraw([8], "gpu-a")
    assert w.view.routes == {} and w.view.capacity == {}


# --- admission queues: their depths reach the database --------------------------------------

@pytest.fixture
def queue_depths():
    """The process's queue depths (``fleet.live.set_queued``), empty before and after."""
    from fleet.live.watch import queued

    queued.depths.clear(), queued.written.clear()
    yield queued
    queued.depths.clear(), queued.written.clear()


def test_a_queue_depth_is_due_when_it_changes_and_again_every_third_of_the_load_staleness(settings):
    from fleet.live.watch import QueueDepths

    settings.LLMGW_LOAD_STALE_S = 15.0
    q = QueueDepths()
    q.set(1, 0)
    assert q.due(100.0) == {}  # never written and empty: no row to write
    q.set(1, 3), q.set(2, 1)
    assert q.due(100.0) == {1: 3, 2: 1}
    q.wrote({1: 3, 2: 1}, 100.0)
    assert q.due(104.0) == {}  # unchanged, and its stamp is fresh enough
    q.set(2, 2)
    assert q.due(104.0) == {2: 2}  # a change goes out at once
    q.wrote({2: 2}, 104.0)
    assert q.due(105.0) == {1: 3}  # unchanged but 5 s old: re-stamped, so it never looks stale
    q.wrote({1: 3}, 105.0)
    q.set(1, 0)
    assert q.due(105.5) == {1: 0}  # emptied: its row goes
    q.wrote({1: 0}, 105.5)
    assert (1 in q.depths, 1 in q.written, q.due(200.0)) == (False, False, {2: 2})


@pytest.mark.django_db(transaction=True)  # the flush writes from a worker thread
def test_a_depth_set_by_the_gateway_lands_in_this_processs_queue_report_at_the_next_flush(make_model, queue_depths):
    import asyncio

    from fleet import live
    from fleet.live.watch import process_id, watcher
    from fleet.models import QueueReport

    m, other = make_model("m"), make_model("other")
    live.set_queued(m.pk, 4)
    live.set_queued(other.pk, 1)
    assert not QueueReport.objects.exists()  # no I/O until the flush
    asyncio.run(watcher.flush_usage(force=True))
    rows = {r.model_id: (r.process, r.waiting) for r in QueueReport.objects.all()}
    assert rows == {m.pk: (process_id(), 4), other.pk: (process_id(), 1)}
    live.set_queued(m.pk, 2)
    live.set_queued(other.pk, 0)
    asyncio.run(watcher.flush_usage(force=True))
    assert list(QueueReport.objects.values_list("model_id", "waiting")) == [(m.pk, 2)]  # the empty one went
    assert queue_depths.depths == {m.pk: 2}


# --- waiting for a refresh: what a held request sleeps on --------------------------------------

def _idle_watcher():
    """A watcher whose loop does nothing (no database), routing replica 5 of model 1."""
    import asyncio

    from fleet.live.watch import Endpoint, View, Watcher

    w = Watcher()
    w._run = lambda: asyncio.sleep(3600)
    w.view = View(routes={1: (Endpoint(5, 1, "http://127.0.0.1:1", "a"),)})
    return w


async def test_a_wait_cancelled_while_a_refresh_wakes_it_is_cancelled_not_woken():
    """Django cancels a held request whose client hung up; a cancel that came while a
    refresh was waking the request (Python 3.11's ``asyncio.wait_for``, CPython gh-86296)
    was dropped: the request stayed held until its replica was ready, never recorded 499."""
    import asyncio

    cancelled = 0
    for steps in range(4):  # the cancel comes 0, 1, 2, 3 loop steps after the wake-up
        w = _idle_watcher()
        waiting = asyncio.create_task(w.wait_for_refresh(60))
        for _ in range(3):
            await asyncio.sleep(0)
        assert not waiting.done()
        w.quarantine(5, 1.0)  # the view changes: every waiter wakes
        for _ in range(steps):
            await asyncio.sleep(0)
        if waiting.cancel():
            with pytest.raises(asyncio.CancelledError):
                await waiting
            cancelled += 1
        else:  # woken before the cancel came
            assert waiting.result() is True
        w._task.cancel()
        await asyncio.gather(w._task, return_exceptions=True)
    assert cancelled >= 1  # the cancel that raced the wake-up was asked at least once


async def test_a_wait_with_no_refresh_ends_false_at_its_timeout():
    import asyncio

    w = _idle_watcher()
    assert await w.wait_for_refresh(0.01) is False
    w._task.cancel()
    await asyncio.gather(w._task, return_exceptions=True)


async def test_the_database_going_away_is_a_warning_and_its_return_an_info_line(caplog, settings):
    """An outage's start is what an operator must see (WARNING); its end is good news (INFO),
    told once with how long it lasted."""
    import asyncio
    import logging

    from fleet.live.watch import Watcher

    settings.LLMGW_WATCH_INTERVAL_S = 0.01
    w = Watcher()
    failures = iter([OperationalError("could not connect to server")] * 2)
    back = asyncio.Event()

    async def flush_heartbeats() -> None:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        if any("database back" in r.getMessage() for r in caplog.records):
            back.set()

    async def nothing(*args, **kwargs) -> None:
        return None

    w.flush_heartbeats = flush_heartbeats
    for step in ("_refresh", "_sweep_tokens", "_push_agents", "flush_usage", "_register"):
        setattr(w, step, nothing)
    with caplog.at_level(logging.INFO, logger="fleet.live.watch"):
        task = asyncio.create_task(w._run())
        try:
            await asyncio.wait_for(back.wait(), 30)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    told = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "fleet.live.watch"]
    away = [(level, m) for level, m in told if m.startswith("database unavailable")]
    returned = [(level, m) for level, m in told if m.startswith("database back after ")]
    assert [level for level, _ in away] == [logging.WARNING]  # once for the outage, not per retry
    assert [level for level, _ in returned] == [logging.INFO]
