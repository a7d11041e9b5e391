"""The simulator as a referee (fleet.simulation.referee): every policy on one trace, the
table's rows, who is ahead, the plot; and the warm-before-demand rules seen in simulation —
a habit learned from history keeps a model warm, a rising load is met ahead of its queue."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
import pytest

from fleet.simulation import Catalog, LatencyModel, ModelSpec, SimConfig, Simulator, build_report, parse_fleet, traces
from fleet.simulation.referee import POLICIES, Entry, ahead, plot_policies, policy_rows, reactive, referee
from fleet.simulation.scenarios import diurnal_long_tail, diurnal_long_tail_history

ONE_SECOND = dict(ttft_base_ms=100, prefill_ms_per_token=0, tpot_ms=9)


@pytest.fixture(scope="module")
def small_day():
    catalog, spec, trace = diurnal_long_tail(models=40, requests=20_000, seed=3, head=4, team=6)
    history = diurnal_long_tail_history(models=40, requests=20_000, seed=3, weeks=4, head=4, team=6)
    return catalog, parse_fleet("2x8xH100-80G"), trace, history


def test_every_policy_runs_the_same_trace_and_each_request_is_accounted_for(small_day, tmp_path):
    catalog, fleet, trace, history = small_day
    seen = []
    entries = referee(catalog, fleet, trace, SimConfig(duration_s=6 * 3600), history, progress=seen.append)
    assert [e.key for e in entries] == list(POLICIES) and len(seen) == len(POLICIES)
    for e in entries:
        t = e.report.totals
        assert t["requests"] == len(trace) - t["after_end"]
        assert t["served"] + t["rejected_unservable"] + t["rejected_timeout"] + t["cut_off"] + t["unfinished"] \
            + t["unknown_model"] == t["requests"]
    rows = policy_rows(entries)
    assert [r["policy"] for r in rows] == list(POLICIES)
    assert all({"gpu_hours", "slo_attainment", "held", "rejected", "oscillations", "rules", "fleet"} <= set(r)
               for r in rows)
    static = next(e for e in entries if e.key == "static")
    assert static.report.data["fleet"]["gpus"] >= 16  # grows its own fleet
    png = plot_policies(entries, tmp_path / "policies.png")
    assert png.exists() and png.stat().st_size > 10_000


def test_an_unknown_policy_is_refused_by_name(small_day):
    catalog, fleet, trace, _ = small_day
    with pytest.raises(ValueError, match="unknown policy bogus"):
        referee(catalog, fleet, trace, policies=["llmgw", "bogus"])


def test_ahead_means_fewer_gpu_hours_and_a_higher_attainment():
    def entry(key, gpu_hours, attainment):
        report = type("R", (), {})()
        report.totals = {"gpu_hours": gpu_hours, "slo_attainment": attainment, "rejected_unservable": 0,
                         "rejected_timeout": 0}
        return Entry(key, key, report)

    assert ahead(entry("a", 90, 0.99), entry("b", 100, 0.98))["ahead_on_both"]
    verdict = ahead(entry("a", 101, 0.99), entry("b", 100, 0.98))
    assert not verdict["ahead_on_both"] and verdict["higher_slo"] and verdict["gpu_hours_ratio"] == 1.01


# --- warm before demand in simulation -------------------------------------------------------


def habit_catalog():
    return Catalog((ModelSpec("od", on_demand=True, idle_timeout_s=300, cold_start_s=60,
                              latency=LatencyModel(**ONE_SECOND)),))


def test_a_habit_learned_from_history_has_the_model_warm_before_its_first_request():
    # Four weeks of requests at 09:10 on weekdays; the day asks at 09:10 again.
    day = traces.from_rows([(9 * 3600 + 600, "od", 10, 10)])
    weeks = [(w * 7 * 86400 + d * 86400 + 9 * 3600 + 600, "od", 10, 10) for w in range(4) for d in range(5)]
    history = traces.from_rows(weeks, start=day.start - timedelta(days=28))
    config = SimConfig(duration_s=11 * 3600)
    warm = build_report(Simulator(habit_catalog(), parse_fleet("1x1x80G"), day, config, history=history).run())
    cold = build_report(Simulator(habit_catalog(), parse_fleet("1x1x80G"), day, config).run())
    assert warm.totals["held"] == 0 and warm.totals["slo_attainment"] == 1.0
    assert cold.totals["held"] == 1 and cold.totals["slo_attainment"] == 0.0
    # Warm from a cold start and margin before 09:00 (lead 80 s) until 10:00 plus the idle timeout.
    placed, stopped = warm.replica_timelines["od"][1][0], warm.replica_timelines["od"][-1][0]
    assert 9 * 3600 - 80 <= placed < 9 * 3600 and 10 * 3600 + 300 <= stopped <= 10 * 3600 + 310


def test_a_rising_load_on_a_long_cold_start_is_met_before_its_queue():
    spec = ModelSpec("big", min_replicas=1, max_replicas=4, cold_start_s=150,
                     latency=LatencyModel(slots=8, measured=True, slo_ttft_ms=1000, **ONE_SECOND))
    # The arrival rate climbs from 1/s to 12/s over 40 minutes (1 s each: as many in flight).
    rng = np.random.default_rng(5)
    t, now = [], 0.0
    while now < 3000:
        now += rng.exponential(1 / (1 + 11 * min(now, 2400) / 2400))
        t.append(now)
    trace = traces.from_rows([(x, "big", 10, 100) for x in t])
    config = SimConfig(duration_s=3300)
    ramp = build_report(Simulator(Catalog((spec,)), parse_fleet("1x4x80G"), trace, config).run())
    queue = build_report(Simulator(Catalog((spec,)), parse_fleet("1x4x80G"), trace, reactive(config)).run())
    assert any(s["why"].startswith("scale up ahead of a rising load") for s in ramp.data["scale_steps"])
    assert ramp.totals["slo_attainment"] > queue.totals["slo_attainment"]
    assert ramp.totals["oscillations"] == 0


def test_the_shortcuts_agree_with_the_full_planner_with_every_rule_on(small_day):
    catalog, fleet, trace, history = small_day
    sim = Simulator(catalog, fleet, trace, replace(SimConfig(), duration_s=10 * 3600, check_pruning=True),
                    history=history)
    sim.run()  # raises on any disagreement
    assert sim.quiet_passes > 0


# --- the command line and its inputs ------------------------------------------------------------


def cpu_catalog(tmp_path):
    path = tmp_path / "cpu.json"
    path.write_text('{"models": [{"name": "m", "gpus_needed": 0, "cpu_cores": 1, "memory_mib": 512, "min": 1, '
                    '"max": 2}]}')
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(f'{{"t_s": {t}, "model": "m", "prompt_tokens": 10, "output_tokens": 10}}'
                               for t in range(0, 60, 5)))
    return str(path), str(trace)


def test_compare_on_a_cpu_fleet_without_gpu_hours_prints_a_table_not_a_traceback(tmp_path):
    import io

    from django.core.management import call_command

    catalog, trace = cpu_catalog(tmp_path)
    out = io.StringIO()
    call_command("llmgw", "simulate", "--catalog", catalog, "--trace", trace, "--fleet", "1xcpu16-64G", "--compare",
                 "--no-plot", stdout=out)
    text = out.getvalue()
    assert "every policy, the same trace" in text and "GPU-hours -, SLO attainment" in text


@pytest.mark.parametrize("option, value, words", [("--interval", "-1", "--interval takes seconds > 0"),
                                                   ("--duration", "0", "--duration takes seconds > 0"),
                                                   ("--policies", "llmgw,bogus", "unknown bogus")])
def test_compare_refuses_bad_options_in_one_line(tmp_path, option, value, words):
    import io

    from django.core.management import call_command

    catalog, trace = cpu_catalog(tmp_path)
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_info:
        call_command("llmgw", "simulate", "--catalog", catalog, "--trace", trace, "--fleet", "1xcpu16-64G",
                     option, value, stdout=io.StringIO(), stderr=err)
    assert exit_info.value.code == 2 and words in err.getvalue() and "Traceback" not in err.getvalue()


def test_a_catalogs_cold_start_must_be_a_finite_number_of_seconds():
    from fleet.simulation import catalog_from_dict

    for bad in (float("nan"), float("inf"), -5, "soon"):
        with pytest.raises(ValueError, match="cold_start_s"):
            catalog_from_dict([{"name": "m", "cold_start_s": bad}])


def test_a_history_that_overlaps_the_trace_teaches_only_its_requests_before_the_trace():
    day = traces.from_rows([(9 * 3600 + 600, "od", 10, 10)])
    # Four weeks of the habit, all of them *after* the trace's start: nothing to learn.
    later = traces.from_rows([(w * 7 * 86400 + 9 * 3600 + 600, "od", 10, 10) for w in range(1, 5)], start=day.start)
    sim = Simulator(habit_catalog(), parse_fleet("1x1x80G"), day, SimConfig(duration_s=11 * 3600), history=later)
    assert sim.models[0].arrivals.empty
