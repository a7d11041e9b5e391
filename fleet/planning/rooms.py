"""Free resources on one agent during a pass, as the planner takes and gives them back
(docs/architecture.md, R3). Pure; kept apart from ``planner.py`` for its length."""

from __future__ import annotations

from dataclasses import dataclass

from fleet.planning.data import AgentView, ProfileView, ReplicaView


@dataclass
class Room:
    """Free resources on one agent during a pass (mutated as the pass places)."""

    agent: AgentView
    free_gpus: dict[int, int]  # index -> memory_total_mib
    free_cores: float
    free_memory_mib: int

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

    def take(self, gpus: tuple[int, ...], profile: ProfileView) -> None:
        """Hold what one replica of ``profile`` on ``gpus`` (from :meth:`fit`) needs."""
        for idx in gpus:
            self.free_gpus.pop(idx, None)
        if not profile.gpus_needed:
            self.free_cores -= profile.cpu_cores
            self.free_memory_mib -= profile.memory_mib

    def give_back(self, replica: ReplicaView) -> None:
        """Free what ``replica`` holds here (its GPUs at their full memory, cores, RAM)."""
        by_index = {g.index: g.memory_total_mib for g in self.agent.gpus}
        for idx in replica.gpu_indices:
            if idx in by_index:
                self.free_gpus[idx] = by_index[idx]
        self.free_cores += replica.cpu_cores
        self.free_memory_mib += replica.memory_mib
