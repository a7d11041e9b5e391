"""Free resources on each agent during a pass, as the planner takes and gives them back,
and the choice of where one replica goes (docs/architecture.md, R3). Pure; kept apart
from ``planner.py`` for its length.

The choice is the same everywhere: among agents that can take the replica, fewest of the
model's replicas there first (spread across machines), then least room left after it
(pack), then the agent's name. :func:`rank_rooms` states it plainly, every agent checked;
:class:`RoomIndex` finds the same best agent without looking at every one, so a pass that
places thousands of replicas (a cold cluster, ``llmgw start``) costs about linearly in
placements (``bench/plan_scale.py``, "cold pass"). ``tests/planning/test_rooms.py`` holds
the two to the same answers on random fleets.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field
from typing import Iterator, Mapping

from fleet.planning.data import AgentView, ProfileView, ReplicaView

#: A candidate: ``((replicas of the model there, room left after it, agent name), agent
#: id, GPU indices)``; the smallest is the best.
Candidate = tuple[tuple[int, float, str], int, tuple[int, ...]]


@dataclass
class Room:
    """Free resources on one agent during a pass (mutated as the pass places)."""

    agent: AgentView
    free_gpus: dict[int, int]  # index -> memory_total_mib
    free_cores: float
    free_memory_mib: int
    #: The index that ranks this room, told of every change; not copied by
    #: ``dataclasses.replace`` (trial rooms for eviction change nothing real).
    index: RoomIndex | None = field(default=None, init=False, repr=False, compare=False)

    def fit(self, profile: ProfileView) -> tuple[tuple[int, ...], str | None]:
        """GPU indices (or ``()`` for CPU) if ``profile`` fits here, else the reason."""
        name = self.agent.name
        if profile.gpus_needed:
            if not self.agent.gpus:
                return (), f"{name}: no GPUs"
            big_enough = sorted(
                (mem, idx) for idx, mem in self.free_gpus.items() if mem >= profile.gpu_memory_mib
            )
            if len(big_enough) >= profile.gpus_needed:
                return tuple(sorted(idx for _, idx in big_enough[: profile.gpus_needed])), None
            if len(self.free_gpus) < profile.gpus_needed:
                return (), f"{name}: {len(self.free_gpus)} free"
            largest = max(self.free_gpus.values(), default=0)
            return (), f"{name}: {len(big_enough)} free with {profile.gpu_memory_mib} MiB (largest {largest} MiB)"
        if self.free_cores + 1e-9 < profile.cpu_cores:
            return (), f"{name}: {self.free_cores:g} CPU cores free"
        if self.free_memory_mib < profile.memory_mib:
            return (), f"{name}: {self.free_memory_mib} MiB RAM free"
        return (), None

    def left_after(self, gpus: tuple[int, ...], profile: ProfileView) -> float:
        """Room left here once one replica of ``profile`` takes ``gpus``: free GPUs for a
        GPU profile, free cores for a CPU one (the "pack" part of the choice)."""
        if profile.gpus_needed:
            return len(self.free_gpus) - len(gpus)
        return self.free_cores - profile.cpu_cores

    def take(self, gpus: tuple[int, ...], profile: ProfileView) -> None:
        """Hold what one replica of ``profile`` on ``gpus`` (from :meth:`fit`) needs."""
        before = self._ranked()
        for idx in gpus:
            self.free_gpus.pop(idx, None)
        if not profile.gpus_needed:
            self.free_cores -= profile.cpu_cores
            self.free_memory_mib -= profile.memory_mib
        if self.index is not None:
            self.index.moved(self, before)

    def give_back(self, replica: ReplicaView) -> None:
        """Free what ``replica`` holds here (its GPUs at their full memory, cores, RAM)."""
        before = self._ranked()
        for gpu in self.agent.gpus:
            if gpu.index in replica.gpu_indices:
                self.free_gpus[gpu.index] = gpu.memory_total_mib
        self.free_cores += replica.cpu_cores
        self.free_memory_mib += replica.memory_mib
        if self.index is not None:
            self.index.moved(self, before)

    def _ranked(self) -> tuple[int, float]:
        return len(self.free_gpus), self.free_cores


def rank_rooms(rooms: Mapping[int, Room], unusable: Mapping[int, str | None], profile: ProfileView,
               per_agent: Mapping[int, int]) -> tuple[list[Candidate], list[str]]:
    """Every agent that can take one replica of ``profile``, best first, and why each other
    one cannot (in agent-name order; ``unusable[agent_id]``, when set, is that agent's
    reason). ``per_agent``: the model's replicas on each agent so far. Checks every agent:
    the reference for :meth:`RoomIndex.best`, and the reasons a model that fits nowhere is
    told (docs/architecture.md, R3)."""
    fits: list[Candidate] = []
    reasons: list[str] = []
    for agent_id, room in sorted(rooms.items(), key=lambda kv: kv[1].agent.name):
        why_not = unusable.get(agent_id)
        if why_not:
            reasons.append(why_not)
            continue
        gpus, why = room.fit(profile)
        if why:
            reasons.append(why)
            continue
        fits.append(((per_agent.get(agent_id, 0), room.left_after(gpus, profile), room.agent.name), agent_id, gpus))
    fits.sort()
    return fits, reasons


class RoomIndex:
    """The usable rooms of a pass ranked for :meth:`best`: by free GPU count (one name-
    ordered list per count) and by free cores (one list ordered by cores, then name).
    Rooms tell it of each change (:meth:`Room.take`, :meth:`Room.give_back`). Agents that
    are unusable (silent, disconnected, cordoned) are left out: nothing is placed there."""

    def __init__(self, rooms: Mapping[int, Room], unusable: Mapping[int, str | None]):
        self._by_gpus: dict[int, list[tuple[str, int]]] = {}
        self._by_cores: list[tuple[float, str, int]] = []
        self._rooms = rooms
        for agent_id, room in rooms.items():
            if unusable.get(agent_id):
                continue
            room.index = self
            self._by_gpus.setdefault(len(room.free_gpus), []).append((room.agent.name, agent_id))
            self._by_cores.append((room.free_cores, room.agent.name, agent_id))
        for names in self._by_gpus.values():
            names.sort()
        self._by_cores.sort()

    def moved(self, room: Room, before: tuple[int, float]) -> None:
        """``room`` changed from ``before`` (free GPU count, free cores): re-rank it."""
        count, cores = before
        name, agent_id = room.agent.name, room.agent.id
        if count != len(room.free_gpus):
            names = self._by_gpus[count]
            del names[bisect_left(names, (name, agent_id))]
            insort(self._by_gpus.setdefault(len(room.free_gpus), []), (name, agent_id))
        if cores != room.free_cores:
            del self._by_cores[bisect_left(self._by_cores, (cores, name, agent_id))]
            insort(self._by_cores, (room.free_cores, name, agent_id))

    def best(self, profile: ProfileView, per_agent: Mapping[int, int]) -> Candidate | None:
        """The best agent for one replica of ``profile`` — :func:`rank_rooms`' first, or
        None when no usable agent can take it. ``per_agent``: the model's replicas on each
        agent so far (usually a handful of agents); every other agent is looked at in
        order of room left, and the first that fits wins."""
        crowded = {agent_id for agent_id, n in per_agent.items() if n}
        first = self._first_without_the_model(profile, crowded)
        if first is not None:
            return first
        fits = []
        for agent_id in crowded:
            room = self._rooms.get(agent_id)
            if room is None or room.index is not self:
                continue
            gpus, why = room.fit(profile)
            if why is None:
                fits.append(((per_agent[agent_id], room.left_after(gpus, profile), room.agent.name), agent_id, gpus))
        return min(fits) if fits else None

    def _first_without_the_model(self, profile: ProfileView, crowded: set[int]) -> Candidate | None:
        """The first fitting agent holding none of the model's replicas (not in
        ``crowded``), in order of room left, then name; None if there is none."""
        rooms = self._rooms
        for name, agent_id in self._by_room_left(profile):
            if agent_id in crowded:
                continue
            room = rooms[agent_id]
            gpus, why = room.fit(profile)
            if why is None:
                return (0, room.left_after(gpus, profile), name), agent_id, gpus
        return None

    def _by_room_left(self, profile: ProfileView) -> Iterator[tuple[str, int]]:
        """``(agent name, agent id)`` of the agents that may fit ``profile``, least room
        left first: by free GPUs when it needs GPUs, else by free cores."""
        if profile.gpus_needed:
            for count in sorted(c for c in self._by_gpus if c >= profile.gpus_needed):
                yield from self._by_gpus[count]
            return
        by_cores = self._by_cores
        # Start a little below the cores needed: fit() allows a rounding error of 1e-9.
        for at in range(bisect_left(by_cores, (profile.cpu_cores - 1e-6,)), len(by_cores)):
            _, name, agent_id = by_cores[at]
            yield name, agent_id
