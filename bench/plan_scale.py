"""How long one reconcile pass's planning takes on a large fleet.

Builds a synthetic fleet (N agents × 8 GPUs of 80 GiB, 2 models per agent, min replicas
1–3 each, a few on demand), then times two kinds of pass:

* the **steady** pass (everything placed and ready, nothing to do: what the cluster runs
  every few seconds), for 100 … 1,000 agents. Goal: ≤ 100 ms at 1,000 agents × 8 GPUs and
  2,000 models, growing about linearly;
* the **cold** pass (nothing placed: first boot, ``llmgw start`` after a stop, a region
  coming back), which places every replica, for 100 … 10,000 agents. Goals: ≤ 0.5 s at
  1,000 agents, ≤ 5 s at 10,000 agents × 8 GPUs with 20,000 models, and about linear in
  placements (the time per placement at 10,000 agents at most twice that at 1,000).

    python bench/plan_scale.py [--passes 5] [--cold-agents 100,1000,10000]
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
    """Median seconds of ``passes`` plans of ``snapshot``, and how many actions one gives."""
    timings = []
    actions = 0
    for _ in range(passes):
        started = time.perf_counter()
        result = plan(snapshot, NOW)
        timings.append(time.perf_counter() - started)
        actions = len(result.actions)
    return statistics.median(timings), actions


def time_cold_pass(agents: int, passes: int) -> tuple[float, int]:
    """Median seconds of the pass that places everything on an empty fleet, and how many
    replicas it places (every action of that pass is a placement)."""
    agent_views, models = fleet(agents)
    return time_passes(Snapshot(Policy(), agent_views, models, ()), passes)


def cold_passes(sizes: list[int], passes: int) -> bool:
    """Print the cold-pass table and its goals; True when every goal passes."""
    print(f"\n{'agents':>7} {'GPUs':>7} {'models':>7} {'placed':>8} {'cold pass s':>12} {'µs/placement':>13}")
    results: dict[int, tuple[float, int]] = {}
    for agents in sizes:
        seconds, placed = time_cold_pass(agents, passes if agents <= 1000 else max(1, passes // 2))
        results[agents] = seconds, placed
        print(f"{agents:>7} {agents * 8:>7} {agents * 2:>7} {placed:>8} {seconds:>12.3f} "
              f"{seconds / max(placed, 1) * 1e6:>13.1f}")
    ok = True
    for agents, goal_s in ((1000, 0.5), (10000, 5.0)):
        if agents in results:
            seconds, placed = results[agents]
            passed = seconds <= goal_s
            ok &= passed
            print(f"cold pass at {agents:,} agents ({placed:,} placements): {seconds:.2f} s "
                  f"(goal ≤ {goal_s:g} s: {'PASS' if passed else 'MISS'})")
    if 1000 in results and 10000 in results:
        per = {a: results[a][0] / max(results[a][1], 1) for a in (1000, 10000)}
        growth = per[10000] / per[1000]
        passed = growth <= 2.0
        ok &= passed
        print(f"time per placement, 10,000 vs 1,000 agents: ×{growth:.2f} "
              f"(goal ≤ ×2, about linear in placements: {'PASS' if passed else 'MISS'})")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--cold-agents", default="100,250,500,1000,2500,10000",
                        help="fleet sizes (agents) for the cold pass, comma-separated")
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
    cold_passes([int(n) for n in args.cold_agents.split(",") if n.strip()], args.passes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
