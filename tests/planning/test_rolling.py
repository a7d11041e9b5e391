"""R10, rolling replacement of outdated replicas, and the drain of a deleted model's
replicas (docs/architecture.md, "Reconciler rules"): the pure planner, the clock passed in."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from fleet.planning.planner import (
    AgentView, GpuView, ModelView, MoveCause, Place, Policy, ProfileView, ReplicaView, Snapshot, _surplus, plan,
)
from fleet.states import COUNTS_TOWARDS_DESIRED, HOLDS_RESOURCES, ReplicaState as S

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
GPU_40G = ProfileView(id=1, gpus_needed=1, gpu_memory_mib=40960)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def agent(id: int = 1, name: str = "gpu-1", gpus: int = 2) -> AgentView:
    return AgentView(id=id, name=name, gpus=tuple(GpuView(i, 81920) for i in range(gpus)), last_seen_at=ago(1))


def model(id: int = 1, name: str = "m", **kw) -> ModelView:
    kw.setdefault("min_replicas", 1)
    kw.setdefault("max_replicas", 3)
    return ModelView(id=id, name=name, profile=GPU_40G, **kw)


def rep(id, state=S.READY, gpu=0, model_id=1, agent_id=1, **kw) -> ReplicaView:
    kw.setdefault("in_flight", 0)
    kw.setdefault("state_changed_at", ago(5))
    return ReplicaView(id=id, model_id=model_id, agent_id=agent_id, state=state, gpu_indices=(gpu,), **kw)


def snap(agents, models, replicas, **policy) -> Snapshot:
    return Snapshot(Policy(**policy), tuple(agents), tuple(models), tuple(replicas))


def moves(result) -> dict[int, S]:
    return {m.replica_id: m.to for m in result.moves}


# --- One pass at a time ------------------------------------------------------------------------

def test_an_outdated_ready_replica_gets_a_surge_beside_it_when_there_is_room():
    result = plan(snap([agent(gpus=2)], [model()], [rep(1, outdated=True)]), NOW)
    assert [(p.agent_id, p.gpu_indices) for p in result.places] == [(1, (1,))]
    assert result.moves == []
    assert result.models[1].reason == "replacing r1: surge starting on gpu-1 GPU 1"
    # The row's reason stays true once the roll is over (the model's says what is going on).
    assert result.places[0].reason == "placed to replace r1 (a surge)"


def test_while_the_surge_starts_the_outdated_replica_keeps_serving_and_nothing_else_moves():
    result = plan(snap([agent(gpus=3)], [model()], [rep(1, outdated=True), rep(2, S.STARTING, gpu=1)]), NOW)
    assert result.actions == []
    assert result.models[1].reason == "replacing r1: surge r2 starting"


def test_the_outdated_replica_drains_once_its_surge_is_ready():
    result = plan(snap([agent()], [model()], [rep(1, outdated=True), rep(2, gpu=1)]), NOW)
    assert moves(result) == {1: S.DRAINING}
    assert result.moves[0].cause == MoveCause.OUTDATED
    assert result.places == []


def test_without_room_for_a_surge_one_outdated_replica_is_replaced_in_place():
    result = plan(snap([agent(gpus=1)], [model()], [rep(1, outdated=True)]), NOW)
    assert moves(result) == {1: S.DRAINING}
    assert result.places == []
    assert result.models[1].reason == "replacing r1 in place: no room for a surge"
    assert result.moves[0].reason == "replacing r1 in place: no room for a surge"


def test_an_in_place_replacement_waits_for_the_outdated_engine_to_stop_before_placing():
    result = plan(snap([agent(gpus=1)], [model()], [rep(1, S.STOPPING, outdated=True)]), NOW)
    assert result.actions == []
    assert result.models[1].reason.startswith("replacing r1 in place: waiting for 1 replica on gpu-1 to stop")
    assert not result.models[1].unservable


def test_a_drained_outdated_replica_is_not_taken_back_when_its_model_is_short():
    result = plan(snap([agent(gpus=1)], [model()], [rep(1, S.DRAINING, outdated=True, in_flight=2)]), NOW)
    assert S.READY not in moves(result).values()


def test_only_one_replacement_is_in_flight_per_model():
    replicas = [rep(1, outdated=True, gpu=0), rep(2, outdated=True, gpu=1), rep(3, outdated=True, gpu=2)]
    result = plan(snap([agent(gpus=6)], [model(min_replicas=3)], replicas), NOW)
    assert len(result.places) == 1
    assert result.moves == []


def test_outdated_replicas_not_yet_ready_are_simply_stopped_and_replaced():
    result = plan(snap([agent(gpus=2)], [model()], [rep(1, S.STARTING, outdated=True)]), NOW)
    assert moves(result) == {1: S.STOPPING}
    assert [p.gpu_indices for p in result.places] == [(1,)]  # r1 still holds GPU 0 until it is stopped


def test_current_replicas_are_left_alone():
    result = plan(snap([agent()], [model()], [rep(1)]), NOW)
    assert result.actions == []
    assert result.models[1].reason == "1 wanted, all placed"


def test_scaling_down_takes_outdated_replicas_first():
    fresh, old = rep(1, in_flight=0), rep(2, in_flight=7, outdated=True)
    assert _surplus([fresh, old], 1) == [old]
    # Desired fell to 1 with two current and one outdated ready: the outdated one goes, then the newest current.
    result = plan(snap([agent(gpus=3)], [model()], [rep(1, gpu=0), rep(2, gpu=1), rep(3, gpu=2, outdated=True)]), NOW)
    assert moves(result) == {3: S.DRAINING, 2: S.DRAINING}


def test_a_stopped_cluster_stops_outdated_replicas_like_any_other():
    result = plan(snap([agent()], [model()], [rep(1, outdated=True)], stopped=True), NOW)
    assert moves(result) == {1: S.DRAINING}
    assert result.places == []


def test_a_crash_looping_new_spec_leaves_the_outdated_replicas_serving():
    m = model(failures=(ago(1),), last_error="bad flag --foo")
    result = plan(snap([agent(gpus=2)], [m], [rep(1, outdated=True)], backoff_base_s=30), NOW)
    assert result.actions == []
    assert result.models[1].reason.startswith("crash loop: 1 failure(s) in a row, next try in")
    assert result.models[1].reason.endswith("1 outdated still serving")


def test_after_the_backoff_the_surge_is_tried_again_beside_the_outdated_replica():
    m = model(failures=(ago(100),))
    result = plan(snap([agent(gpus=2)], [m], [rep(1, outdated=True)], backoff_base_s=30), NOW)
    assert len(result.places) == 1 and result.moves == []


def test_no_outdated_replica_is_drained_in_place_while_the_new_spec_keeps_failing():
    m = model(failures=(ago(100),), last_error="exited 2")
    result = plan(snap([agent(gpus=1)], [m], [rep(1, outdated=True)], backoff_base_s=30), NOW)
    assert result.actions == []
    assert "still serving: no room for a surge, and the current spec failed 1 time(s) lately" in result.models[1].reason


# --- Whole rolls, pass after pass ---------------------------------------------------------------

def run_until_settled(snapshot: Snapshot, passes: int = 30, check=lambda replicas: None) -> list[ReplicaView]:
    """Plan, apply and let a fake agent move each engine one step per pass (placing →
    starting → ready; stopping → gone); every drain ends at the next pass (nothing in
    flight). ``check`` sees the replicas after every pass."""
    replicas = {r.id: r for r in snapshot.replicas}
    next_id = max(replicas, default=0) + 1
    for _ in range(passes):
        result = plan(replace(snapshot, replicas=tuple(replicas.values())), NOW)
        for action in result.actions:
            if isinstance(action, Place):
                replicas[next_id] = rep(next_id, S.PLACING, gpu=action.gpu_indices[0], model_id=action.model_id,
                                        agent_id=action.agent_id)
                next_id += 1
            else:
                replicas[action.replica_id] = replace(replicas[action.replica_id], state=action.to)
        check(list(replicas.values()))
        for rid, r in list(replicas.items()):
            if r.state == S.STOPPING:
                del replicas[rid]
            elif r.state == S.PLACING:
                replicas[rid] = replace(r, state=S.STARTING)
            elif r.state == S.STARTING:
                replicas[rid] = replace(r, state=S.READY)
        gpus_held = [(r.agent_id, g) for r in replicas.values() if r.state in HOLDS_RESOURCES for g in r.gpu_indices]
        assert len(gpus_held) == len(set(gpus_held)), "a GPU given twice"
    return list(replicas.values())


def test_a_surge_roll_replaces_every_outdated_replica_without_going_below_min_ready():
    start = snap([agent(gpus=3)], [model(min_replicas=2)], [rep(1, gpu=0, outdated=True), rep(2, gpu=1, outdated=True)])

    def never_below_two_ready(replicas):
        assert sum(1 for r in replicas if r.state == S.READY) >= 2

    final = run_until_settled(start, check=never_below_two_ready)
    running = [r for r in final if r.state in COUNTS_TOWARDS_DESIRED]
    assert len(running) == 2 and all(r.state == S.READY and not r.outdated for r in running)
    assert {r.id for r in running}.isdisjoint({1, 2})


def test_an_in_place_roll_replaces_one_at_a_time_and_converges():
    start = snap([agent(gpus=2)], [model(min_replicas=2)], [rep(1, gpu=0, outdated=True), rep(2, gpu=1, outdated=True)])

    def at_most_one_missing(replicas):
        assert sum(1 for r in replicas if r.state == S.READY) >= 1

    final = run_until_settled(start, check=at_most_one_missing)
    running = [r for r in final if r.state in COUNTS_TOWARDS_DESIRED]
    assert len(running) == 2 and all(r.state == S.READY and not r.outdated for r in running)


# --- Deleted models -----------------------------------------------------------------------------

def test_replicas_of_a_deleted_model_drain_if_ready_and_stop_otherwise():
    replicas = [rep(1, model_id=None, gpu=0), rep(2, S.STARTING, model_id=None, gpu=1),
                rep(3, S.LOST, model_id=None, gpu=2), rep(4, S.STOPPING, model_id=None, gpu=3)]
    result = plan(snap([agent(gpus=4)], [], replicas), NOW)
    assert moves(result) == {1: S.DRAINING, 2: S.STOPPING, 3: S.STOPPING}
    assert {m.cause for m in result.moves} == {MoveCause.MODEL_DELETED}
    assert result.moves[0].reason == "draining: its model was deleted"


def test_a_deleted_models_draining_replica_stops_through_r8():
    result = plan(snap([agent()], [], [rep(1, S.DRAINING, model_id=None, in_flight=0)]), NOW)
    assert moves(result) == {1: S.STOPPING}
    assert result.moves[0].cause == MoveCause.DRAINED


def test_a_deleted_models_gpus_are_not_given_away_until_its_engines_are_reported_stopped():
    for state in (S.READY, S.DRAINING, S.STOPPING):
        old = rep(1, state, model_id=None, gpu=0, in_flight=3)
        result = plan(snap([agent(gpus=1)], [model(id=2, name="new")], [old]), NOW)
        assert result.places == [], state
        assert result.models[2].reason.startswith("waiting for 1 replica on gpu-1 to stop"), state
    # Reported stopped (no longer in the snapshot): the GPU is free.
    result = plan(snap([agent(gpus=1)], [model(id=2, name="new")], []), NOW)
    assert [p.gpu_indices for p in result.places] == [(0,)]


def test_a_model_wanted_higher_during_a_roll_gets_its_missing_replicas_at_once():
    replicas = [rep(1, outdated=True, gpu=0), rep(2, gpu=1), rep(3, S.STARTING, gpu=2)]
    result = plan(snap([agent(gpus=5)], [model(min_replicas=4, max_replicas=4)], replicas), NOW)
    assert len(result.places) == 1 and result.moves == []
    assert result.models[1].reason.startswith("replacing r1: placed on gpu-1")
