"""How long one reconcile pass's planning takes on a large fleet.

Builds a synthetic fleet (N agents × 8 GPUs of 80 GiB, 2 models per agent, min replicas
1–3 each, a few on demand, a few schedule windows), runs ``plan()`` once from empty to
place everything, applies the placements as ready replicas, then times steady-state passes
(nothing to do, which is what the cluster runs every few seconds). Prints time per pass
for 100 … 1,000 agents and the growth ratio. Goal: ≤ 100 ms at 1,000 agents × 8 GPUs and
2,000 models, growing about linearly.

    python bench/plan_scale.py [--passes 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fleet.planning.planner import AgentView, GpuView, ModelView, Place, Policy, ProfileView, ReplicaView, Snapshot, plan  # noqa: E402
from fleet.planning.scaling import Load  # noqa: E402
from fleet.states import ReplicaState  # noqa: E402

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
PROFILES = [ProfileView(1, gpus_needed=1, gpu_memory_mib=40960), ProfileView(2, gpus_needed=2, gpu_memory_mib=40960)]


def fleet(agents: int) -> tuple[tuple[AgentView, ...], tuple[ModelView, ...]]:
    seen = NOW - timedelta(seconds=2)
    agent_views = tuple(
        AgentView(i, f"gpu-node-{i:04d}", last_seen_at=seen, gpus=tuple(GpuView(g, 81920) for g in range(8)))
        for i in range(1, agents + 1)
    )
    models = []
    for i in range(1, 2 * agents + 1):
        on_demand = i % 10 == 0
        models.append(ModelView(
            i, f"model-{i:05d}", PROFILES[1 if i % 7 == 0 else 0], min_replicas=0 if on_demand else 1 + i % 3,
            max_replicas=4, on_demand=on_demand, wanted_at=NOW - timedelta(seconds=30) if on_demand else None,
            load=Load(1 + i % 3, running=i % 5, waiting=0),
        ))
    return agent_views, tuple(models)


def steady_snapshot(agents: int) -> Snapshot:
    agent_views, models = fleet(agents)
    first = plan(Snapshot(Policy(), agent_views, models, ()), NOW)
    replicas = tuple(
        ReplicaView(n, p.model_id, p.agent_id, ReplicaState.READY, p.gpu_indices, state_changed_at=NOW,
                    last_used_at=NOW, in_flight=0)
        for n, p in enumerate((a for a in first.actions if isinstance(a, Place)), start=1)
    )
    return Snapshot(Policy(), agent_views, models, replicas)


def time_passes(snapshot: Snapshot, passes: int) -> tuple[float, int]:
    timings = []
    actions = 0
    for _ in range(passes):
        started = time.perf_counter()
        result = plan(snapshot, NOW)
        timings.append(time.perf_counter() - started)
        actions = len(result.actions)
    return statistics.median(timings), actions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args()
    print(f"{'agents':>7} {'GPUs':>6} {'models':>7} {'replicas':>9} {'pass ms':>9} {'actions':>8}")
    results = {}
    for agents in (100, 250, 500, 1000):
        snapshot = steady_snapshot(agents)
        median_s, actions = time_passes(snapshot, args.passes)
        results[agents] = median_s
        print(f"{agents:>7} {agents * 8:>6} {len(snapshot.models):>7} {len(snapshot.replicas):>9} "
              f"{median_s * 1000:>9.1f} {actions:>8}")
    growth = results[1000] / results[100]
    top = results[1000] * 1000
    print(f"\n1,000 agents: {top:.1f} ms per steady pass (goal ≤ 100 ms: {'PASS' if top <= 100 else 'MISS'}); "
          f"×10 agents costs ×{growth:.1f} (linear would be ×10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
