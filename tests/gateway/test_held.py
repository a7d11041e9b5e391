"""What a request for a model with no route is told (``gateway.held.verdict``), from the
watcher's view alone: agent silence, crash loops, failed starts, new fixed models."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from fleet.live import Failures, ModelStatus, SilentAgent, View
from gateway.held import hold_start, verdict

NOW = datetime(2026, 12, 1, 15, 0, 0, tzinfo=timezone.utc)


def seconds(s: float) -> datetime:
    return NOW + timedelta(seconds=s)


def error_of(response) -> dict:
    return json.loads(response.content)["error"]


def view(**kw) -> View:
    return View(started_at=10.0, version=3, agent_lost_after_s=20.0, **kw)


def crash_loop(count: int = 3, failed_s: float = -2, retry_s: float = 18) -> Failures:
    return Failures(count, seconds(failed_s), "RuntimeError: CUDA out of memory", seconds(retry_s))


def test_an_agent_silent_past_the_grace_is_named_with_when_its_replicas_move():
    status = ModelStatus(looked_at=True, desired=1, silent_agents=(SilentAgent("gpu-node-2", seconds(-14)),))
    answer = verdict("m", False, status, view(), NOW)
    assert answer.status_code == 503 and answer["Retry-After"] == "6"
    error = error_of(answer)
    assert error["code"] == "agent_silent"
    assert error["message"] == ("No ready replica for 'm': agent gpu-node-2 silent for 14 s; its replicas are "
                                "re-placed in 6 s if it stays silent.")


def test_an_agent_silent_past_lost_after_says_its_replicas_move_at_the_next_pass():
    status = ModelStatus(silent_agents=(SilentAgent("a", seconds(-25)),))
    answer = verdict("m", True, status, view(), NOW)
    assert "re-placed as soon as a pass declares it lost" in error_of(answer)["message"]
    assert int(answer["Retry-After"]) >= 1


def test_a_silent_agent_with_a_replacement_coming_up_holds_the_request():
    status = ModelStatus(looked_at=True, desired=1, coming_up=1, silent_agents=(SilentAgent("a", seconds(-14)),))
    assert verdict("m", False, status, view(), NOW) is None


def test_a_crash_loop_is_answered_at_once_with_the_error_line_and_the_next_try():
    answer = verdict("m", True, ModelStatus(failures=crash_loop()), view(), NOW)
    assert answer.status_code == 503 and answer["Retry-After"] == "18"
    error = error_of(answer)
    assert error["code"] == "crash_loop"
    assert "crash loop: 3 failure(s) in a row" in error["message"]
    assert "last error: RuntimeError: CUDA out of memory" in error["message"]
    assert "next try in 18 s (at 15:00:18 UTC)" in error["message"]


def test_failures_whose_backoff_is_over_hold_the_request_for_the_next_try():
    assert verdict("m", True, ModelStatus(failures=crash_loop(retry_s=-1)), view(), NOW) is None
    # ... and so does an attempt already coming up.
    assert verdict("m", True, ModelStatus(coming_up=1, failures=crash_loop()), view(), NOW) is None


def test_a_failure_after_the_request_began_holding_ends_it_with_the_error_line():
    before = ModelStatus(coming_up=1, failures=crash_loop(count=1, failed_s=-60, retry_s=-55))
    held = hold_start(before, trust_after=5.0)
    assert verdict("m", True, before, view(), NOW, held) is None  # the old failure is not news
    failed = ModelStatus(failures=Failures(2, seconds(-0.1), "engine exited with code 1", seconds(9.9)))
    answer = verdict("m", True, failed, view(), NOW, held)
    assert answer.status_code == 503 and answer["Retry-After"] == "10"
    error = error_of(answer)
    assert error["code"] == "replica_start_failed"
    assert error["message"].startswith("The replica starting for 'm' failed: engine exited with code 1")
    assert "crash loop: 2 failure(s) in a row" in error["message"]
    # A first failure while held counts too.
    first = hold_start(ModelStatus(coming_up=1), trust_after=5.0)
    assert error_of(verdict("m", False, failed, view(), NOW, first))["code"] == "replica_start_failed"


def test_a_failure_with_another_replica_still_coming_keeps_the_request_held():
    held = hold_start(ModelStatus(coming_up=2), trust_after=5.0)
    status = ModelStatus(coming_up=1, failures=crash_loop(count=1, failed_s=-0.1))
    assert verdict("m", False, status, view(), NOW, held) is None


def test_an_on_demand_verdict_counts_only_from_a_refresh_after_the_want():
    status = ModelStatus(unservable=True, reason="no agent has 1 free GPU", looked_at=True)
    assert verdict("m", True, status, view(), NOW) is None  # before the want: the want starts afresh
    assert verdict("m", True, status, view(), NOW, hold_start(status, trust_after=11.0)) is None
    answer = verdict("m", True, status, view(), NOW, hold_start(status, trust_after=9.0))
    assert error_of(answer)["code"] == "model_unavailable" and "no agent has 1 free GPU" in error_of(answer)["message"]


def test_a_new_fixed_model_is_held_until_a_pass_says_it_cannot_be_served():
    assert verdict("m", False, ModelStatus(), view(), NOW) is None  # not looked at by a pass yet
    assert verdict("m", False, ModelStatus(looked_at=True, desired=1), view(), NOW) is None  # about to be placed
    assert verdict("m", False, ModelStatus(looked_at=True, desired=1, coming_up=1), view(), NOW) is None
    answer = verdict("m", False, ModelStatus(looked_at=True, desired=1, unservable=True, reason="no room"), view(), NOW)
    assert error_of(answer)["code"] == "model_unavailable" and "no room" in error_of(answer)["message"]
    # A fixed model the planner wants none of now (a schedule window at 0): no hold.
    answer = verdict("m", False, ModelStatus(looked_at=True, desired=0), view(), NOW)
    assert error_of(answer)["code"] == "model_unavailable"


def test_a_stopped_cluster_ends_a_hold():
    assert error_of(verdict("m", True, ModelStatus(coming_up=1), view(stopped=True), NOW))["code"] == "system_stopped"


def test_a_burst_of_held_requests_wants_the_model_once_and_a_client_gone_leaves_it_to_the_others(monkeypatch):
    import asyncio
    import threading

    from gateway import proxy

    calls, release = [], threading.Event()

    def want(model_id: int) -> None:
        calls.append(model_id)
        release.wait(10)

    monkeypatch.setattr(proxy.live, "want_model", want)

    async def burst():
        waiters = [asyncio.create_task(proxy._want(7)) for _ in range(20)]
        await asyncio.sleep(0.2)
        waiters[0].cancel()  # its client hung up: the want goes on for the other 19
        await asyncio.sleep(0.05)
        release.set()
        return await asyncio.gather(*waiters, return_exceptions=True)

    results = asyncio.run(burst())
    assert calls == [7]
    assert isinstance(results[0], asyncio.CancelledError) and results[1:] == [None] * 19
    assert proxy._wants == {}
