"""Simulator benchmark: a simulated day of 1,000,000 requests over 200 models on 64 GPUs,
refereed against the policies people run instead (issue 18).

    python bench/simulate_day.py [--requests 1000000] [--models 200] [--seed 1] [--history-weeks 4]
                                 [--policies llmgw,llmgw-reactive,static,ollama,hpa]
                                 [--plot PNG] [--json FILE] [--check-hours H]

Builds the diurnal long-tail scenario (``fleet.simulation.scenarios``: 10 head models kept
running with office-hours schedules and load scaling, 20 team models on demand, 170
rarely used on-demand models; fleet 8 × 8 H100-80G) and the four weeks before it for the
on-demand models (what a running cluster has learned their arrival profiles from; only
llmgw with all rules reads it), then runs the same day through every policy of
``fleet.simulation.referee`` and prints:

  time       each run's CPU time; the llmgw run's wall and CPU time, the part spent in
             plan(), passes (planned / skipped as quiet). Goal: the llmgw run ≤ 60 s of
             CPU (the simulator is single-threaded; wall time on a shared machine includes
             waiting for a core).
  policies   GPU-hours, SLO attainment, TTFT p50/p95, held and rejected requests, scale
             steps and oscillations, peak GPUs, placements and evictions, side by side.
  goals      PASS/MISS for each of issue 18's goals, from this run, and where the SLO
             attainment is lost, by class of model (head, team, long tail): the misses a
             request's own prompt causes (no policy can avoid them: its TTFT exceeds the
             SLO on an idle engine), and the rest.

``--check-hours H`` re-runs the first H hours of llmgw with ``check_pruning`` (every pass
also planned on the full snapshot, asserting the shortcuts change nothing) — slow, a
correctness check, not part of the timing. No database, no Django settings needed.
Exit 0 when every goal passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


from fleet.simulation import SimConfig, Simulator, parse_fleet  # noqa: E402
from fleet.simulation.referee import POLICIES, ROWS, ahead, plot_policies, policy_rows, referee, totals  # noqa: E402
from fleet.simulation.scenarios import diurnal_long_tail, diurnal_long_tail_history  # noqa: E402

CPU_GOAL_S = 60.0
#: GPU-hours at most this share of the static fleet's.
GPU_SHARE_GOAL = 0.25


def fmt(value, kind: str = "") -> str:
    if value is None:
        return "-"
    if kind == "%":
        return f"{value:.2%}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def own_misses(catalog, trace) -> dict[str, int]:
    """Requests per model whose TTFT would exceed the SLO on an idle engine: the prompt's
    prefill alone is too long. No policy avoids them."""
    specs = catalog.by_name()
    out = {}
    for index, name in enumerate(trace.names):
        lat = specs[name].latency
        prompts = trace.prompt_tokens[trace.model == index]
        out[name] = int(((lat.ttft_base_ms + prompts * lat.prefill_ms_per_token) > lat.slo_ttft_ms).sum())
    return out


def misses_by_class(entry, own: dict[str, int]) -> dict[str, dict[str, int]]:
    """Per class of model (the scenario's name prefix), requests, SLO misses, and the
    misses beyond the prompt's own."""
    out: dict[str, dict[str, int]] = {}
    for row in entry.report.data["models"]:
        if not row["requests"]:
            continue
        cls = row["name"].split("-")[0]
        missed = row["requests"] - round((row["slo_attainment"] or 0) * row["requests"])
        acc = out.setdefault(cls, {"requests": 0, "missed": 0, "beyond_prompt": 0, "gpu_hours": 0})
        acc["requests"] += row["requests"]
        acc["missed"] += missed
        acc["beyond_prompt"] += missed - own.get(row["name"], 0)
    for row in entry.report.data["models"]:
        cls = row["name"].split("-")[0]
        if cls in out:
            out[cls]["gpu_hours"] += row["gpu_hours"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--history-weeks", type=int, default=4,
                        help="weeks before the day the on-demand models learn from (0: none, a new cluster)")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--plot", default="simulate-day.png", help="PNG to write ('' for none)")
    parser.add_argument("--json", default="", help="also write every report, the goals and the timings here")
    parser.add_argument("--check-hours", type=float, default=0.0)
    args = parser.parse_args()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if "llmgw" not in policies:
        parser.error("--policies must include llmgw (the goals are about it)")

    began = time.perf_counter()
    catalog, spec, trace = diurnal_long_tail(args.models, args.requests, args.seed)
    history = (diurnal_long_tail_history(args.models, args.requests, args.seed, args.history_weeks)
               if args.history_weeks > 0 else None)
    fleet = parse_fleet(spec)
    print(f"{trace.description}\nfleet {spec}; history: "
          f"{f'{len(history):,} requests over the {args.history_weeks} weeks before' if history else 'none'}; "
          f"generated in {time.perf_counter() - began:.2f} s")

    wall = time.perf_counter()
    entries = referee(catalog, fleet, trace, SimConfig(), history, policies,
                      progress=lambda label: print(f"  running: {label}", flush=True))
    wall = time.perf_counter() - wall
    by_key = {e.key: e for e in entries}
    ours = by_key["llmgw"]
    # The llmgw run once more, alone, for its own timing figures (plan() share, passes).
    sim = Simulator(catalog, fleet, trace, SimConfig(), "llmgw", history=history)
    cpu = time.process_time()
    sim.run()
    cpu = time.process_time() - cpu
    planned = sim.passes - sim.quiet_passes
    print(f"llmgw day: {cpu:.1f} s CPU (goal ≤ {CPU_GOAL_S:.0f} s: {verdict(cpu <= CPU_GOAL_S)}); plan() "
          f"{sim.plan_wall_s:.1f} s over {planned:,} planned passes (+{sim.quiet_passes:,} skipped as quiet); "
          f"every policy: {wall:.0f} s wall (" + ", ".join(f"{e.key} {e.cpu_s:.0f} s CPU" for e in entries) + ")")

    width = max(len(label) for _, label, _ in ROWS)
    print(f"\n{'':{width}}" + "".join(f"  {e.label[:24]:>24}" for e in entries))
    print(f"{'fleet':{width}}" + "".join(f"  {e.report.data['fleet']['summary']:>24}" for e in entries))
    for key, label, kind in ROWS:
        print(f"{label:{width}}" + "".join(f"  {fmt(totals(e)[key], kind):>24}" for e in entries))

    own = own_misses(catalog, trace)
    print("\nSLO misses by class (beyond the prompt's own: prompts too long for the SLO on an idle engine, "
          f"{sum(own.values()):,} in all, which no policy avoids)")
    classes = {e.key: misses_by_class(e, own) for e in entries}
    for cls in ("head", "team", "tail"):
        print(f"  {cls:5}" + "".join(
            f"  {e.key}: {classes[e.key].get(cls, {}).get('beyond_prompt', 0):,} missed, "
            f"{classes[e.key].get(cls, {}).get('gpu_hours', 0):,.0f} GPU-h;" for e in entries))

    t = totals(ours)
    goals = []
    static = by_key.get("static")
    if static is not None:
        s = totals(static)
        goals.append(("SLO attainment ≥ the static fleet's", t["slo_attainment"] >= s["slo_attainment"],
                      f"{t['slo_attainment']:.3%} vs {s['slo_attainment']:.3%}"))
        goals.append((f"GPU-hours ≤ {GPU_SHARE_GOAL:.0%} of the static fleet's",
                      t["gpu_hours"] <= GPU_SHARE_GOAL * s["gpu_hours"],
                      f"{t['gpu_hours']:,.0f} ≤ {GPU_SHARE_GOAL * s['gpu_hours']:,.0f}"))
    goals.append(("0 oscillations", t["oscillations"] == 0, f"{t['oscillations']}"))
    comparisons = {}
    for key in ("ollama", "hpa"):
        if key in by_key:
            cmp = ahead(ours, by_key[key])
            comparisons[key] = cmp
            goals.append((f"ahead of {by_key[key].label} on both axes", cmp["ahead_on_both"],
                          f"GPU-hours × {cmp['gpu_hours_ratio']:.3f}, SLO {cmp['slo_points']:+.3f} points"))
    goals.append((f"the llmgw day in ≤ {CPU_GOAL_S:.0f} s of CPU", cpu <= CPU_GOAL_S, f"{cpu:.1f} s"))
    print("\ngoals (issue 18)")
    for name, ok, figures in goals:
        print(f"  {verdict(ok)}  {name}: {figures}")
    if static is not None and "tail" in classes["llmgw"]:
        tail, tail_static = classes["llmgw"]["tail"], classes["static"].get("tail", {})
        sessions = int(ours.report.data["totals"]["held"])
        print(f"  where the SLO goes: the long tail's {tail['requests']:,} requests lose {tail['beyond_prompt']:,} "
              f"to cold starts (sessions that begin on a cold model; {sessions:,} requests held in all); the static "
              f"fleet avoids them by keeping every tail model warm all day: {tail_static.get('gpu_hours', 0):,.0f} "
              "GPU-hours for the tail alone")

    if args.plot:
        print(f"plot: {plot_policies(entries, args.plot)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"policies": policy_rows(entries), "reports": {e.key: e.report.data for e in entries},
                       "goals": [{"goal": n, "pass": ok, "figures": fig} for n, ok, fig in goals],
                       "comparisons": comparisons, "misses_by_class": classes,
                       "timing": {"llmgw_cpu_s": cpu, "plan_s": sim.plan_wall_s, "passes": sim.passes,
                                  "quiet_passes": sim.quiet_passes, "all_wall_s": wall,
                                  "cpu_s": {e.key: e.cpu_s for e in entries}}}, f, indent=1)
        print(f"json: {args.json}")
    if args.check_hours:
        check = Simulator(catalog, fleet, trace, SimConfig(duration_s=args.check_hours * 3600, check_pruning=True),
                          history=history)
        c_wall = time.perf_counter()
        check.run()
        print(f"check: the first {args.check_hours:g} h, {check.passes:,} passes each also planned on the full "
              f"snapshot, agree ({time.perf_counter() - c_wall:.0f} s)")
    return 0 if all(ok for _, ok, _ in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
