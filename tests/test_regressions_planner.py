"""Breaker: planner-level findings (pure, no DB)."""
from tests.test_planner import NOW, ago, gpu_agent, model, rep, snap
from fleet.planning.planner import MoveCause, plan
from fleet.states import ReplicaState as S


def test_idle_scale_down_in_the_same_pass_already_frees_room_so_no_wanted_replica_is_evicted():
    """qwen is past its idle timeout and is drained this pass (its GPU is on its way back);
    the planner nevertheless also evicts mistral, which is still wanted."""
    agents = [gpu_agent(1, "a", gpus=1), gpu_agent(2, "b", gpus=1)]
    models = [model(10, "qwen", on_demand=True, wanted_at=ago(900)),      # idle > 600 s default
              model(11, "mistral", on_demand=True, wanted_at=ago(300))]   # still wanted
    wanted = model(1, "llama", on_demand=True, wanted_at=ago(0))
    replicas = [rep(100, 10, 1, S.READY, gpus=(0,), last_used_at=ago(900), in_flight=0),
                rep(101, 11, 2, S.READY, gpus=(0,), last_used_at=ago(300), in_flight=0)]
    result = plan(snap(agents, models + [wanted], replicas, min_idle_before_eviction_s=60), NOW)
    evicted = [(m.replica_id, m.reason) for m in result.moves if "evicted" in m.reason]
    assert evicted == [], f"evicted a wanted replica although room is already being freed: {evicted}"
    # Only qwen drains, for its idleness; llama waits for its GPU.
    assert [(m.replica_id, m.to, m.cause) for m in result.moves] == [(100, S.DRAINING, MoveCause.IDLE)]
    assert result.places == [] and not result.models[1].unservable
    assert result.models[1].reason == "waiting for 1 replica on a to stop, then placing llama"


def test_second_pass_while_the_victim_drains_neither_evicts_more_nor_reports_unservable():
    agents = [gpu_agent(1, "a", gpus=1), gpu_agent(2, "b", gpus=1)]
    models = [model(10, "qwen", on_demand=True, wanted_at=ago(500)),
              model(11, "mistral", on_demand=True, wanted_at=ago(300))]
    wanted = model(1, "llama", on_demand=True, wanted_at=ago(0))
    replicas = [rep(100, 10, 1, S.READY, gpus=(0,), last_used_at=ago(500), in_flight=0),
                rep(101, 11, 2, S.READY, gpus=(0,), last_used_at=ago(300), in_flight=0)]
    first = plan(snap(agents, models + [wanted], replicas, min_idle_before_eviction_s=60), NOW)
    assert [(m.replica_id, m.to) for m in first.moves] == [(100, S.DRAINING)]
    # The next pass, a tick later: the victim still drains and holds its GPU; qwen's demand
    # was forgotten by the first pass.
    models2 = [model(10, "qwen", on_demand=True, wanted_at=None), models[1]]
    replicas2 = [rep(100, 10, 1, S.DRAINING, gpus=(0,), last_used_at=ago(500), in_flight=None,
                     state_changed_at=ago(1)), replicas[1]]
    second = plan(snap(agents, models2 + [wanted], replicas2, min_idle_before_eviction_s=60), NOW)
    evicted = [m.replica_id for m in second.moves if "evicted" in m.reason]
    assert evicted == [], f"second pass evicted more than needed: {second.moves}"
    assert second.actions == []  # the victim drains on; nothing else moves, nothing is placed
    assert not second.models[1].unservable, second.models[1].reason
    assert second.models[1].reason == "waiting for 1 replica on a to stop, then placing llama"


def test_pass_while_the_victim_is_stopping_does_not_tell_held_clients_it_is_unservable():
    agents = [gpu_agent(1, "a", gpus=1)]
    models = [model(10, "qwen", on_demand=True, wanted_at=None)]
    wanted = model(1, "llama", on_demand=True, wanted_at=ago(0))
    replicas = [rep(100, 10, 1, S.STOPPING, gpus=(0,), last_used_at=ago(900), in_flight=0,
                    state_changed_at=ago(1))]
    result = plan(snap(agents, models + [wanted], replicas), NOW)
    assert not result.models[1].unservable, result.models[1].reason
    assert result.actions == [] and result.models[1].reason == "waiting for 1 replica on a to stop, then placing llama"
