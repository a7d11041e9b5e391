"""The pure planner through faults: agents that go silent and come back (duplicates), a
control plane that itself stalled, crash loops. No database; ``now`` is passed in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleet.planning.planner import (
    AgentView,
    GpuView,
    ModelView,
    Policy,
    ProfileView,
    ReplicaView,
    Snapshot,
    plan,
)
from fleet.states import ReplicaState as S

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
GPU = ProfileView(id=1, gpus_needed=1, gpu_memory_mib=40960)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def agent(id: int, name: str, gpus: int = 1, **kw) -> AgentView:
    kw.setdefault("last_seen_at", ago(1))
    return AgentView(id=id, name=name, gpus=tuple(GpuView(i, 81920) for i in range(gpus)), **kw)


def model(id: int = 1, name: str = "m", **kw) -> ModelView:
    kw.setdefault("min_replicas", 1)
    kw.setdefault("max_replicas", max(1, kw["min_replicas"]))
    return ModelView(id=id, name=name, profile=GPU, **kw)


def rep(id: int, agent_id: int, state: S = S.READY, model_id: int = 1, **kw) -> ReplicaView:
    return ReplicaView(id=id, model_id=model_id, agent_id=agent_id, state=state, gpu_indices=(0,), **kw)


def run(agents, models, replicas, now: datetime = NOW, **policy):
    policy.setdefault("agent_lost_after_s", 20)
    return plan(Snapshot(Policy(**policy), tuple(agents), tuple(models), tuple(replicas)), now)


def moves(result) -> list[tuple[int, S]]:
    return sorted((m.replica_id, m.to) for m in result.moves)


# --- an agent comes back -------------------------------------------------------------------

def test_a_returning_replica_is_stopped_when_its_successor_is_ready():
    result = run([agent(1, "a"), agent(2, "b")], [model()],
                 [rep(1, 1, S.LOST, back=True, state_changed_at=ago(60)), rep(2, 2, S.READY)])
    assert moves(result) == [(1, S.STOPPING)]
    assert "duplicate: agent a came back, 1 ready elsewhere" in result.moves[0].reason
    assert result.places == []


def test_a_returning_ready_replica_is_kept_while_its_successor_is_not_ready_yet():
    result = run([agent(1, "a"), agent(2, "b")], [model()],
                 [rep(1, 1, S.LOST, back=True), rep(2, 2, S.STARTING)])
    assert moves(result) == [(1, S.READY), (2, S.STOPPING)]
    assert result.places == []
    assert result.models[1].ready == 1 and result.models[1].active == 1


def test_a_returning_replica_with_no_successor_is_taken_back():
    result = run([agent(1, "a")], [model()], [rep(1, 1, S.LOST, back=True)])
    assert moves(result) == [(1, S.READY)]
    assert "agent a came back with the engine ready" in result.moves[0].reason


def test_a_returning_engine_not_ready_is_stopped_when_others_are_ready():
    result = run([agent(1, "a"), agent(2, "b")], [model()], [rep(1, 1, S.LOST, back=False), rep(2, 2, S.READY)])
    assert moves(result) == [(1, S.STOPPING)]


def test_a_returning_engine_not_ready_waits_for_its_report_while_others_are_not_ready_either():
    result = run([agent(1, "a"), agent(2, "b")], [model()], [rep(1, 1, S.LOST, back=False), rep(2, 2, S.PLACING)])
    assert result.actions == []


def test_returning_replicas_of_a_model_no_longer_wanted_stop():
    result = run([agent(1, "a")], [model()], [rep(1, 1, S.LOST, back=True)], stopped=True)
    assert moves(result) == [(1, S.STOPPING)]


def test_of_two_returning_replicas_only_the_missing_one_is_taken_back():
    agents = [agent(1, "a", gpus=2), agent(2, "b")]
    replicas = [rep(1, 1, S.LOST, back=True), rep(3, 1, S.LOST, back=True), rep(2, 2, S.READY)]
    result = run(agents, [model(min_replicas=2)], replicas)
    assert moves(result) == [(1, S.READY), (3, S.STOPPING)]


def test_a_lost_replica_of_an_agent_still_silent_is_left_alone():
    result = run([agent(1, "a", last_seen_at=ago(100)), agent(2, "b")], [model()],
                 [rep(1, 1, S.LOST, back=True), rep(2, 2, S.READY)])
    assert result.actions == []


def test_a_returning_engine_keeps_its_gpu_until_it_has_stopped():
    other = ModelView(id=2, name="other", profile=GPU, min_replicas=1, max_replicas=1)
    result = run([agent(1, "a")], [model(), other], [rep(1, 1, S.LOST, back=False)])
    assert result.places == []  # GPU 0 of agent a is still taken by the returning engine
    assert "no agent has 1 free GPU" in result.models[2].reason


# --- an agent goes silent ------------------------------------------------------------------

def test_an_agent_silent_for_longer_than_the_grace_is_replaced_on_another():
    result = run([agent(1, "a", last_seen_at=ago(30)), agent(2, "b")], [model()], [rep(1, 1)])
    assert moves(result) == [(1, S.LOST)]
    assert "agent a silent for 30 s" in result.moves[0].reason
    assert [(p.model_id, p.agent_id) for p in result.places] == [(1, 2)]


def test_only_replicas_meant_to_run_are_lost_with_their_agent():
    replicas = [rep(1, 1, S.READY), rep(2, 1, S.DRAINING, model_id=2), rep(3, 1, S.STOPPING, model_id=3)]
    models = [model(1, "m"), model(2, "n", min_replicas=0), model(3, "o", min_replicas=0)]
    result = run([agent(1, "a", gpus=3, last_seen_at=ago(30)), agent(2, "b")], models, replicas)
    # A lost replica may run again if its agent returns; one on its way out never should.
    assert moves(result) == [(1, S.LOST), (2, S.STOPPING)]


def test_a_blip_shorter_than_the_grace_moves_nothing():
    result = run([agent(1, "a", last_seen_at=ago(19), connected=False), agent(2, "b")], [model()], [rep(1, 1)])
    assert result.actions == []


def test_silence_while_the_control_plane_could_not_listen_does_not_count():
    # The agent's last stamp is 100 s old, but the control plane only listens again since
    # 10 s (its database was away): 10 s of silence, under the grace.
    result = run([agent(1, "a", last_seen_at=ago(100)), agent(2, "b", last_seen_at=ago(100))], [model()],
                 [rep(1, 1)], listening_since=ago(10))
    assert result.actions == []


def test_silence_counts_again_once_the_control_plane_listened_for_the_grace():
    result = run([agent(1, "a", last_seen_at=ago(100)), agent(2, "b")], [model()], [rep(1, 1)],
                 listening_since=ago(25))
    assert moves(result) == [(1, S.LOST)]
    assert "silent for 25 s" in result.moves[0].reason


def test_a_control_plane_that_listened_all_along_changes_nothing():
    result = run([agent(1, "a", last_seen_at=ago(30)), agent(2, "b")], [model()], [rep(1, 1)],
                 listening_since=ago(3600))
    assert moves(result) == [(1, S.LOST)]


def test_a_heartbeat_storm_reschedules_nothing():
    agents = [agent(i, f"a{i}", last_seen_at=ago(60)) for i in range(1, 7)] + [agent(7, "a7")]
    models = [model(i, f"m{i}") for i in range(1, 8)]
    replicas = [rep(i, i, model_id=i) for i in range(1, 8)]
    result = run(agents, models, replicas)
    assert result.actions == []
    assert "6 of 7 agents went silent at once" in result.notes[0]


# --- crash loops ---------------------------------------------------------------------------

def test_a_crash_loop_shows_as_such_with_the_last_error_and_waits_longer_each_time():
    m = model(failures=(ago(5), ago(3), ago(2)), last_error="RuntimeError: CUDA out of memory")
    result = run([agent(1, "a")], [m], [], backoff_base_s=1, backoff_cap_s=60)
    reason = result.models[1].reason
    assert result.places == [] and reason.startswith("crash loop: 3 failure(s) in a row, next try in 2 s")
    assert reason.endswith("last error: RuntimeError: CUDA out of memory")
    # After the third failure it waits 4 s (1 · 2²); after the second it waited 2 s.
    assert run([agent(1, "a")], [m], [], now=NOW + timedelta(seconds=1.9), backoff_base_s=1).places == []
    assert len(run([agent(1, "a")], [m], [], now=NOW + timedelta(seconds=2.1), backoff_base_s=1).places) == 1
    second = model(failures=(ago(5), ago(3)))
    assert len(run([agent(1, "a")], [second], [], now=NOW - timedelta(seconds=0.9), backoff_base_s=1).places) == 1


def test_the_backoff_is_capped():
    m = model(failures=tuple(ago(100 + i) for i in range(8, 0, -1)))
    assert len(run([agent(1, "a")], [m], [], backoff_base_s=1, backoff_cap_s=10, now=NOW - timedelta(seconds=90)).places) == 1


def test_an_attempt_between_failures_is_still_shown_as_a_crash_loop():
    m = model(failures=(ago(30), ago(20)), last_error="engine exited with code 1")
    result = run([agent(1, "a")], [m], [rep(5, 1, S.STARTING)], backoff_base_s=1)
    assert result.models[1].reason == ("crash loop: 2 failure(s) in a row, trying again (1 wanted, all placed); "
                                       "last error: engine exited with code 1")
    placing = run([agent(1, "a")], [m], [], backoff_base_s=1)
    assert placing.models[1].reason.startswith("crash loop: 2 failure(s) in a row, trying again (placed on a GPU 0")
