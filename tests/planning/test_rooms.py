"""Where a replica goes: the fast choice (``RoomIndex.best``, what the planner uses) against
the plain one that checks every agent (``rank_rooms``), on random fleets — room by room as
replicas are taken and given back, and whole passes whose actions and words must be the
same either way (docs/architecture.md, R3)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from fleet.planning import planner as planner_module
from fleet.planning.planner import (
    AgentView, GpuView, ModelView, Policy, ProfileView, ReplicaView, Snapshot, plan,
)
from fleet.planning.rooms import Room, RoomIndex, rank_rooms
from fleet.planning.scaling import Load
from fleet.states import ReplicaState as S

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
MEMORIES = (24576, 40960, 81920)


def random_profile(rng: random.Random, pid: int) -> ProfileView:
    if rng.random() < 0.25:
        return ProfileView(pid, cpu_cores=rng.choice((0.5, 1, 2, 4)), memory_mib=rng.choice((512, 2048, 8192)))
    return ProfileView(pid, gpus_needed=rng.choice((1, 1, 1, 2, 4)), gpu_memory_mib=rng.choice(MEMORIES))


def random_agents(rng: random.Random, n: int) -> list[AgentView]:
    agents = []
    for i in range(1, n + 1):
        gpus = rng.choice((0, 1, 2, 4, 8, 8))
        memory = rng.choice(MEMORIES)
        seen = NOW - timedelta(seconds=rng.choice((1, 1, 1, 1, 60)))  # a few silent
        agents.append(AgentView(
            i, f"node-{rng.randrange(1000):03d}-{i}", connected=rng.random() > 0.05, cordoned=rng.random() < 0.08,
            last_seen_at=seen, gpus=tuple(GpuView(g, memory if rng.random() < 0.8 else rng.choice(MEMORIES))
                                          for g in range(gpus)),
            cpu_cores=rng.choice((2, 8, 32)), memory_mib=rng.choice((4096, 65536))))
    return agents


def test_the_index_chooses_what_checking_every_agent_chooses_as_rooms_change():
    for seed in range(60):
        rng = random.Random(seed)
        agents = random_agents(rng, rng.randint(1, 40))
        rooms = {a.id: Room(a, {g.index: g.memory_total_mib for g in a.gpus}, a.cpu_cores, a.memory_mib)
                 for a in agents}
        unusable = {a.id: (f"{a.name}: cordoned" if a.cordoned else None) for a in agents}
        index = RoomIndex(rooms, unusable)
        held: list[tuple[int, ReplicaView]] = []
        for step in range(120):
            profile = random_profile(rng, step)
            per_agent = {a.id: rng.choice((0, 0, 0, 1, 2)) for a in rng.sample(agents, min(3, len(agents)))}
            fits, _ = rank_rooms(rooms, unusable, profile, per_agent)
            assert index.best(profile, per_agent) == (fits[0] if fits else None), (seed, step)
            if fits and rng.random() < 0.7:
                _, agent_id, gpus = fits[rng.randrange(len(fits))]
                rooms[agent_id].take(gpus, profile)
                held.append((agent_id, ReplicaView(
                    step, 1, agent_id, S.READY, gpus, cpu_cores=0 if gpus else profile.cpu_cores,
                    memory_mib=0 if gpus else profile.memory_mib)))
            elif held and rng.random() < 0.5:
                agent_id, replica = held.pop(rng.randrange(len(held)))
                rooms[agent_id].give_back(replica)


def random_snapshot(rng: random.Random) -> Snapshot:
    agents = random_agents(rng, rng.randint(1, 25))
    profiles = [random_profile(rng, p) for p in range(1, 6)]
    models = []
    for i in range(1, rng.randint(1, 30) + 1):
        on_demand = rng.random() < 0.3
        models.append(ModelView(
            i, f"model-{i:03d}", rng.choice(profiles), min_replicas=0 if on_demand else rng.randint(0, 3),
            max_replicas=4, on_demand=on_demand,
            wanted_at=NOW - timedelta(seconds=rng.choice((5, 30, 900))) if on_demand and rng.random() < 0.7 else None,
            load=Load(1 + i % 3, running=rng.randint(0, 6), waiting=0)))
    # Some replicas already placed (by a plain first pass on part of the fleet), in mixed states.
    replicas = []
    first = plan(Snapshot(Policy(), tuple(agents), tuple(models[: len(models) // 2]), ()), NOW)
    for n, place in enumerate(first.places, start=1):
        state = rng.choice((S.READY, S.READY, S.READY, S.STARTING, S.DRAINING, S.STOPPING, S.FAILED))
        replicas.append(ReplicaView(n, place.model_id, place.agent_id, state, place.gpu_indices,
                                    cpu_cores=place.cpu_cores, memory_mib=place.memory_mib,
                                    state_changed_at=NOW - timedelta(seconds=rng.choice((5, 400))),
                                    last_used_at=NOW - timedelta(seconds=rng.choice((5, 400))), in_flight=0))
    return Snapshot(Policy(), tuple(agents), tuple(models), tuple(replicas))


def plain_best_room(self, m, active, placed_here):
    """The reference: every agent checked and sorted (the rule as R3 states it)."""
    per_agent: dict[int, int] = {}
    for r in active:
        per_agent[r.agent_id] = per_agent.get(r.agent_id, 0) + 1
    for agent_id, n in placed_here.items():
        per_agent[agent_id] = per_agent.get(agent_id, 0) + n
    fits, reasons = rank_rooms(self.rooms, self.unusable, m.profile, per_agent)
    return (fits[0] if fits else None), reasons


@pytest.mark.parametrize("seed", range(40))
def test_a_pass_places_the_same_replicas_with_the_same_words_as_the_plain_rule(seed, monkeypatch):
    snapshot = random_snapshot(random.Random(seed))
    fast = plan(snapshot, NOW)
    monkeypatch.setattr(planner_module.PlanningPass, "_best_room", plain_best_room)
    plain = plan(snapshot, NOW)
    assert fast.actions == plain.actions
    assert fast.models == plain.models
    assert fast.notes == plain.notes
