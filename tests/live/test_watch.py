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
