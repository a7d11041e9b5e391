"""The fleet simulator: the real planner on a simulated clock, traces, catalogs, the CLI.

Passes run every 3 s on a grid (0, 3, 6, …) plus when a request wants a cold model, as the
reconciler runs them. Most simulations here run with ``check_pruning``: every pass is also
planned on the full snapshot and must agree with the simulator's shortcuts.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
from datetime import UTC, datetime, time, timedelta

import numpy as np
import pytest
from django.core.management import call_command

from catalog.schedules import Window
from fleet.simulation import traces
from fleet.simulation import (
    Catalog,
    ClusterSpec,
    LatencyModel,
    ModelSpec,
    SimConfig,
    baseline,
    catalog_from_dict,
    compare,
    parse_fleet,
    peak_counts,
    plot,
    Simulator,
    build_report,
    read_catalog,
    simulate,
)
from fleet.simulation.catalog import CLUSTER_DEFAULTS, catalog_to_dict, grow_fleet
from fleet.simulation.scenarios import diurnal_long_tail

CHECKED = SimConfig(check_pruning=True)
#: One second of service per request: 100 ms to the first token, then 100 tokens at 9 ms.
ONE_SECOND = dict(ttft_base_ms=100, prefill_ms_per_token=0, tpot_ms=9)


def steps_of(report, model=None):
    return [(s["t_s"], s["from"], s["to"]) for s in report.data["scale_steps"] if model in (None, s["model"])]


def accounted(totals):
    """Every request in the trace ends one way: served, rejected, cut off, unfinished at
    the end, for a model not in the catalog, or arriving after the simulated end."""
    return (totals["served"] + totals["rejected_unservable"] + totals["rejected_timeout"] + totals["cut_off"]
            + totals["unfinished"] + totals["unknown_model"] + totals["after_end"])


# --- Load scaling ----------------------------------------------------------------------------


def test_a_model_busier_than_one_replica_scales_up_when_the_rules_say_and_back_down_after_the_quiet_spell():
    # 6 requests/s of 1 s each on replicas of 4 measured slots: from the first second on more
    # are in flight than 4 × 1 and some wait. The agent reads the engine's metrics every 5 s
    # (at 0 s, as the replica is ready: nothing yet; at 5 s: the queue), so the pass at 6 s
    # is the first to see it (busy since 6 s); busy for scale-up-after (30 s) → 1 → 2 at
    # 36 s. Traffic stops at 240 s; the read at 240 s still shows 5 running (over 70% of
    # 4 × 1: not quiet), the one at 245 s nothing: the pass at 246 s finds it quiet, for
    # scale-down-after (300 s) → 2 → 1 at 546 s.
    catalog = Catalog((ModelSpec("m", min_replicas=1, max_replicas=2, cold_start_s=20,
                                 latency=LatencyModel(slots=4, measured=True, **ONE_SECOND)),))
    trace = traces.constant_rate("m", 6, 0, 240)
    report = simulate(catalog, parse_fleet("1x2x80G"), trace, SimConfig(duration_s=900, check_pruning=True))

    assert steps_of(report) == [(36.0, 1, 2), (546.0, 2, 1)]
    assert report.data["scale_steps"][0]["why"].startswith("scale up:")
    assert report.data["scale_steps"][1]["why"].startswith("scale down: quiet for 5 min")
    assert report.totals["oscillations"] == 0
    assert report.replica_timelines["m"] == [(0.0, 0), (0.0, 1), (36.0, 2), (546.0, 1)]
    assert report.totals["served"] == len(trace) and accounted(report.totals) == len(trace)
    # Two GPUs from 36 s until the drained replica stopped (546 s + one pass + 5 s), one otherwise.
    assert report.totals["gpu_hours"] == pytest.approx((900 + (549 + 5 - 36)) / 3600, abs=1e-3)


def test_scale_steps_wait_for_a_starting_replica_and_stop_at_the_ceiling():
    catalog = Catalog((ModelSpec("m", min_replicas=1, max_replicas=3, cold_start_s=100,
                                 latency=LatencyModel(slots=2, measured=True, **ONE_SECOND)),))
    trace = traces.constant_rate("m", 20, 0, 600)
    report = simulate(catalog, parse_fleet("1x4x80G"), trace, SimConfig(duration_s=600, check_pruning=True))

    ups = steps_of(report)
    assert [(a, b) for _, a, b in ups] == [(1, 2), (2, 3)]
    # The second step waits for the first replica to become ready (36 + 100 s), then 30 s
    # of being busy counted from the first step's restart of the timer has long passed.
    assert ups[0][0] == 36.0 and ups[1][0] >= 136.0


def test_without_a_benchmark_a_steady_load_between_one_and_two_replicas_does_not_flap():
    # 6 requests/s of 1 s on replicas of 4 slots (not benchmarked): one replica queues, so
    # the rules add a second and learn from the queue that a replica runs 4. Nothing waits
    # on two, but 6 running would not fit in one replica at 70% of 4: it is not quiet, and
    # the second replica stays until the traffic stops (at 1,200 s), then goes after 5 min.
    # Before the learned capacity, "quiet" meant only "nothing waiting": 1 → 2 → 1 → 2 …
    catalog = Catalog((ModelSpec("m", min_replicas=1, max_replicas=2, cold_start_s=10,
                                 latency=LatencyModel(slots=4, **ONE_SECOND)),))
    trace = traces.constant_rate("m", 6, 0, 1200)
    report = simulate(catalog, parse_fleet("1x2x80G"), trace, SimConfig(duration_s=1800, check_pruning=True))

    steps = steps_of(report)
    assert [(a, b) for _, a, b in steps] == [(1, 2), (2, 1)]
    assert steps[1][0] >= 1200 + 300
    assert "4 seen at saturation at 70%" in report.data["scale_steps"][1]["why"]
    assert report.totals["oscillations"] == 0
    assert report.totals["served"] == len(trace)


def test_a_steady_queue_scales_up_only_when_heartbeats_carry_the_load():
    """The report path (fleet.simulation.loads): 6 requests of ~15 min on 4 slots, so 4 run
    and 2 wait, unchanged. Agents that report loads only when they change (before issue 14)
    send it once (read at 5 s); it is stale 15 s later and unknown from then on: never busy
    for 30 s, never scaled. With loads on every heartbeat the pass at 6 s sees the queue and
    30 s later adds a replica; the planner reading engines directly would see it at 3 s."""
    catalog = Catalog((ModelSpec("m", min_replicas=1, max_replicas=2, cold_start_s=20,
                                 latency=LatencyModel(slots=4, **ONE_SECOND)),))
    trace = traces.from_rows([(0.1 * i, "m", 10, 100_000) for i in range(1, 7)])

    def steps(load_reports):
        config = SimConfig(duration_s=300, check_pruning=True, load_reports=load_reports)
        return steps_of(simulate(catalog, parse_fleet("1x2x80G"), trace, config))

    assert steps("heartbeat") == [(36.0, 1, 2)]
    assert steps("on_change") == []
    assert steps("instant") == [(33.0, 1, 2)]


def test_a_quiet_model_scales_down_only_when_heartbeats_carry_the_load():
    """A burst that scales up (its queue changes at every read, so either kind of agent
    reports it), then silence: the last change (nothing running) is reported once; on
    heartbeats it stays known and the model scales down after scale-down-after, reported
    only on change it goes stale and the extra replica is kept for ever."""
    catalog = Catalog((ModelSpec("m", min_replicas=1, max_replicas=2, cold_start_s=20,
                                 latency=LatencyModel(slots=4, **ONE_SECOND)),))
    trace = traces.constant_rate("m", 6, 0, 120)

    def steps(load_reports):
        config = SimConfig(duration_s=1200, check_pruning=True, load_reports=load_reports)
        report = simulate(catalog, parse_fleet("1x2x80G"), trace, config)
        assert report.totals["served"] == len(trace)
        return [(a, b) for _, a, b in steps_of(report)]

    assert steps("heartbeat") == [(1, 2), (2, 1)]
    assert steps("on_change") == [(1, 2)]


def test_an_engine_without_metrics_is_known_from_the_gateways_fresh_in_flight_reports():
    """Without engine metrics the gateway's in-flight counts stand in, flushed every
    second: fresh, so a model kept busy scales up (on any kind of agent). A gateway that
    flushed less often than its reports stay fresh would leave the load unknown between
    flushes, resetting the busy timer: never scaled."""
    catalog = Catalog((ModelSpec("m", min_replicas=1, max_replicas=2, cold_start_s=20, engine_metrics=False,
                                 latency=LatencyModel(slots=4, measured=True, **ONE_SECOND)),))
    trace = traces.from_rows([(0.1 * i, "m", 10, 100_000) for i in range(1, 7)])
    for load_reports in ("heartbeat", "on_change"):
        config = SimConfig(duration_s=300, check_pruning=True, load_reports=load_reports)
        assert [(a, b) for _, a, b in steps_of(simulate(catalog, parse_fleet("1x2x80G"), trace, config))] == [(1, 2)]
    config = SimConfig(duration_s=300, check_pruning=True, usage_flush_interval_s=20, usage_report_fresh_s=10)
    assert steps_of(simulate(catalog, parse_fleet("1x2x80G"), trace, config)) == []


def test_the_report_path_defaults_are_the_clusters():
    import llmgw.settings as project
    from fleet.agent.client import ClientOptions
    from fleet.agent.engines import AgentConfig

    config = SimConfig()
    assert (config.load_stale_s, config.usage_flush_interval_s, config.usage_report_fresh_s) == (
        project.LLMGW_LOAD_STALE_S, project.LLMGW_USAGE_FLUSH_INTERVAL_S, project.LLMGW_USAGE_REPORT_FRESH_S)
    assert (config.heartbeat_s, config.load_poll_s, config.load_reports) == (
        ClientOptions.__dataclass_fields__["heartbeat_s"].default,
        AgentConfig.__dataclass_fields__["load_poll_s"].default, "heartbeat")


def test_an_unknown_report_path_is_refused():
    catalog = Catalog((ModelSpec("m", latency=LatencyModel(**ONE_SECOND)),))
    with pytest.raises(ValueError, match="load_reports"):
        simulate(catalog, parse_fleet("1x1x80G"), traces.from_rows([(0, "m", 1, 1)]), SimConfig(load_reports="often"))


# --- On demand, eviction -------------------------------------------------------------------------


def on_demand_catalog(names, **kw):
    kw.setdefault("cold_start_s", 30)
    kw.setdefault("idle_timeout_s", 3600)
    return Catalog(tuple(ModelSpec(n, on_demand=True, max_replicas=1, latency=LatencyModel(**ONE_SECOND), **kw)
                         for n in names))


def test_many_rarely_used_on_demand_models_on_few_gpus_serve_every_request_and_evict_the_least_recently_used():
    # Four GPUs, six models, idle timeouts too long to matter: only eviction frees a GPU.
    # a, b, c, d fill the GPUs; a is used again at 400 s. e at 600 s needs room: b is the
    # least recently used, then c, then d; a, used last, is spared.
    catalog = on_demand_catalog("abcdef")
    trace = traces.from_rows([(0, "a", 10, 100), (100, "b", 10, 100), (200, "c", 10, 100), (300, "d", 10, 100),
                              (400, "a", 10, 100), (600, "e", 10, 100), (610, "e", 10, 100),
                              (900, "f", 10, 100), (1000, "a", 10, 100)])
    report = simulate(catalog, parse_fleet("1x4x80G"), trace, SimConfig(duration_s=1800, check_pruning=True))

    totals = report.totals
    assert totals["served"] == len(trace) == accounted(totals)
    assert totals["rejected_unservable"] == totals["rejected_timeout"] == 0
    assert totals["held"] == 7  # every request but a's at 400 s and 1000 s found its model cold
    evictions = [e for e in report.data["evictions_and_idle_stops"] if e["kind"] == "eviction"]
    victims = [e["model"] for e in evictions]
    # One eviction per placement, least recently used first: b for e, then c for f.
    assert victims == ["b", "c"]
    assert [e["reason"].rsplit(" ", 1)[-1] for e in evictions] == ["e", "f"]
    assert report.model("e")["hold_max_s"] < 60  # evict, drain, stop, place, 30 s cold start


def test_one_eviction_per_placement_and_no_503_while_the_victim_stops():
    catalog = on_demand_catalog("abcde")
    trace = traces.from_rows([(0, "a", 10, 100), (100, "b", 10, 100), (150, "a", 10, 100),
                              (300, "c", 10, 100), (310, "c", 10, 100), (500, "d", 10, 100),
                              (700, "e", 10, 100), (705, "a", 10, 100)])
    report = simulate(catalog, parse_fleet("1x2x80G"), trace, SimConfig(duration_s=1200, check_pruning=True))

    evictions = [e["model"] for e in report.data["evictions_and_idle_stops"] if e["kind"] == "eviction"]
    assert report.totals["served"] == len(trace)
    assert evictions == ["b", "a", "c", "d"]


def test_an_on_demand_model_is_scaled_to_zero_after_its_idle_timeout():
    catalog = on_demand_catalog("a", idle_timeout_s=120)
    trace = traces.from_rows([(0, "a", 10, 100), (60, "a", 10, 100)])
    report = simulate(catalog, parse_fleet("1x1x80G"), trace, SimConfig(duration_s=600, check_pruning=True))

    idle = [e for e in report.data["evictions_and_idle_stops"] if e["kind"] == "idle"]
    assert len(idle) == 1 and idle[0]["model"] == "a"
    # Demand is kept alive by use: the timeout counts from the last request (61 s), so the
    # first pass past 181 s drains it.
    assert idle[0]["t_s"] == 183.0


def test_a_held_request_is_answered_503_after_the_cold_start_timeout():
    catalog = on_demand_catalog(["slow"], cold_start_s=400)
    trace = traces.from_rows([(0, "slow", 10, 100), (350, "slow", 10, 100)])
    report = simulate(catalog, parse_fleet("1x1x80G"), trace, SimConfig(duration_s=900, check_pruning=True))

    assert report.totals["rejected_timeout"] == 1  # waited 300 s; the second got its replica at 400 s
    assert report.totals["served"] == 1 and report.totals["held"] == 2


def test_a_model_that_fits_on_no_agent_is_rejected_with_the_planners_reason():
    catalog = Catalog((ModelSpec("huge", gpus_needed=4, on_demand=True, latency=LatencyModel(**ONE_SECOND)),))
    trace = traces.from_rows([(1, "huge", 10, 100), (2, "huge", 10, 100)])
    report = simulate(catalog, parse_fleet("2x2x80G"), trace, CHECKED)

    assert report.totals["rejected_unservable"] == 2 and report.totals["served"] == 0


def test_requests_for_models_not_in_the_catalog_are_counted_apart():
    catalog = on_demand_catalog("a")
    report = simulate(catalog, parse_fleet("1x1x80G"), traces.from_rows([(0, "nope", 1, 1), (1, "a", 1, 1)]))
    assert report.totals["unknown_model"] == 1 and report.totals["requests"] == 1


def test_a_schedule_window_raises_the_floor_while_it_is_open():
    window = Window((0,), time(0, 10), time(0, 20), 3, None, 1)  # Mondays 00:10–00:20 UTC
    catalog = Catalog((ModelSpec("m", min_replicas=1, max_replicas=3, windows=(window,), cold_start_s=30,
                                 latency=LatencyModel(**ONE_SECOND)),))
    trace = traces.constant_rate("m", 0.1, 0, 1800)
    report = simulate(catalog, parse_fleet("1x4x80G"), trace,
                      SimConfig(duration_s=1800, check_pruning=True, prewarm_windows=False))

    assert report.replica_timelines["m"] == [(0.0, 0), (0.0, 1), (600.0, 2), (600.0, 3), (1200.0, 2), (1200.0, 1)]


def test_with_pre_warm_a_windows_replicas_are_placed_a_cold_start_and_margin_ahead_and_ready_at_its_start():
    """R11: a 30 s cold start plus the 20 s minimum margin is a 50 s lead, so the window
    opening at 600 s is placed at the first pass on the 3 s grid from 550 s, ready at 582 s;
    it still closes at its end."""
    window = Window((0,), time(0, 10), time(0, 20), 3, None, 1)
    catalog = Catalog((ModelSpec("m", min_replicas=1, max_replicas=3, windows=(window,), cold_start_s=30,
                                 latency=LatencyModel(**ONE_SECOND)),))
    sim = Simulator(catalog, parse_fleet("1x4x80G"), traces.constant_rate("m", 0.1, 0, 1800),
                    SimConfig(duration_s=1800, check_pruning=True))
    report = build_report(sim.run())

    assert report.replica_timelines["m"] == [(0.0, 0), (0.0, 1), (552.0, 2), (552.0, 3), (1200.0, 2), (1200.0, 1)]


def test_the_shortcuts_agree_with_the_full_planner_on_a_crowded_mixed_fleet():
    window = Window((0,), time(0, 15), time(0, 45), 2, 3, 1)
    specs = [ModelSpec("big", min_replicas=1, max_replicas=3, windows=(window,), cold_start_s=40,
                       latency=LatencyModel(slots=4, measured=True, **ONE_SECOND))]
    specs += [ModelSpec(f"od-{i}", on_demand=True, idle_timeout_s=120 + 60 * i, cold_start_s=20,
                        latency=LatencyModel(**ONE_SECOND)) for i in range(8)]
    rare = traces.long_tail([s.name for s in specs[1:]], seed=3, sessions_per_day=200, days=1 / 24, night=1.0)
    trace = traces.merge(traces.constant_rate("big", 6, 0, 2400), rare)
    report = simulate(Catalog(tuple(specs)), parse_fleet("1x6x80G"), trace,
                      SimConfig(duration_s=3600, check_pruning=True))  # raises on any disagreement

    totals = report.totals
    assert totals["evictions"] > 0 and totals["scale_steps"] > 0 and totals["idle_stops"] > 0
    assert accounted(totals) == len(trace)


# --- Determinism, baseline ---------------------------------------------------------------------


def small_day(seed: int):
    """The morning (to 10:00) of the long-tail scenario, shrunk: 30 models, 6,000 requests."""
    catalog, _, trace = diurnal_long_tail(models=30, requests=6000, seed=seed, head=3, team=6)
    return simulate(catalog, parse_fleet("1x8xH100-80G"), trace, SimConfig(duration_s=10 * 3600))


def test_the_same_trace_and_seed_give_the_same_report():
    first, again, other = small_day(7), small_day(7), small_day(8)

    assert json.dumps(first.data, sort_keys=True) == json.dumps(again.data, sort_keys=True)
    assert first.gpu_timeline == again.gpu_timeline
    assert json.dumps(first.data, sort_keys=True) != json.dumps(other.data, sort_keys=True)


def test_trace_generators_are_deterministic_for_a_seed():
    names = [f"m{i}" for i in range(5)]
    for make in (lambda s: traces.diurnal(names, 500, seed=s), lambda s: traces.long_tail(names, seed=s),
                 lambda s: traces.bursts(names, seed=s, count=3, size=20)):
        a, b, c = make(1), make(1), make(2)
        assert np.array_equal(a.t_s, b.t_s) and np.array_equal(a.model, b.model)
        assert not np.array_equal(a.t_s, c.t_s)
        assert np.all(np.diff(a.t_s) >= 0)


def test_the_baseline_runs_every_model_at_its_peak_count_on_a_fleet_grown_to_hold_them():
    catalog = on_demand_catalog("abcde")
    trace = traces.merge(traces.constant_rate("a", 30, 0, 600),
                         traces.from_rows([(10, "b", 10, 100), (20, "c", 10, 100)]))
    counts = peak_counts(catalog, trace)
    # a: 30/s × 1 s = 30 in flight at its peak, over 70% of 8 slots → 6 replicas; others 1.
    assert counts == {"a": 6, "b": 1, "c": 1, "d": 1, "e": 1}
    assert sum(a.gpus for a in grow_fleet(parse_fleet("1x2x80G"), catalog.models, counts)) == 10

    ours = simulate(catalog, parse_fleet("1x2x80G"), trace, SimConfig(duration_s=3600))
    static = baseline(catalog, parse_fleet("1x2x80G"), trace, SimConfig(duration_s=3600))
    assert static.data["fleet"]["gpus"] == 10 and static.totals["held"] == 0
    assert static.totals["gpu_hours"] == pytest.approx(10.0)
    result = compare(ours, static)
    assert result["gpu_hours_saved"] > 0.5
    assert "fewer GPU-hours" in result["sentence"]


def test_compare_says_same_attainment_when_within_half_a_point():
    from fleet.simulation import Report

    def fake(gpu_hours, slo):
        return Report({"label": "x", "fleet": {"summary": "s"}, "totals": {"gpu_hours": gpu_hours,
                                                                           "slo_attainment": slo}})

    assert "same SLO attainment (99.0% vs 99.2%) with 40% fewer GPU-hours" in compare(fake(60, 0.990), fake(100, 0.992))["sentence"]
    assert "25% more GPU-hours (125 vs 100) for 5.0 points higher" in compare(fake(125, 0.99), fake(100, 0.94))["sentence"]


# --- Files: traces, catalogs, fleets ----------------------------------------------------------


@pytest.mark.parametrize("name", ["t.jsonl", "t.csv", "t.jsonl.gz", "t.csv.gz"])
def test_traces_round_trip_through_files(tmp_path, name):
    start = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    trace = traces.diurnal(["x", "y, with a comma", 'z "quoted"'], 300, seed=4, start=start, days=0.1)
    back = traces.read_trace(traces.write_trace(trace, tmp_path / name))
    assert back.start == start and back.names == trace.names
    assert np.allclose(back.t_s, trace.t_s, atol=1e-6)
    assert np.array_equal(back.model, trace.model) and np.array_equal(back.output_tokens, trace.output_tokens)


def test_a_trace_file_is_sorted_on_reading_and_a_bad_row_is_named(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("t_s,model,prompt_tokens,output_tokens\n5,b,1,2\n1,a,3,4\n")
    trace = traces.read_trace(path)
    assert list(trace.rows()) == [(1.0, "a", 3, 4), (5.0, "b", 1, 2)]
    path.write_text("t_s,model,prompt_tokens,output_tokens\n1,a,x,4\n")
    with pytest.raises(ValueError, match="request 1"):
        traces.read_trace(path)


def test_usage_records_replay_from_their_arrival_with_missing_tokens_filled_in(tmp_path):
    path = tmp_path / "usage.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["at", "model_name", "prompt_tokens", "completion_tokens", "total_ms", "status"])
        writer.writerow(["2026-11-30T09:00:02+00:00", "m", 100, 50, 2000, 200])  # arrived 09:00:00
        writer.writerow(["2026-11-30T09:00:10+00:00", "m", 300, 70, 1000, 200])
        writer.writerow(["2026-11-30T09:00:20+00:00", "m", "", "", 5, 503])  # answered 503: no tokens
    trace = traces.read_trace(path)
    assert trace.start == datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
    assert list(trace.rows()) == [(0.0, "m", 100, 50), (9.0, "m", 300, 70), (19.995, "m", 200, 60)]


def test_fleet_specs():
    fleet = parse_fleet("8x8xH100-80G")
    assert len(fleet) == 8 and {a.gpus for a in fleet} == {8} and fleet[0].gpu_memory_mib == 81920
    mixed = parse_fleet("2x4x48G+1xcpu16-64G")
    assert [(a.gpus, a.gpu_memory_mib, a.cpu_cores) for a in mixed] == [(4, 49152, 0), (4, 49152, 0), (0, 0, 16)]
    assert len({a.name for a in parse_fleet("2x8xH100-80G+2x8xA100-40G")}) == 4
    with pytest.raises(ValueError, match="8x8xH100-80G"):
        parse_fleet("eight big ones")


CATALOG = {
    "cluster": {"time_zone": "Europe/Istanbul", "scale_up_after_s": 20},
    "fleet": "1x8xH100-80G",
    "models": [
        {"name": "chat", "gpus_needed": 2, "gpu_memory_mib": 81920, "min": 1, "max": 4, "cold_start_s": 90,
         "windows": [{"weekdays": "mon-fri", "start": "09:00", "end": "18:00", "min": 2}],
         "benchmark": {"max_concurrency": 12, "slo_ttft_p95_ms": 800, "slo_tpot_p95_ms": 40}},
        {"name": "rare", "on_demand": True, "idle_timeout_s": 300, "latency": {"slots": 4, "tpot_ms": 20}},
    ],
}


@pytest.mark.parametrize("name", ["c.json", "c.yaml"])
def test_a_catalog_file_in_json_or_yaml(tmp_path, name):
    """JSON always; YAML needs PyYAML (optional): only the YAML case is skipped without it."""
    if name.endswith(".yaml"):
        yaml = pytest.importorskip("yaml")
        (tmp_path / name).write_text(yaml.safe_dump(CATALOG))
    else:
        (tmp_path / name).write_text(json.dumps(CATALOG))
    catalog = read_catalog(tmp_path / name)
    chat, rare = catalog.models
    assert catalog.cluster.time_zone == "Europe/Istanbul" and catalog.cluster.scale_up_after_s == 20
    assert len(catalog.fleet) == 1
    assert (chat.gpus_needed, chat.min_replicas, chat.max_replicas, chat.cold_start_s) == (2, 1, 4, 90)
    assert chat.windows[0].start == time(9, 0) and chat.windows[0].weekdays == (0, 1, 2, 3, 4)
    assert (chat.latency.slots, chat.latency.measured, chat.latency.tpot_ms) == (12, True, 40)
    assert (rare.on_demand, rare.latency.slots, rare.latency.measured) == (True, 4, False)
    again = catalog_from_dict(catalog_to_dict(catalog))
    assert again.models == catalog.models


def test_a_catalog_with_a_typo_is_refused_by_name():
    with pytest.raises(ValueError, match="on_demnd"):
        catalog_from_dict([{"name": "m", "on_demnd": True}])
    with pytest.raises(ValueError, match="max .* below min"):
        catalog_from_dict([{"name": "m", "min": 3, "max": 1}])


def test_the_simulated_cluster_defaults_are_the_cluster_settings_defaults():
    from catalog.models import ClusterSettings

    for name, value in CLUSTER_DEFAULTS.items():
        assert ClusterSettings._meta.get_field(name).default == value
    assert ClusterSpec().default_idle_timeout_s == CLUSTER_DEFAULTS["default_idle_timeout_s"]


def test_the_plot_is_a_png(tmp_path):
    catalog = on_demand_catalog("ab")
    trace = traces.from_rows([(0, "a", 1, 1), (50, "b", 1, 1)])
    ours = simulate(catalog, parse_fleet("1x2x80G"), trace)
    path = plot(ours, tmp_path / "p.png", baseline(catalog, parse_fleet("1x2x80G"), trace))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


#: A JSONL trace's first lines: its start, one good request.
START_LINE = '{"trace": 1, "start": "2026-11-30T00:00:00+00:00"}\n'
GOOD_ROW = '{"t_s": 0, "model": "chat", "prompt_tokens": 10, "output_tokens": 1}\n'


@pytest.mark.parametrize("name", ["t.csv", "t.jsonl.gz"])
def test_a_trace_file_that_is_not_utf8_is_refused_naming_the_line(tmp_path, name):
    body = (b"t_s,model,prompt_tokens,output_tokens\n0,a,1,1\n1,b\xffc,1,1\n" if name == "t.csv" else
            START_LINE.encode() + GOOD_ROW.encode() + b'{"t_s": 1, "model": "b\xff", "prompt_tokens": 1, '
            b'"output_tokens": 1}\n')
    path = tmp_path / name
    path.write_bytes(gzip.compress(body) if name.endswith(".gz") else body)
    with pytest.raises(ValueError, match=rf"{name}:3: not UTF-8 text \(invalid start byte: b'\\xff'\)"):
        traces.read_trace(path)


def test_a_gzip_trace_cut_short_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(b"t_s,model,prompt_tokens,output_tokens\n0,a,1,1\n")[:-9])  # no trailer
    with pytest.raises(ValueError, match="t.csv.gz: not a whole gzip file"):
        traces.read_trace(path)


@pytest.mark.parametrize(("fields", "error"), [
    ('"prompt_tokens": 99999999999, "output_tokens": 1', "prompt_tokens (99,999,999,999) must be between 0 and "
                                                          "2,147,483,647"),
    ('"prompt_tokens": 10, "output_tokens": 2147483648', "output_tokens (2,147,483,648) must be between 0 and "
                                                         "2,147,483,647"),
    ('"prompt_tokens": -1, "output_tokens": 1', "prompt_tokens (-1) must be between 0 and 2,147,483,647"),
    ('"prompt_tokens": Infinity, "output_tokens": 1', "prompt_tokens must be a whole number, not inf"),
])
def test_a_jsonl_trace_with_a_token_count_out_of_range_is_refused_naming_the_line(tmp_path, fields, error):
    path = tmp_path / "t.jsonl"
    path.write_text(START_LINE + GOOD_ROW + f'{{"t_s": 1, "model": "chat", {fields}}}\n')
    with pytest.raises(ValueError, match=f"^{re.escape(f'{path}:3: request 2: {error}')}") as info:
        traces.read_trace(path)
    assert "\n" not in str(info.value)


def test_a_csv_trace_with_a_count_out_of_range_or_a_bad_time_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "t.csv"
    header = "t_s,model,prompt_tokens,output_tokens\n0,a,10,1\n"
    path.write_text(header + "1,a,99999999999,1\n")
    with pytest.raises(ValueError, match=r"t.csv:3: request 2: prompt_tokens \(99,999,999,999\) must be between "
                                         r"0 and 2,147,483,647$"):
        traces.read_trace(path)
    path.write_text(header + "-5,a,10,1\n")
    with pytest.raises(ValueError, match=r"t.csv:3: request 2: t_s \(-5\) must be between 0 and 31,622,400 seconds \(the simulator replays a year at most\)$"):
        traces.read_trace(path)
    path.write_text(header + "inf,a,10,1\n")
    with pytest.raises(ValueError, match=r"t.csv:3: request 2: t_s \(inf\) must be between 0 and 31,622,400 seconds"):
        traces.read_trace(path)


def test_a_usage_record_with_a_token_count_out_of_range_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "u.csv"
    path.write_text("at,model,prompt_tokens,completion_tokens\n2026-11-30T00:00:00Z,a,1,1\n"
                    "2026-11-30T00:00:01Z,a,1,99999999999\n")
    with pytest.raises(ValueError, match=r"u.csv:3: record 2: completion_tokens \(99,999,999,999\) must be "
                                         r"between 0 and 2,147,483,647$"):
        traces.read_trace(path)


def test_a_trace_built_with_a_token_count_out_of_range_is_refused():
    with pytest.raises(ValueError, match="token counts must be between 0 and 2,147,483,647"):
        traces.from_rows([(0, "a", 99999999999, 1)])
    with pytest.raises(ValueError, match="token counts must be >= 0"):
        traces.from_rows([(0, "a", -1, 1)])


@pytest.mark.parametrize(("body", "error"), [
    ("t_s,model,prompt_tokens,output_tokens\n0,a,10,1\n1,a,10,1,extra\n",
     "t.csv:3: request 2: 1 more field than the header's 4 columns (t_s,model,prompt_tokens,output_tokens)"),
    ("# start=2026-11-30T00:00:00+00:00\nt_s,model,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n"
     "0,a,10,1,p,4,x,y\n",
     "t.csv:3: request 1: 2 more fields than the header's 6 columns"),
    ("at,model,prompt_tokens,completion_tokens\n2026-11-30T00:00:00Z,a,1,1,9\n",
     "t.csv:2: record 1: 1 more field than the header's 4 columns"),
])
def test_a_csv_row_with_more_fields_than_the_header_is_refused_naming_the_line(tmp_path, body, error):
    path = tmp_path / "t.csv"
    path.write_text(body)
    with pytest.raises(ValueError, match=re.escape(error)) as info:
        traces.read_trace(path)
    assert "\n" not in str(info.value)


# --- The command ------------------------------------------------------------------------------------


def test_llmgw_simulate_reports_a_table_for_people_and_json_for_scripts(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps(CATALOG))
    trace = traces.merge(traces.constant_rate("chat", 2, 0, 600), traces.from_rows([(30, "rare", 10, 10)]))
    traces.write_trace(trace, tmp_path / "t.jsonl")
    args = ["llmgw", "simulate", "--trace", str(tmp_path / "t.jsonl"), "--catalog", str(tmp_path / "c.json"),
            "--plot", str(tmp_path / "p.png"), "--duration", "1200"]
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=out)
    text = out.getvalue()
    assert "SLO attainment" in text and "GPU-hours" in text and "static fleet sized for the peak" in text
    assert f"plot: {tmp_path / 'p.png'}" in text and (tmp_path / "p.png").exists()

    out = io.StringIO()
    call_command(*args, "--json", "--no-plot", "--baseline", "2", stdout=out)
    data = json.loads(out.getvalue())
    assert data["llmgw"]["totals"]["requests"] == len(trace)
    assert data["baseline"]["label"] == "static fleet of 2 per model"
    assert data["comparison"]["sentence"].startswith("llmgw vs static fleet of 2 per model")
    assert data["plot"] is None


def test_llmgw_simulate_without_a_catalog_says_what_is_missing():
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_info:
        call_command("llmgw", "simulate", "--trace", "x.jsonl", stdout=io.StringIO(), stderr=err)
    assert exit_info.value.code == 2 and "--catalog FILE or --from-db" in err.getvalue()


@pytest.mark.django_db
def test_llmgw_simulate_from_the_database_replays_its_usage_records(make_model, tmp_path):
    from catalog.models import Benchmark, ScheduleWindow
    from fleet.simulation import catalog_from_db
    from gateway.models import UsageRecord

    pinned = make_model("pinned", min_replicas=1, max_replicas=2)
    make_model("lazy", min_replicas=0, max_replicas=1, on_demand=True, idle_timeout_s=120)
    Benchmark.objects.create(model=pinned, profile=pinned.profile, max_concurrency=6, slo_ttft_p95_ms=700)
    ScheduleWindow.objects.create(model=pinned, weekdays="daily", start=time(9), end=time(17), min_replicas=2)
    catalog = catalog_from_db()
    by_name = catalog.by_name()
    assert by_name["pinned"].latency.slots == 6 and by_name["pinned"].latency.slo_ttft_ms == 700
    assert len(by_name["pinned"].windows) == 1 and by_name["lazy"].on_demand
    assert by_name["pinned"].gpus_needed == 0 and by_name["pinned"].cpu_cores == 1

    now = datetime.now(UTC)
    for i, name in enumerate(["pinned", "lazy", "pinned"]):
        UsageRecord.objects.create(at=now - timedelta(minutes=10 - i), model_name=name, path="chat/completions",
                                   status=200, prompt_tokens=20, completion_tokens=10, total_ms=500)
    out = io.StringIO()
    call_command("llmgw", "simulate", "--usage-records", "--since", "1h", "--from-db", "--fleet", "1xcpu4-8G",
                 "--json", "--no-plot", stdout=out)
    data = json.loads(out.getvalue())
    assert data["llmgw"]["totals"]["requests"] == 3
    assert data["llmgw"]["totals"]["served"] == 3
