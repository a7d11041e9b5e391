"""The peers' policies as the simulator's controllers (fleet.simulation.peers): each rule
their module docstring states, on small catalogs with hand-checkable outcomes."""

from __future__ import annotations

from dataclasses import replace
from datetime import time

from catalog.schedules import Window
from fleet.simulation import Catalog, LatencyModel, ModelSpec, SimConfig, Simulator, build_report, parse_fleet, traces
from fleet.simulation.peers import HpaLike, OllamaLike
from fleet.simulation.referee import reactive

#: One second of service per request: 100 ms to the first token, then 100 tokens at 9 ms.
ONE_SECOND = dict(ttft_base_ms=100, prefill_ms_per_token=0, tpot_ms=9)
PLAIN = reactive(SimConfig())


def run(controller, catalog, fleet, trace, duration_s=3600):
    prepared = controller.prepare(catalog, trace)
    sim = Simulator(prepared, parse_fleet(fleet), trace, replace(PLAIN, duration_s=duration_s), controller.label,
                    controller=controller)
    return sim, build_report(sim.run())


def on_demand(name, idle=300.0, cold=20.0):
    return ModelSpec(name, on_demand=True, idle_timeout_s=idle, cold_start_s=cold, latency=LatencyModel(**ONE_SECOND))


# --- Ollama/llama-swap-like -------------------------------------------------------------------


def test_ollama_loads_on_request_and_unloads_after_keep_alive():
    trace = traces.merge(traces.constant_rate("a", 1, 0, 10))
    sim, report = run(OllamaLike(), Catalog((on_demand("a", idle=120),)), "1x1x80G", trace, 600)
    row = report.model("a")
    assert row["placements"] == 1 and row["held"] >= 1 and row["idle_stops"] == 1
    # Loaded at 0 s (20 s cold start): the held requests are served at ~20 s, unloaded ~120 s later.
    assert 140 <= report.replica_timelines["a"][-1][0] <= 150


def test_ollama_unloads_the_least_recently_used_idle_model_when_full_and_requests_wait_not_fail():
    # One GPU: a, then b (a idle by then), then c: b and c each unload the LRU one.
    trace = traces.merge(traces.constant_rate("a", 1, 0, 5), traces.constant_rate("b", 1, 100, 105),
                         traces.constant_rate("c", 1, 200, 205))
    catalog = Catalog(tuple(on_demand(n, idle=3600) for n in "abc"))
    _, report = run(OllamaLike(), catalog, "1x1x80G", trace, 600)
    t = report.totals
    assert t["evictions"] == 2 and t["rejected_unservable"] == 0 and t["served"] == len(trace)


def test_ollama_pins_the_models_kept_running_at_their_peaks_count_without_schedules():
    big = ModelSpec("big", min_replicas=1, max_replicas=8, cold_start_s=60,
                    windows=(Window((0, 1, 2, 3, 4), time(0, 30), time(0, 40), 3, None, 1),),
                    latency=LatencyModel(slots=4, measured=True, **ONE_SECOND))
    trace = traces.constant_rate("big", 8, 0, 600)  # 8 in flight: 8 / (4 × 70%) → 3 replicas
    controller = OllamaLike()
    prepared = controller.prepare(Catalog((big,)), trace)
    spec = prepared.models[0]
    assert (spec.min_replicas, spec.max_replicas, spec.windows) == (3, 3, ())
    _, report = run(OllamaLike(), Catalog((big,)), "1x4x80G", trace, 900)
    assert report.model("big")["max_replicas"] == 3 and report.totals["scale_steps"] == 0


# --- Kubernetes HPA+KEDA-like -----------------------------------------------------------------


def busy_model(max_replicas=6):
    return ModelSpec("m", min_replicas=1, max_replicas=max_replicas, cold_start_s=30,
                     latency=LatencyModel(slots=4, measured=True, **ONE_SECOND))


def test_hpa_follows_utilisation_up_and_holds_the_highest_recommendation_for_five_minutes_down():
    # 10/s of 1 s on 4 slots: 10 in flight → ceil(10 / (4 × 0.7)) = 4 replicas; quiet from 300 s.
    trace = traces.constant_rate("m", 10, 0, 300)
    _, report = run(HpaLike(), Catalog((busy_model(),)), "1x8x80G", trace, 1200)
    ups = [s for s in report.data["scale_steps"] if s["to"] > s["from"]]
    downs = [s for s in report.data["scale_steps"] if s["to"] < s["from"]]
    assert ups and max(s["to"] for s in ups) >= 4
    assert all("target 70%" in s["why"] for s in ups)
    # The scale-down window: a step down only once five minutes of recommendations agree, so
    # the first comes five minutes after the last step up, and the return to the min five
    # minutes after the traffic ended.
    assert downs and downs[0]["t_s"] - ups[-1]["t_s"] >= 300 and downs[-1]["t_s"] >= 300 + 300
    assert downs[-1]["to"] == 1


def test_hpa_scales_from_zero_on_a_request_and_back_after_the_idle_timeout_with_keda():
    trace = traces.constant_rate("od", 1, 0, 5)
    _, report = run(HpaLike(), Catalog((on_demand("od", idle=200),)), "1x1x80G", trace, 900)
    row = report.model("od")
    assert row["placements"] == 1 and row["idle_stops"] == 1 and report.totals["scale_steps"] == 0
    assert 200 <= report.replica_timelines["od"][-1][0] <= 240


def test_hpa_takes_a_windows_min_as_a_cron_floor_at_its_start_not_ahead_of_it():
    spec = ModelSpec("m", min_replicas=1, max_replicas=3, cold_start_s=30,
                     windows=(Window((0,), time(0, 10), time(0, 20), 3, None, 1),),
                     latency=LatencyModel(**ONE_SECOND))
    trace = traces.constant_rate("m", 0.1, 0, 1800)
    _, report = run(HpaLike(), Catalog((spec,)), "1x4x80G", trace, 1800)
    rises = [t for t, n in report.replica_timelines["m"] if n == 3]
    assert rises and 600 <= rises[0] < 610


def test_hpa_pods_that_fit_nowhere_wait_and_nothing_is_evicted():
    trace = traces.merge(traces.constant_rate("a", 1, 0, 600), traces.constant_rate("b", 1, 10, 20))
    catalog = Catalog((on_demand("a", idle=3600), on_demand("b", idle=3600)))
    _, report = run(HpaLike(), catalog, "1x1x80G", trace, 400)
    assert report.totals["evictions"] == 0 and report.model("b")["rejected_timeout"] == 10


def test_hpa_applies_a_windows_cron_floor_to_a_model_with_min_zero_and_no_requests():
    spec = ModelSpec("od", on_demand=True, idle_timeout_s=300, cold_start_s=30,
                     windows=(Window((0,), time(0, 10), time(0, 20), 1, None, 1),), latency=LatencyModel(**ONE_SECOND))
    trace = traces.constant_rate("other", 0.01, 0, 10)
    _, report = run(HpaLike(), Catalog((spec, on_demand("other"))), "1x2x80G", trace, 1800)
    timeline = report.replica_timelines["od"]
    assert timeline[1] == (600.0, 1) and 1200 <= timeline[-1][0] <= 1220 and timeline[-1][1] == 0


def test_ollama_unloads_as_many_least_recently_used_models_as_a_bigger_one_needs():
    two = ModelSpec("two", on_demand=True, idle_timeout_s=3600, gpus_needed=2, cold_start_s=20,
                    latency=LatencyModel(**ONE_SECOND))
    trace = traces.merge(traces.constant_rate("a", 1, 0, 5), traces.constant_rate("b", 1, 0, 5),
                         traces.constant_rate("two", 1, 200, 205))
    catalog = Catalog((on_demand("a", idle=3600), on_demand("b", idle=3600), two))
    _, report = run(OllamaLike(), catalog, "1x2x80G", trace, 600)
    assert report.totals["evictions"] == 2 and report.model("two")["served"] == 5
