"""Simulator benchmark: a simulated day of 1,000,000 requests over 200 models on 64 GPUs.

    python bench/simulate_day.py [--requests 1000000] [--models 200] [--seed 1]
                                 [--no-baseline] [--plot PNG] [--json FILE] [--check-hours H]

Builds the diurnal long-tail scenario (``fleet.simulation.scenarios``: 10 head models kept
running with office-hours schedules and load scaling, 20 team models on demand, 170
rarely used on-demand models; fleet 8 × 8 H100-80G), simulates the day with the real
planner, then the same trace on a static fleet sized for each model's peak, and prints:

  time       trace generation; the llmgw run's wall and CPU time, the part spent in plan(),
             passes (planned / skipped as quiet); the baseline's. Goal: the llmgw run
             ≤ 60 s on one core, judged on CPU time (the simulator is single-threaded;
             wall time on a shared machine includes waiting for a core).
  results    the two runs' totals side by side and the comparison sentence the README
             publishes.

``--check-hours H`` re-runs the first H hours with ``check_pruning`` (every pass also
planned on the full snapshot, asserting the shortcuts change nothing) — slow, a
correctness check, not part of the timing. No database, no Django settings needed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fleet.simulation import SimConfig, Simulator, baseline, build_report, compare, parse_fleet, plot  # noqa: E402
from fleet.simulation.scenarios import diurnal_long_tail  # noqa: E402

GOAL_S = 60.0
ROWS = [
    ("requests", "requests"), ("served", "served"), ("held", "held for a cold start"),
    ("hold_p50_s", "  held for, p50 (s)"), ("hold_max_s", "  held for, max (s)"),
    ("rejected_unservable", "rejected: unservable"), ("rejected_timeout", "rejected: cold-start timeout"),
    ("ttft_p50_ms", "TTFT p50 (ms)"), ("ttft_p95_ms", "TTFT p95 (ms)"), ("slo_attainment", "SLO attainment"),
    ("gpu_hours", "GPU-hours"), ("peak_gpus", "peak GPUs held"), ("placements", "placements"),
    ("evictions", "evictions"), ("idle_stops", "idle stops"), ("scale_steps", "scale steps"),
    ("oscillations", "oscillations"),
]


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.4f}" if value < 1 else f"{value:,.1f}"
    return f"{value:,}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--plot", default="simulate-day.png", help="PNG to write ('' for none)")
    parser.add_argument("--json", default="", help="also write both reports and the timings here")
    parser.add_argument("--check-hours", type=float, default=0.0)
    args = parser.parse_args()

    (catalog, spec, trace), gen_wall, _ = timed(lambda: diurnal_long_tail(args.models, args.requests, args.seed))
    fleet = parse_fleet(spec)
    print(f"{trace.description}\nfleet {spec}; trace generated in {gen_wall:.2f} s")

    sim = Simulator(catalog, fleet, trace, SimConfig())
    raw, wall, cpu = timed(sim.run)
    ours = build_report(raw)
    planned = sim.passes - sim.quiet_passes
    verdict = "PASS" if cpu <= GOAL_S else "MISS"
    print(f"llmgw run: {wall:.1f} s wall, {cpu:.1f} s CPU (goal ≤ {GOAL_S:.0f} s: {verdict}); "
          f"plan() {sim.plan_wall_s:.1f} s over {planned:,} planned passes "
          f"(+{sim.quiet_passes:,} skipped as quiet, {sim.pass_models / max(sim.passes, 1):.1f} models per pass)")

    static = None
    if not args.no_baseline:
        static, b_wall, b_cpu = timed(lambda: baseline(catalog, fleet, trace, SimConfig()))
        print(f"baseline run: {b_wall:.1f} s wall, {b_cpu:.1f} s CPU ({static.data['fleet']['summary']})")

    width = max(len(label) for _, label in ROWS)
    print(f"\n{'':{width}}  {'llmgw':>14}" + (f"  {'static, peak':>14}" if static else ""))
    for key, label in ROWS:
        line = f"{label:{width}}  {fmt(ours.totals[key]):>14}"
        if static:
            line += f"  {fmt(static.totals[key]):>14}"
        print(line)
    comparison = compare(ours, static) if static else None
    if comparison:
        print(f"\n{comparison['sentence']}")
    if args.plot:
        print(f"plot: {plot(ours, args.plot, static)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"llmgw": ours.data, "baseline": static.data if static else None, "comparison": comparison,
                       "timing": {"generate_s": gen_wall, "wall_s": wall, "cpu_s": cpu, "plan_s": sim.plan_wall_s,
                                  "passes": sim.passes, "quiet_passes": sim.quiet_passes}}, f, indent=1)
        print(f"json: {args.json}")

    if args.check_hours:
        check = Simulator(catalog, fleet, trace, SimConfig(duration_s=args.check_hours * 3600, check_pruning=True))
        _, c_wall, _ = timed(check.run)
        print(f"check: the first {args.check_hours:g} h, {check.passes:,} passes each also planned on the full "
              f"snapshot, agree ({c_wall:.0f} s)")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
