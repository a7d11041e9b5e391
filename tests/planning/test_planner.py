"""The pure planner: placement, surplus, reasons, on-demand demand, eviction, lost agents.
No database; the clock is the ``now`` each test passes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from fleet.planning.planner import (
    AgentView, GpuView, ModelView, Move, MoveCause, Place, Policy, ProfileView, ReplicaView, Snapshot,
    desired_replicas, plan,
)
from fleet.states import ReplicaState as S

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
GPU_40G = ProfileView(id=1, gpus_needed=1, gpu_memory_mib=40960)
GPU_2X40G = ProfileView(id=2, gpus_needed=2, gpu_memory_mib=40960)
CPU = ProfileView(id=3, cpu_cores=1, memory_mib=1024)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def gpu_agent(id: int, name: str, gpus: int = 2, mem: int = 81920, **kw) -> AgentView:
    kw.setdefault("last_seen_at", ago(1))
    return AgentView(id=id, name=name, gpus=tuple(GpuView(i, mem) for i in range(gpus)), **kw)


def cpu_agent(id: int, name: str, cores: int = 2, mem: int = 4096, **kw) -> AgentView:
    kw.setdefault("last_seen_at", ago(1))
    return AgentView(id=id, name=name, cpu_cores=cores, memory_mib=mem, **kw)


def model(id: int, name: str, profile=GPU_40G, **kw) -> ModelView:
    return ModelView(id=id, name=name, profile=profile, **kw)


def snap(agents=(), models=(), replicas=(), **policy) -> Snapshot:
    return Snapshot(Policy(**policy), tuple(agents), tuple(models), tuple(replicas))


def rep(id, model_id, agent_id, state=S.READY, gpus=(0,), **kw) -> ReplicaView:
    return ReplicaView(id=id, model_id=model_id, agent_id=agent_id, state=state, gpu_indices=tuple(gpus), **kw)


# --- desired -------------------------------------------------------------------------------

def test_desired_is_the_models_min_for_an_ordinary_model():
    assert desired_replicas(model(1, "m", min_replicas=2, max_replicas=3), Policy(), NOW) == 2


def test_desired_is_zero_when_the_cluster_is_stopped_whatever_the_catalog_says():
    m = model(1, "m", min_replicas=2, max_replicas=3, window_min=3)
    assert desired_replicas(m, Policy(stopped=True), NOW) == 0


def test_desired_is_zero_for_an_external_model():
    assert desired_replicas(model(1, "m", profile=None, external=True, min_replicas=1), Policy(), NOW) == 0


def test_on_demand_model_wants_one_replica_while_wanted_within_its_idle_timeout():
    m = model(1, "m", on_demand=True, idle_timeout_s=60, wanted_at=ago(59))
    assert desired_replicas(m, Policy(), NOW) == 1
    assert desired_replicas(model(1, "m", on_demand=True, idle_timeout_s=60, wanted_at=ago(61)), Policy(), NOW) == 0


def test_on_demand_model_never_wanted_wants_nothing():
    assert desired_replicas(model(1, "m", on_demand=True), Policy(), NOW) == 0


def test_on_demand_model_falls_back_to_the_cluster_idle_timeout():
    m = model(1, "m", on_demand=True, wanted_at=ago(100))
    assert desired_replicas(m, Policy(default_idle_timeout_s=120), NOW) == 1
    assert desired_replicas(m, Policy(default_idle_timeout_s=90), NOW) == 0


def test_a_schedule_window_min_keeps_an_on_demand_model_running_however_quiet():
    m = model(1, "m", on_demand=True, window_min=1, wanted_at=None)
    assert desired_replicas(m, Policy(), NOW) == 1


def test_load_extra_is_capped_at_max():
    m = model(1, "m", min_replicas=1, max_replicas=3, extra_replicas=5)
    assert desired_replicas(m, Policy(), NOW) == 3


# --- placement -----------------------------------------------------------------------------

def test_places_min_replicas_spread_across_agents():
    result = plan(snap([gpu_agent(1, "a"), gpu_agent(2, "b")], [model(1, "m", min_replicas=2, max_replicas=2)]), NOW)
    places = result.places
    assert len(places) == 2
    assert {p.agent_id for p in places} == {1, 2}
    assert result.models[1].desired == 2 and not result.models[1].unservable


def test_packs_onto_the_fullest_agent_when_spreading_does_not_matter():
    agents = [gpu_agent(1, "a", gpus=4), gpu_agent(2, "b", gpus=4)]
    replicas = [rep(10, 2, 2, gpus=(0,))]
    result = plan(snap(agents, [model(1, "m", min_replicas=1), model(2, "other", min_replicas=1)], replicas), NOW)
    assert [p.agent_id for p in result.places] == [2]


def test_a_placed_replica_holds_the_gpus_it_was_given():
    result = plan(snap([gpu_agent(1, "a", gpus=2)], [model(1, "m", min_replicas=2, max_replicas=2)]), NOW)
    assert sorted(p.gpu_indices for p in result.places) == [(0,), (1,)]


def test_tensor_parallel_profile_takes_two_gpus_on_one_agent():
    result = plan(snap([gpu_agent(1, "a", gpus=1), gpu_agent(2, "b", gpus=2)], [model(1, "big", profile=GPU_2X40G, min_replicas=1)]), NOW)
    assert result.places == [Place(1, 2, (0, 1), 0.0, 0, result.places[0].reason)]


def test_nothing_fits_records_why_per_agent():
    agents = [gpu_agent(1, "gpu-1", gpus=1), cpu_agent(2, "cpu-1")]
    result = plan(snap(agents, [model(1, "big", profile=GPU_2X40G, min_replicas=1)]), NOW)
    outcome = result.models[1]
    assert result.places == []
    assert outcome.unservable
    assert "no agent has 2 free GPUs of 40 GiB" in outcome.reason
    assert "gpu-1: 1 free" in outcome.reason
    assert "cpu-1: no GPUs" in outcome.reason


def test_gpus_too_small_are_explained():
    result = plan(snap([gpu_agent(1, "g", gpus=2, mem=24576)], [model(1, "m", min_replicas=1)]), NOW)
    assert "largest 24576 MiB" in result.models[1].reason


def test_no_agents_at_all_is_explained():
    result = plan(snap([], [model(1, "m", min_replicas=1)]), NOW)
    assert result.models[1].unservable and "no agents registered" in result.models[1].reason


def test_cordoned_and_disconnected_agents_take_nothing_new():
    agents = [gpu_agent(1, "a", cordoned=True), gpu_agent(2, "b", connected=False)]
    result = plan(snap(agents, [model(1, "m", min_replicas=1)]), NOW)
    assert result.places == []
    assert "a: cordoned" in result.models[1].reason and "b: not connected" in result.models[1].reason


def test_many_agents_with_one_cause_are_grouped():
    agents = [gpu_agent(i, f"n{i}", cordoned=True) for i in range(10)]
    reason = plan(snap(agents, [model(1, "m", min_replicas=1)]), NOW).models[1].reason
    assert "10 agents" in reason and reason.count("cordoned") == 1


def test_cpu_profile_uses_cores_and_memory():
    agents = [cpu_agent(1, "c", cores=2, mem=4096)]
    result = plan(snap(agents, [model(1, "m", profile=CPU, min_replicas=3, max_replicas=3)]), NOW)
    assert len(result.places) == 2  # two cores
    # The third is explained: what one replica needs, and what the agent has left.
    assert result.models[1].reason == "no agent has 1 free CPU cores and 1024 MiB RAM; c: 0 CPU cores free"


def test_cpu_profile_short_of_memory_is_explained():
    result = plan(snap([cpu_agent(1, "c", cores=8, mem=512)], [model(1, "m", profile=CPU, min_replicas=1)]), NOW)
    assert "c: 512 MiB RAM free" in result.models[1].reason


def test_placing_replicas_count_so_a_second_pass_places_nothing_more():
    replicas = [rep(5, 1, 1, state=S.PLACING)]
    result = plan(snap([gpu_agent(1, "a")], [model(1, "m", min_replicas=1)], replicas), NOW)
    assert result.actions == []


def test_model_without_profile_is_unservable():
    result = plan(snap([gpu_agent(1, "a")], [model(1, "m", profile=None, min_replicas=1)]), NOW)
    assert result.models[1].unservable


def test_plan_is_deterministic():
    s = snap([gpu_agent(i, f"a{i}", gpus=2) for i in range(5)],
             [model(i, f"m{i}", min_replicas=2, max_replicas=2) for i in range(6)])
    assert plan(s, NOW).actions == plan(s, NOW).actions


# --- surplus and drain -----------------------------------------------------------------------

def test_surplus_ready_replica_drains_and_a_starting_one_stops_first():
    replicas = [rep(1, 1, 1, S.READY, gpus=(0,), in_flight=0), rep(2, 1, 1, S.STARTING, gpus=(1,))]
    result = plan(snap([gpu_agent(1, "a")], [model(1, "m", min_replicas=1, max_replicas=2)], replicas), NOW)
    assert result.moves == [Move(2, S.STOPPING, result.moves[0].reason, MoveCause.SURPLUS)]


def test_stopped_cluster_drains_every_ready_replica():
    replicas = [rep(1, 1, 1, S.READY, in_flight=0)]
    result = plan(snap([gpu_agent(1, "a")], [model(1, "m", min_replicas=1)], replicas, stopped=True), NOW)
    assert [(m.replica_id, m.to, m.cause) for m in result.moves] == [(1, S.DRAINING, MoveCause.CLUSTER_STOPPED)]
    assert result.models[1].reason == "cluster stopped"


def test_draining_replica_stops_once_nothing_is_in_flight():
    replicas = [rep(1, 1, 1, S.DRAINING, in_flight=0, state_changed_at=ago(1))]
    result = plan(snap([gpu_agent(1, "a")], [model(1, "m")], replicas), NOW)
    assert [(m.replica_id, m.to, m.cause) for m in result.moves] == [(1, S.STOPPING, MoveCause.DRAINED)]


def test_draining_replica_with_requests_in_flight_waits_within_the_grace():
    replicas = [rep(1, 1, 1, S.DRAINING, in_flight=2, state_changed_at=ago(5))]
    assert plan(snap([gpu_agent(1, "a")], [model(1, "m")], replicas, drain_grace_s=30), NOW).moves == []


def test_draining_replica_with_unknown_in_flight_is_not_treated_as_idle():
    replicas = [rep(1, 1, 1, S.DRAINING, in_flight=None, state_changed_at=ago(5))]
    assert plan(snap([gpu_agent(1, "a")], [model(1, "m")], replicas, drain_grace_s=30), NOW).moves == []


def test_drain_grace_bounds_the_wait():
    replicas = [rep(1, 1, 1, S.DRAINING, in_flight=3, state_changed_at=ago(31))]
    moves = plan(snap([gpu_agent(1, "a")], [model(1, "m")], replicas, drain_grace_s=30), NOW).moves
    assert [(m.replica_id, m.to, m.cause) for m in moves] == [(1, S.STOPPING, MoveCause.DRAIN_GRACE_OVER)]


# --- lost agents -----------------------------------------------------------------------------

def test_silent_agent_loses_its_replicas_and_they_are_placed_elsewhere():
    agents = [gpu_agent(1, "a", last_seen_at=ago(100)), gpu_agent(2, "b"), gpu_agent(3, "c"), gpu_agent(4, "d")]
    models = [model(1, "m", min_replicas=1)] + [model(i, f"o{i}", min_replicas=1) for i in (2, 3, 4)]
    replicas = [rep(1, 1, 1), rep(2, 2, 2), rep(3, 3, 3), rep(4, 4, 4)]
    result = plan(snap(agents, models, replicas, agent_lost_after_s=20), NOW)
    assert (1, S.LOST, MoveCause.AGENT_SILENT) in [(m.replica_id, m.to, m.cause) for m in result.moves]
    assert [p.model_id for p in result.places] == [1] and result.places[0].agent_id != 1


def test_an_agent_silent_shorter_than_the_grace_moves_nothing():
    agents = [gpu_agent(1, "a", last_seen_at=ago(10), connected=False), gpu_agent(2, "b")]
    replicas = [rep(1, 1, 1)]
    result = plan(snap(agents, [model(1, "m", min_replicas=1)], replicas, agent_lost_after_s=20), NOW)
    assert result.actions == []


def test_most_agents_silent_at_once_means_the_control_plane_stalled():
    agents = [gpu_agent(i, f"a{i}", last_seen_at=ago(100)) for i in range(1, 5)]
    models = [model(i, f"m{i}", min_replicas=1) for i in range(1, 5)]
    replicas = [rep(i, i, i) for i in range(1, 5)]
    result = plan(snap(agents, models, replicas, agent_lost_after_s=20), NOW)
    assert not any(m.to == S.LOST for m in result.moves)
    assert result.places == []
    assert "stalled" in result.notes[0]


# --- crash loops -----------------------------------------------------------------------------

def test_failed_replicas_are_replaced_with_exponential_backoff():
    m = model(1, "m", min_replicas=1, failures=(ago(30), ago(20), ago(10)), last_error="engine exited with code 1")
    result = plan(snap([gpu_agent(1, "a")], [m], backoff_base_s=5, backoff_cap_s=300), NOW)
    assert result.places == []  # third failure: wait 20 s, 10 s passed
    assert "crash loop: 3 failure(s)" in result.models[1].reason and "exited with code 1" in result.models[1].reason
    later = plan(snap([gpu_agent(1, "a")], [m], backoff_base_s=5, backoff_cap_s=300), NOW + timedelta(seconds=11))
    assert len(later.places) == 1


def test_backoff_is_capped():
    m = model(1, "m", min_replicas=1, failures=tuple(ago(1000 + i) for i in range(10, 0, -1)))
    assert len(plan(snap([gpu_agent(1, "a")], [m], backoff_base_s=5, backoff_cap_s=60), NOW).places) == 1


# --- on-demand: idle eviction and making room --------------------------------------------------

def test_idle_on_demand_model_scales_to_zero_and_forgets_its_demand():
    m = model(1, "m", on_demand=True, idle_timeout_s=60, wanted_at=ago(61))
    replicas = [rep(1, 1, 1, S.READY, in_flight=0, last_used_at=ago(61))]
    result = plan(snap([gpu_agent(1, "a")], [m], replicas), NOW)
    assert [(x.replica_id, x.to, x.cause) for x in result.moves] == [(1, S.DRAINING, MoveCause.IDLE)]
    assert result.models[1].forget_demand
    assert "idle for 1 min" in result.models[1].reason


def test_idle_replica_with_requests_in_flight_is_drained_not_stopped():
    m = model(1, "m", on_demand=True, idle_timeout_s=60, wanted_at=ago(61))
    replicas = [rep(1, 1, 1, S.READY, in_flight=2, last_used_at=ago(61))]
    result = plan(snap([gpu_agent(1, "a")], [m], replicas), NOW)
    assert [(x.replica_id, x.to) for x in result.moves] == [(1, S.DRAINING)]


def test_wanted_on_demand_model_is_placed():
    m = model(1, "m", on_demand=True, wanted_at=ago(0))
    assert len(plan(snap([gpu_agent(1, "a")], [m]), NOW).places) == 1


def full_fleet(*users):
    """One agent with two GPUs, each held by an on-demand model's replica."""
    models = [model(10 + i, name, on_demand=True, wanted_at=ago(5)) for i, (name, _, _) in enumerate(users)]
    replicas = [rep(100 + i, 10 + i, 1, S.READY, gpus=(i,), last_used_at=used, in_flight=flight)
                for i, (_, used, flight) in enumerate(users)]
    return models, replicas


def test_making_room_evicts_the_least_recently_used_idle_replica():
    models, replicas = full_fleet(("qwen-7b", ago(14 * 60), 0), ("mistral", ago(5 * 60), 0))
    wanted = model(1, "llama-70b", on_demand=True, wanted_at=ago(0))
    result = plan(snap([gpu_agent(1, "a")], models + [wanted], replicas, min_idle_before_eviction_s=60), NOW)
    assert [(x.replica_id, x.to, x.cause) for x in result.moves] == [(100, S.DRAINING, MoveCause.EVICTION)]
    assert "evicted qwen-7b, idle 14 min, to place llama-70b" in result.models[1].reason
    assert not result.models[1].unservable
    assert result.models[10].forget_demand  # qwen-7b is no longer wanted: no ping-pong


def test_making_room_never_evicts_on_unknown_idleness():
    models, replicas = full_fleet(("qwen-7b", None, 0), ("mistral", None, 0))
    wanted = model(1, "llama-70b", on_demand=True, wanted_at=ago(0))
    result = plan(snap([gpu_agent(1, "a")], models + [wanted], replicas), NOW)
    assert result.moves == []
    assert result.models[1].unservable


def test_making_room_never_evicts_a_replica_with_requests_in_flight_or_unknown_in_flight():
    models, replicas = full_fleet(("qwen-7b", ago(3600), 1), ("mistral", ago(3600), None))
    wanted = model(1, "llama-70b", on_demand=True, wanted_at=ago(0))
    assert plan(snap([gpu_agent(1, "a")], models + [wanted], replicas), NOW).moves == []


def test_making_room_never_evicts_a_replica_idle_shorter_than_the_minimum():
    models, replicas = full_fleet(("qwen-7b", ago(30), 0), ("mistral", ago(20), 0))
    wanted = model(1, "llama-70b", on_demand=True, wanted_at=ago(0))
    assert plan(snap([gpu_agent(1, "a")], models + [wanted], replicas, min_idle_before_eviction_s=60), NOW).moves == []


def test_making_room_never_goes_below_another_models_min():
    models = [model(10, "pinned", on_demand=True, min_replicas=1, wanted_at=None),
              model(11, "window", on_demand=True, window_min=1)]
    replicas = [rep(100, 10, 1, S.READY, gpus=(0,), last_used_at=ago(3600), in_flight=0),
                rep(101, 11, 1, S.READY, gpus=(1,), last_used_at=ago(3600), in_flight=0)]
    wanted = model(1, "llama-70b", on_demand=True, wanted_at=ago(0))
    assert plan(snap([gpu_agent(1, "a")], models + [wanted], replicas), NOW).moves == []


def test_making_room_never_evicts_ordinary_models():
    models = [model(10, "always-on", min_replicas=0, max_replicas=2, extra_replicas=1)]
    replicas = [rep(100, 10, 1, S.READY, gpus=(0,), last_used_at=ago(3600), in_flight=0),
                rep(101, 10, 1, S.READY, gpus=(1,), last_used_at=ago(3600), in_flight=0)]
    wanted = model(1, "llama-70b", on_demand=True, wanted_at=ago(0))
    result = plan(snap([gpu_agent(1, "a")], models + [wanted], replicas), NOW)
    # Both are surplus (load's extra needs a base above 0): they drain for that, not evicted.
    assert sorted((x.replica_id, x.to, x.cause) for x in result.moves) == [(100, S.DRAINING, MoveCause.SURPLUS),
                                                                           (101, S.DRAINING, MoveCause.SURPLUS)]
    assert not any("evicted" in x.reason for x in result.moves) and result.places == []
    # Wanted by their own min, they stay, and the on-demand model waits, unservable.
    models = [model(10, "always-on", min_replicas=2, max_replicas=2)]
    result = plan(snap([gpu_agent(1, "a")], models + [wanted], replicas), NOW)
    assert result.actions == [] and result.models[1].unservable


def test_making_room_evicts_only_as_much_as_needed_in_lru_order():
    # The wanted model needs two GPUs; three idle replicas hold GPUs 0-2 of a 3-GPU agent.
    models = [model(10 + i, f"m{i}", on_demand=True, wanted_at=ago(5)) for i in range(3)]
    used = [ago(600), ago(1800), ago(1200)]
    replicas = [rep(100 + i, 10 + i, 1, S.READY, gpus=(i,), last_used_at=used[i], in_flight=0) for i in range(3)]
    wanted = model(1, "big", profile=GPU_2X40G, on_demand=True, wanted_at=ago(0))
    result = plan(snap([gpu_agent(1, "a", gpus=3)], models + [wanted], replicas), NOW)
    assert [x.replica_id for x in result.moves] == [101, 102]  # 30 min idle, then 20 min


def test_making_room_is_only_for_on_demand_models():
    models, replicas = full_fleet(("qwen-7b", ago(3600), 0), ("mistral", ago(3600), 0))
    ordinary = model(1, "llama-70b", min_replicas=1)
    result = plan(snap([gpu_agent(1, "a")], models + [ordinary], replicas), NOW)
    assert result.moves == [] and result.models[1].unservable


def test_a_draining_replica_of_a_model_wanted_again_serves_again_instead_of_a_cold_start():
    m = model(1, "m", on_demand=True, wanted_at=ago(1))
    replicas = [rep(1, 1, 1, S.DRAINING, in_flight=1, state_changed_at=ago(2))]
    result = plan(snap([gpu_agent(1, "a")], [m], replicas), NOW)
    assert [(x.replica_id, x.to, x.cause) for x in result.moves] == [(1, S.READY, MoveCause.WANTED_AGAIN)]
    assert result.places == []


def test_a_replica_its_agent_never_takes_up_is_failed_after_the_placing_timeout():
    replicas = [rep(1, 1, 1, S.PLACING, state_changed_at=ago(121))]
    result = plan(snap([gpu_agent(1, "a")], [model(1, "m", min_replicas=1)], replicas, placing_timeout_s=120), NOW)
    assert (1, S.FAILED, MoveCause.NOT_TAKEN_UP) in [(x.replica_id, x.to, x.cause) for x in result.moves]
    assert "did not take it up" in result.moves[0].reason


# --- making room while room is already being freed ------------------------------------------

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


# --- through faults: agents that go silent and come back (duplicates), a control plane that
# itself stalled, crash loops (one GPU per agent, a model of min 1 by default) -------------

def agent(id: int, name: str, gpus: int = 1, **kw) -> AgentView:
    kw.setdefault("last_seen_at", ago(1))
    return AgentView(id=id, name=name, gpus=tuple(GpuView(i, 81920) for i in range(gpus)), **kw)


def served_model(id: int = 1, name: str = "m", **kw) -> ModelView:
    kw.setdefault("min_replicas", 1)
    kw.setdefault("max_replicas", max(1, kw["min_replicas"]))
    return ModelView(id=id, name=name, profile=GPU_40G, **kw)


def replica_on(id: int, agent_id: int, state: S = S.READY, model_id: int = 1, **kw) -> ReplicaView:
    return ReplicaView(id=id, model_id=model_id, agent_id=agent_id, state=state, gpu_indices=(0,), **kw)


def run(agents, models, replicas, now: datetime = NOW, **policy):
    policy.setdefault("agent_lost_after_s", 20)
    return plan(Snapshot(Policy(**policy), tuple(agents), tuple(models), tuple(replicas)), now)


def moves(result) -> list[tuple[int, S]]:
    return sorted((m.replica_id, m.to) for m in result.moves)


# --- an agent comes back -------------------------------------------------------------------

def test_a_returning_replica_is_stopped_when_its_successor_is_ready():
    result = run([agent(1, "a"), agent(2, "b")], [served_model()],
                 [replica_on(1, 1, S.LOST, back=True, state_changed_at=ago(60)), replica_on(2, 2, S.READY)])
    assert moves(result) == [(1, S.STOPPING)]
    assert "duplicate: agent a came back, 1 ready elsewhere" in result.moves[0].reason
    assert result.places == []


def test_a_returning_ready_replica_is_kept_while_its_successor_is_not_ready_yet():
    result = run([agent(1, "a"), agent(2, "b")], [served_model()],
                 [replica_on(1, 1, S.LOST, back=True), replica_on(2, 2, S.STARTING)])
    assert moves(result) == [(1, S.READY), (2, S.STOPPING)]
    assert result.places == []
    assert result.models[1].ready == 1 and result.models[1].active == 1


def test_a_returning_replica_with_no_successor_is_taken_back():
    result = run([agent(1, "a")], [served_model()], [replica_on(1, 1, S.LOST, back=True)])
    assert moves(result) == [(1, S.READY)]
    assert "agent a came back with the engine ready" in result.moves[0].reason


def test_a_returning_engine_not_ready_is_stopped_when_others_are_ready():
    result = run([agent(1, "a"), agent(2, "b")], [served_model()], [replica_on(1, 1, S.LOST, back=False), replica_on(2, 2, S.READY)])
    assert moves(result) == [(1, S.STOPPING)]


def test_a_returning_engine_not_ready_waits_for_its_report_while_others_are_not_ready_either():
    result = run([agent(1, "a"), agent(2, "b")], [served_model()], [replica_on(1, 1, S.LOST, back=False), replica_on(2, 2, S.PLACING)])
    assert result.actions == []


def test_returning_replicas_of_a_model_no_longer_wanted_stop():
    result = run([agent(1, "a")], [served_model()], [replica_on(1, 1, S.LOST, back=True)], stopped=True)
    assert moves(result) == [(1, S.STOPPING)]


def test_of_two_returning_replicas_only_the_missing_one_is_taken_back():
    agents = [agent(1, "a", gpus=2), agent(2, "b")]
    replicas = [replica_on(1, 1, S.LOST, back=True), replica_on(3, 1, S.LOST, back=True), replica_on(2, 2, S.READY)]
    result = run(agents, [served_model(min_replicas=2)], replicas)
    assert moves(result) == [(1, S.READY), (3, S.STOPPING)]


def test_a_lost_replica_of_an_agent_still_silent_is_left_alone():
    result = run([agent(1, "a", last_seen_at=ago(100)), agent(2, "b")], [served_model()],
                 [replica_on(1, 1, S.LOST, back=True), replica_on(2, 2, S.READY)])
    assert result.actions == []


def test_a_returning_engine_keeps_its_gpu_until_it_has_stopped():
    other = ModelView(id=2, name="other", profile=GPU_40G, min_replicas=1, max_replicas=1)
    result = run([agent(1, "a")], [served_model(), other], [replica_on(1, 1, S.LOST, back=False)])
    assert result.places == []  # GPU 0 of agent a is still taken by the returning engine
    assert "no agent has 1 free GPU" in result.models[2].reason


# --- an agent goes silent ------------------------------------------------------------------

def test_an_agent_silent_for_longer_than_the_grace_is_replaced_on_another():
    result = run([agent(1, "a", last_seen_at=ago(30)), agent(2, "b")], [served_model()], [replica_on(1, 1)])
    assert moves(result) == [(1, S.LOST)]
    assert "agent a silent for 30 s" in result.moves[0].reason
    assert [(p.model_id, p.agent_id) for p in result.places] == [(1, 2)]


def test_only_replicas_meant_to_run_are_lost_with_their_agent():
    replicas = [replica_on(1, 1, S.READY), replica_on(2, 1, S.DRAINING, model_id=2), replica_on(3, 1, S.STOPPING, model_id=3)]
    models = [served_model(1, "m"), served_model(2, "n", min_replicas=0), served_model(3, "o", min_replicas=0)]
    result = run([agent(1, "a", gpus=3, last_seen_at=ago(30)), agent(2, "b")], models, replicas)
    # A lost replica may run again if its agent returns; one on its way out never should.
    assert moves(result) == [(1, S.LOST), (2, S.STOPPING)]


def test_a_blip_shorter_than_the_grace_moves_nothing():
    result = run([agent(1, "a", last_seen_at=ago(19), connected=False), agent(2, "b")], [served_model()], [replica_on(1, 1)])
    assert result.actions == []


def test_silence_while_the_control_plane_could_not_listen_does_not_count():
    # The agent's last stamp is 100 s old, but the control plane only listens again since
    # 10 s (its database was away): 10 s of silence, under the grace.
    result = run([agent(1, "a", last_seen_at=ago(100)), agent(2, "b", last_seen_at=ago(100))], [served_model()],
                 [replica_on(1, 1)], listening_since=ago(10))
    assert result.actions == []


def test_silence_counts_again_once_the_control_plane_listened_for_the_grace():
    result = run([agent(1, "a", last_seen_at=ago(100)), agent(2, "b")], [served_model()], [replica_on(1, 1)],
                 listening_since=ago(25))
    assert moves(result) == [(1, S.LOST)]
    assert "silent for 25 s" in result.moves[0].reason


def test_a_control_plane_that_listened_all_along_changes_nothing():
    result = run([agent(1, "a", last_seen_at=ago(30)), agent(2, "b")], [served_model()], [replica_on(1, 1)],
                 listening_since=ago(3600))
    assert moves(result) == [(1, S.LOST)]


def test_a_heartbeat_storm_reschedules_nothing():
    agents = [agent(i, f"a{i}", last_seen_at=ago(60)) for i in range(1, 7)] + [agent(7, "a7")]
    models = [served_model(i, f"m{i}") for i in range(1, 8)]
    replicas = [replica_on(i, i, model_id=i) for i in range(1, 8)]
    result = run(agents, models, replicas)
    assert result.actions == []
    assert "6 of 7 agents went silent at once" in result.notes[0]


# --- crash loops ---------------------------------------------------------------------------

def test_a_crash_loop_shows_as_such_with_the_last_error_and_waits_longer_each_time():
    m = served_model(failures=(ago(5), ago(3), ago(2)), last_error="RuntimeError: CUDA out of memory")
    result = run([agent(1, "a")], [m], [], backoff_base_s=1, backoff_cap_s=60)
    reason = result.models[1].reason
    assert result.places == [] and reason.startswith("crash loop: 3 failure(s) in a row, next try in 2 s")
    assert reason.endswith("last error: RuntimeError: CUDA out of memory")
    # After the third failure it waits 4 s (1 · 2²); after the second it waited 2 s.
    assert run([agent(1, "a")], [m], [], now=NOW + timedelta(seconds=1.9), backoff_base_s=1).places == []
    assert len(run([agent(1, "a")], [m], [], now=NOW + timedelta(seconds=2.1), backoff_base_s=1).places) == 1
    second = served_model(failures=(ago(5), ago(3)))
    assert len(run([agent(1, "a")], [second], [], now=NOW - timedelta(seconds=0.9), backoff_base_s=1).places) == 1


def test_the_backoff_is_capped():
    m = served_model(failures=tuple(ago(100 + i) for i in range(8, 0, -1)))
    assert len(run([agent(1, "a")], [m], [], backoff_base_s=1, backoff_cap_s=10, now=NOW - timedelta(seconds=90)).places) == 1


def test_an_attempt_between_failures_is_still_shown_as_a_crash_loop():
    m = served_model(failures=(ago(30), ago(20)), last_error="engine exited with code 1")
    result = run([agent(1, "a")], [m], [replica_on(5, 1, S.STARTING)], backoff_base_s=1)
    assert result.models[1].reason == ("crash loop: 2 failure(s) in a row, trying again (1 wanted, all placed); "
                                       "last error: engine exited with code 1")
    placing = run([agent(1, "a")], [m], [], backoff_base_s=1)
    assert placing.models[1].reason.startswith("crash loop: 2 failure(s) in a row, trying again (placed on a GPU 0")
