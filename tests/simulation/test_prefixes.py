"""Prefix caches in the simulator (issue 17): traces with prefixes, per-replica LRU caches,
routing by the model's policy, the report's hit rate and prefill saved, the command.

The hand-computed case: one model kept at two replicas (ready at 0 s, ids 1 and 2, in that
order), a prefix cache of one slot each, twelve requests of 1,000 prompt tokens whose first
800 are one of three prefixes, 10 output tokens. Latency: 100 ms + 1 ms per prompt token to
the first token, 10 ms per output token, so a miss has a TTFT of 1.1 s (1.2 s in all) and a
hit skips 800 ms of prefill: 0.3 s (0.4 s in all). Requests come 10 s apart, except two that
come 0.1 s after another, while it still runs.
"""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest
from django.core.management import call_command

from fleet.planning.routing import LEAST_LOADED, PREFIX_AFFINITY, SESSION, rendezvous_order
from fleet.simulation import Catalog, LatencyModel, ModelSpec, SimConfig, Simulator, build_report, parse_fleet, simulate
from fleet.simulation import traces
from fleet.simulation.catalog import PREFIX_CACHE_SLOTS, catalog_from_dict, catalog_to_dict
from fleet.simulation.prefixes import PrefixCache, prefix_hash
from fleet.simulation.scenarios import diurnal_long_tail, shared_prefixes

#: Three prefixes whose rendezvous order over replicas 1 and 2 is, by their hashes:
#: A → replica 1, B → replica 2, C → replica 2 (asserted below, as a precondition).
A, B, C = "delta", "alpha", "bravo"
HAND_TRACE = [(10, A), (20, A), (30, B), (30.1, A), (40, C), (50, A), (50.1, B), (60, B), (70, C), (80, A),
              (90, C), (100, A)]
MISS_S, HIT_S = 1.1, 0.3

#: Worked out request by request (replica chosen; its one-slot cache before → hit?).
#: least-loaded: the fewest in flight, ties rotating as the gateway's do: request k (from
#: 0) is the model's k-th routed with a prefix and takes turn k, so with both replicas idle
#: it goes to replica 1 on an even turn, 2 on an odd one; a request arriving while one
#: replica runs another goes to the idle one whatever its turn. (A miss runs 1.2 s, a hit
#: 0.4 s, so every request but those at 30.1 s and 50.1 s finds both idle.)
#:
#:  k  t_s   prefix turn loads(1,2) → replica  cache before  hit
#:  0  10    A      0    0,0         → 1        1: -          no   (1 ← A)
#:  1  20    A      1    0,0         → 2        2: -          no   (2 ← A)
#:  2  30    B      2    0,0         → 1        1: A          no   (1 ← B, runs to 31.2)
#:  3  30.1  A      3    1,0         → 2        2: A          yes
#:  4  40    C      4    0,0         → 1        1: B          no   (1 ← C)
#:  5  50    A      5    0,0         → 2        2: A          yes  (runs to 50.4)
#:  6  50.1  B      6    0,1         → 1        1: C          no   (1 ← B)
#:  7  60    B      7    0,0         → 2        2: A          no   (2 ← B)
#:  8  70    C      8    0,0         → 1        1: B          no   (1 ← C)
#:  9  80    A      9    0,0         → 2        2: B          no   (2 ← A)
#: 10  90    C     10    0,0         → 1        1: C          yes
#: 11  100   A     11    0,0         → 2        2: A          yes
#:
#: Four hits (requests 4, 6, 11, 12 counted from 1); replica 1 ends holding C, replica 2 A.
#: (Ties to the first, as before the fix, would have found one: request 2.)
LEAST_LOADED_HITS = [False, False, False, True, False, True, False, False, False, False, True, True]
#: prefix-affinity: A always on replica 1, B and C share replica 2's one slot. Replica 1
#: keeps A from request 1 on: requests 2, 4, 6, 10, 12 hit; on replica 2 B, C, B miss, B
#: (request 8, after B) hits, C misses, C (request 11) hits.
AFFINITY_HITS = [False, True, False, True, False, True, False, True, False, True, True, True]


def hand_catalog(policy: str) -> Catalog:
    return Catalog((ModelSpec(
        "chat", min_replicas=2, max_replicas=2, routing_policy=policy, prefix_cache_slots=1,
        latency=LatencyModel(slots=8, ttft_base_ms=100, prefill_ms_per_token=1, tpot_ms=10, slo_ttft_ms=500)),))


def hand_run(policy: str):
    trace = traces.from_rows([(t, "chat", 1000, 10, prefix, 800) for t, prefix in HAND_TRACE])
    raw = Simulator(hand_catalog(policy), parse_fleet("1x2x80G"), trace, SimConfig(check_pruning=True)).run()
    return raw, build_report(raw)


def test_the_hand_computed_prefixes_prefer_the_replicas_the_case_assumes():
    assert [rendezvous_order(prefix_hash(p), [1, 2])[0] for p in (A, B, C)] == [1, 2, 2]


@pytest.mark.parametrize(("policy", "hits"), [(LEAST_LOADED, LEAST_LOADED_HITS), (PREFIX_AFFINITY, AFFINITY_HITS),
                                               (SESSION, AFFINITY_HITS)])
def test_the_simulators_prefix_caches_match_the_hand_computed_case(policy, hits):
    raw, report = hand_run(policy)
    (model,) = raw.sim.models
    assert [r.id for r in model.ready] == [1, 2]
    assert np.frombuffer(model.ttft, dtype=np.float64).tolist() == pytest.approx(
        [HIT_S if hit else MISS_S for hit in hits], abs=1e-9)
    row = report.model("chat")
    n_hits = sum(hits)
    assert (row["prefix_requests"], row["prefix_hits"], row["prefill_tokens_saved"]) == (12, n_hits, 800 * n_hits)
    assert row["prefix_hit_rate"] == round(n_hits / 12, 6)
    assert row["routing_policy"] == policy and row["prefix_cache_slots"] == 1
    assert row["served"] == 12 and row["slo_attainment"] == round(n_hits / 12, 6)  # only hits are under 500 ms
    totals = report.totals
    assert (totals["prefix_requests"], totals["prefix_hits"], totals["prefill_tokens_saved"]) == (12, n_hits,
                                                                                                  800 * n_hits)
    assert report.data["trace"]["prefixes"] == 3
    # After the last request each replica holds the prefix routed to it last.
    last = {1: C, 2: A} if policy == LEAST_LOADED else {1: A, 2: C}
    assert {r.id: r.cache.keys() for r in model.ready} == {rid: [prefix_hash(p)] for rid, p in last.items()}


#: Two tenants taking turns on the hand case's model, 2 s apart (each request done in 1.2 s,
#: so both replicas are idle at every arrival): A at 10, 14, 18, … s, B at 12, 16, 20, … s.
ALTERNATING = [(10.0 + 2 * k, A if k % 2 == 0 else B) for k in range(20)]


@pytest.mark.parametrize("policy", [LEAST_LOADED, PREFIX_AFFINITY])
def test_two_tenants_taking_turns_keep_to_one_replica_each_under_least_loaded_as_behind_the_gateway(policy):
    # least-loaded: request k takes turn k with both replicas idle, so A (even k) always
    # goes to replica 1 and B (odd k) to replica 2, as fleet.live.route's per-model
    # rotation sends them: the first two miss (each replica's cache starts empty), the
    # other 18 hit. Ties to the first would have sent all 20 to replica 1, where A and B
    # evict each other from its one slot: no hit at all. prefix-affinity gets the same 18:
    # A's rendezvous home is replica 1, B's replica 2 (asserted by the test above).
    trace = traces.from_rows([(t, "chat", 1000, 10, prefix, 800) for t, prefix in ALTERNATING])
    raw = Simulator(hand_catalog(policy), parse_fleet("1x2x80G"), trace, SimConfig(check_pruning=True)).run()
    (model,) = raw.sim.models
    assert np.frombuffer(model.ttft, dtype=np.float64).tolist() == pytest.approx([MISS_S] * 2 + [HIT_S] * 18,
                                                                                  abs=1e-9)
    assert (model.prefix_routed, model.prefix_hits, model.prefill_tokens_saved) == (20, 18, 18 * 800)
    assert {r.id: r.cache.keys() for r in model.ready} == {1: [prefix_hash(A)], 2: [prefix_hash(B)]}


def test_requests_without_a_prefix_do_not_take_a_turn():
    # Plain requests keep the fast path (ties to the first) and leave the turn counter
    # alone: with a plain request between each pair, A at 10 s still gets turn 0 (replica
    # 1), B at 14 s turn 1 (replica 2), A at 18 s turn 2 (replica 1, a hit), and every plain
    # request goes to replica 1 (both idle, the first) without touching its prefix cache.
    rows = [(10, "chat", 1000, 10, A, 800), (12, "chat", 1000, 10, None, 0), (14, "chat", 1000, 10, B, 800),
            (16, "chat", 1000, 10, None, 0), (18, "chat", 1000, 10, A, 800), (20, "chat", 1000, 10, B, 800)]
    raw = Simulator(hand_catalog(LEAST_LOADED), parse_fleet("1x2x80G"), traces.from_rows(rows),
                    SimConfig(check_pruning=True)).run()
    (model,) = raw.sim.models
    assert np.frombuffer(model.ttft, dtype=np.float64).tolist() == pytest.approx(
        [MISS_S, MISS_S, MISS_S, MISS_S, HIT_S, HIT_S], abs=1e-9)
    assert (model.prefix_routed, model.prefix_hits, next(model.turns)) == (4, 2, 4)


def test_a_hot_prefix_spills_past_the_load_bound_and_is_then_held_by_both_replicas():
    # A (preferred: replica 1) three times within 0.2 s, then twice alone. Request 1: replica
    # 1, a miss. Request 2: replica 1 runs one, the least loaded none: 1 - 0 < 2, within the
    # bound: replica 1, a hit. Request 3: replica 1 runs two: 2 - 0 ≥ 2, it spills to
    # replica 2, a miss; RecentRoutes now says A is held by replicas 2 and 1, 2 the most
    # recent. Requests 4 and 5 stay there (within the bound): hits.
    trace = traces.from_rows([(t, "chat", 1000, 10, A, 800) for t in (10, 10.1, 10.2, 20, 30)])
    raw = Simulator(hand_catalog(PREFIX_AFFINITY), parse_fleet("1x2x80G"), trace, SimConfig(check_pruning=True)).run()
    (model,) = raw.sim.models
    assert np.frombuffer(model.ttft, dtype=np.float64).tolist() == pytest.approx(
        [MISS_S, HIT_S, MISS_S, HIT_S, HIT_S], abs=1e-9)
    assert (model.prefix_routed, model.prefix_hits, model.prefill_tokens_saved) == (5, 3, 2400)
    assert model.recent.holders((prefix_hash(A),), {1, 2}, 1) == (2, 1)
    assert {r.id: r.cache.keys() for r in model.ready} == {1: [prefix_hash(A)], 2: [prefix_hash(A)]}


def test_a_prefix_cache_keeps_the_most_recent_prefixes_and_none_with_no_slots():
    cache = PrefixCache(2)
    assert [cache.use(k) for k in (1, 2, 1, 3, 2, 1)] == [False, False, True, False, False, False]
    assert cache.keys() == [2, 1]
    none = PrefixCache(0)
    assert [none.use(k) for k in (1, 1)] == [False, False] and len(none) == 0


def test_a_trace_without_prefixes_gives_the_same_report_under_every_policy_as_before():
    # The same requests, with no prefix data and with prefix columns but no prefix on any
    # request: every report equals the least-loaded one of the plain trace, byte for byte.
    rows = [(t, "chat", 1000, 10) for t, _ in HAND_TRACE]
    plain = simulate(hand_catalog(LEAST_LOADED), parse_fleet("1x2x80G"), traces.from_rows(rows)).data
    assert "prefix_requests" not in plain["totals"] and "prefixes" not in plain["trace"]
    assert "prefix_requests" not in plain["models"][0]
    for policy in (PREFIX_AFFINITY, SESSION):
        assert simulate(hand_catalog(policy), parse_fleet("1x2x80G"), traces.from_rows(rows)).data == plain
    empty = simulate(hand_catalog(PREFIX_AFFINITY), parse_fleet("1x2x80G"),
                     traces.from_rows([(*r, None, 0) for r in rows])).data
    assert empty["totals"]["prefix_requests"] == 0 and empty["totals"]["prefix_hit_rate"] is None
    assert {k: v for k, v in empty["totals"].items() if not k.startswith(("prefix", "prefill"))} == plain["totals"]
    assert empty["models"] == plain["models"]


def test_the_day_scenario_trace_has_no_prefixes():
    _, _, trace = diurnal_long_tail(40, 2000, seed=3)
    assert not trace.has_prefixes and trace.prefix_ids == []


# --- Traces -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["t.jsonl", "t.csv", "t.csv.gz"])
def test_prefixes_round_trip_through_trace_files(tmp_path, name):
    trace = traces.from_rows([(2, "a", 900, 5, "tenant 7, system", 700), (1, "b", 10, 1, None, 0),
                              (3, "a", 800, 5, "tenant 7, system", 700), (4, "a", 50, 5, 'q "x"', 50)])
    back = traces.read_trace(traces.write_trace(trace, tmp_path / name))
    assert list(back.prefix_rows()) == [(1.0, "b", 10, 1, None, 0), (2.0, "a", 900, 5, "tenant 7, system", 700),
                                        (3.0, "a", 800, 5, "tenant 7, system", 700), (4.0, "a", 50, 5, 'q "x"', 50)]
    assert back.prefix_ids == ["tenant 7, system", 'q "x"']


def test_merging_a_trace_with_prefixes_and_one_without_keeps_the_prefixes():
    one = traces.from_rows([(1, "a", 10, 1, "p", 5), (3, "a", 10, 1, "q", 5)])
    two = traces.from_rows([(2, "b", 10, 1)])
    both = traces.merge(two, one)
    assert [(t, pid, k) for t, _, _, _, pid, k in both.prefix_rows()] == [(1.0, "p", 5), (2.0, None, 0), (3.0, "q", 5)]


@pytest.mark.parametrize(("row", "error"), [
    ('"prefix_id": "p"', "prefix_id and prefix_tokens come together"),
    ('"prefix_tokens": 5', "prefix_id and prefix_tokens come together"),
    ('"prefix_id": 7, "prefix_tokens": 5', "prefix_id must be a string"),
    ('"prefix_id": "p", "prefix_tokens": 2.5', "prefix_tokens must be an integer"),
    ('"prefix_id": "p", "prefix_tokens": 11', r"prefix_tokens \(11\) must be between 0 and prompt_tokens \(10\)"),
    ('"prefix_id": "p", "prefix_tokens": -1', r"prefix_tokens \(-1\) must be between 0"),
])
def test_a_jsonl_trace_with_a_bad_prefix_is_refused_naming_the_line(tmp_path, row, error):
    path = tmp_path / "t.jsonl"
    path.write_text('{"trace": 1, "start": "2026-11-30T00:00:00+00:00"}\n'
                    '{"t_s": 0, "model": "a", "prompt_tokens": 10, "output_tokens": 1, "prefix_id": "p", '
                    '"prefix_tokens": 4}\n\n'
                    f'{{"t_s": 1, "model": "a", "prompt_tokens": 10, "output_tokens": 1, {row}}}\n')
    with pytest.raises(ValueError, match=f"t.jsonl:4: request 2: {error}") as info:
        traces.read_trace(path)
    assert "\n" not in str(info.value)


START_LINE = '{"trace": 1, "start": "2026-11-30T00:00:00+00:00"}\n'
GOOD_ROW = '{"t_s": 0, "model": "chat", "prompt_tokens": 10, "output_tokens": 1, "prefix_id": "p", "prefix_tokens": 4}\n'


@pytest.mark.parametrize(("row", "error"), [
    # JSON's \ud800 escape parses to a str that UTF-8 cannot encode (nor prefix_hash hash).
    ('{"t_s": 1, "model": "chat", "prompt_tokens": 10, "output_tokens": 1, "prefix_id": "t\\ud800", '
     '"prefix_tokens": 4}', r"request 2: 'prefix_id' is not Unicode text \(a lone surrogate in 't\\ud800'\)"),
    ('{"t_s": 1, "model": "ch\\udfff", "prompt_tokens": 10, "output_tokens": 1}',
     r"request 2: 'model' is not Unicode text"),
])
def test_a_jsonl_trace_with_a_lone_surrogate_is_refused_naming_the_line(tmp_path, row, error):
    path = tmp_path / "t.jsonl"
    path.write_text(START_LINE + GOOD_ROW + row + "\n")
    with pytest.raises(ValueError, match=f"t.jsonl:3: {error}") as info:
        traces.read_trace(path)
    assert "\n" not in str(info.value)


def test_a_lone_surrogate_in_a_traces_header_or_a_usage_record_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"trace": 1, "description": "day \\ud800"}\n' + GOOD_ROW)
    with pytest.raises(ValueError, match=r"t.jsonl:1: header: 'description' is not Unicode text"):
        traces.read_trace(path)
    path.write_text('{"at": "2026-11-30T00:00:00Z", "model": "a", "prompt_tokens": 1, "completion_tokens": 1}\n'
                    '{"at": "2026-11-30T00:00:01Z", "model": "\\udc80", "prompt_tokens": 1, "completion_tokens": 1}\n')
    with pytest.raises(ValueError, match=r"t.jsonl:2: record 2: 'model' is not Unicode text"):
        traces.read_trace(path)


def test_llmgw_simulate_refuses_a_lone_surrogate_prefix_with_one_line_and_exit_2(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"models": [{"name": "chat"}], "fleet": "1x2x80G"}))
    path = tmp_path / "t.jsonl"
    path.write_text(START_LINE + GOOD_ROW + '{"t_s": 1, "model": "chat", "prompt_tokens": 10, "output_tokens": 1, '
                    '"prefix_id": "t\\ud800", "prefix_tokens": 4}\n')
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as exit_info:
        call_command("llmgw", "simulate", "--catalog", str(tmp_path / "c.json"), "--trace", str(path),
                     "--no-plot", "--no-baseline", stdout=out, stderr=err)
    assert exit_info.value.code == 2 and out.getvalue() == ""
    assert err.getvalue() == f"{path}:3: request 2: 'prefix_id' is not Unicode text (a lone surrogate in 't\\ud800')\n"


def test_a_trace_built_with_a_lone_surrogate_prefix_id_is_refused():
    with pytest.raises(ValueError, match=r"a trace's prefix id must be Unicode text, not 't\\ud800'"):
        traces.from_rows([(0, "chat", 10, 1, "t\ud800", 4)])


def test_a_csv_trace_with_a_bad_prefix_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "t.csv"
    header = "# start=2026-11-30T00:00:00+00:00\nt_s,model,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n"
    path.write_text(header + "0,a,10,1,p,4\n1,a,10,1,,\n2,a,10,1,p,x\n")
    with pytest.raises(ValueError, match=r"t.csv:5: request 3: prefix_tokens must be an integer, not 'x'"):
        traces.read_trace(path)
    path.write_text(header + "0,a,10,1,p,4\n1,a,10,1,,3\n")
    with pytest.raises(ValueError, match="t.csv:4: request 2: prefix_id and prefix_tokens come together"):
        traces.read_trace(path)
    path.write_text(header + "0,a,10,1,p,4\n1,a,10,1,,\n")
    trace = traces.read_trace(path)
    assert list(trace.prefix_rows()) == [(0.0, "a", 10, 1, "p", 4), (1.0, "a", 10, 1, None, 0)]


def test_a_bad_usage_record_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "u.csv"
    path.write_text("at,model,prompt_tokens,completion_tokens\n2026-11-30T00:00:00Z,a,1,1\nnope,a,1,1\n")
    with pytest.raises(ValueError, match="u.csv:3: record 2: at must be an ISO 8601 instant or Unix seconds between 1970 and 2200, not .nope.$"):
        traces.read_trace(path)


def test_a_trace_without_prefix_columns_reads_as_before(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("t_s,model,prompt_tokens,output_tokens\n1,a,3,4\n")
    trace = traces.read_trace(path)
    assert not trace.has_prefixes and trace.prefix is None and list(trace.rows()) == [(1.0, "a", 3, 4)]


# --- Catalog ----------------------------------------------------------------------------------


def test_a_catalog_names_its_routing_policy_and_prefix_cache_slots():
    catalog = catalog_from_dict([{"name": "a", "routing_policy": "prefix-affinity", "prefix_cache_slots": 16},
                                 {"name": "b"}])
    a, b = catalog.models
    assert (a.routing_policy, a.prefix_cache_slots) == (PREFIX_AFFINITY, 16)
    assert (b.routing_policy, b.prefix_cache_slots) == (LEAST_LOADED, PREFIX_CACHE_SLOTS)
    again = catalog_from_dict(catalog_to_dict(catalog))
    assert again.models == catalog.models
    with pytest.raises(ValueError, match="routing_policy 'sticky' is not one of least-loaded, prefix-affinity"):
        catalog_from_dict([{"name": "a", "routing_policy": "sticky"}])


@pytest.mark.parametrize("slots", [True, False, 1.7, 2.0, "x", "4", None, -1])
def test_a_catalog_refuses_prefix_cache_slots_that_are_not_a_whole_number_naming_the_model(slots):
    # int() would have read true and 1.7 as 1, and said nothing of the model for "x".
    with pytest.raises(ValueError, match=r"^model chat: prefix_cache_slots must be an integer ≥ 0 \(0: no prefix "
                                         rf"cache\), not {re.escape(repr(slots))}$"):
        catalog_from_dict([{"name": "ok", "prefix_cache_slots": 0}, {"name": "chat", "prefix_cache_slots": slots}])


@pytest.mark.django_db
def test_the_catalog_from_the_database_routes_as_its_models_say(make_model):
    from fleet.simulation import catalog_from_db

    make_model("sticky", routing_policy=PREFIX_AFFINITY)
    make_model("plain")
    by_name = catalog_from_db().by_name()
    assert by_name["sticky"].routing_policy == PREFIX_AFFINITY
    assert by_name["plain"].routing_policy == LEAST_LOADED


# --- The command ------------------------------------------------------------------------------


def test_llmgw_simulate_shows_prefix_caches_only_for_a_trace_with_prefixes(tmp_path):
    catalog = {"models": [{"name": "chat", "min": 2, "max": 2, "routing_policy": "prefix-affinity",
                           "prefix_cache_slots": 1,
                           "latency": {"ttft_base_ms": 100, "prefill_ms_per_token": 1, "tpot_ms": 10}}],
               "fleet": "1x2x80G"}
    (tmp_path / "c.json").write_text(json.dumps(catalog))
    traces.write_trace(traces.from_rows([(t, "chat", 1000, 10, p, 800) for t, p in HAND_TRACE]), tmp_path / "p.csv")
    traces.write_trace(traces.from_rows([(t, "chat", 1000, 10) for t, _ in HAND_TRACE]), tmp_path / "n.csv")
    common = ["llmgw", "simulate", "--catalog", str(tmp_path / "c.json"), "--no-plot", "--no-baseline"]

    out = io.StringIO()
    call_command(*common, "--trace", str(tmp_path / "p.csv"), stdout=out)
    text = out.getvalue()
    assert "prefix cache" in text and "58.33%" in text and "5,600" in text

    out = io.StringIO()
    call_command(*common, "--trace", str(tmp_path / "p.csv"), "--json", stdout=out)
    data = json.loads(out.getvalue())["llmgw"]
    assert (data["totals"]["prefix_hits"], data["totals"]["prefill_tokens_saved"]) == (7, 5600)
    assert data["models"][0]["prefix_hit_rate"] == round(7 / 12, 6)

    out = io.StringIO()
    call_command(*common, "--trace", str(tmp_path / "n.csv"), stdout=out)
    assert "prefix" not in out.getvalue()
    out = io.StringIO()
    call_command(*common, "--trace", str(tmp_path / "n.csv"), "--json", stdout=out)
    assert "prefix" not in out.getvalue()


# --- The scenario -----------------------------------------------------------------------------


def test_tenants_system_prompts_hit_their_cache_more_often_with_prefix_affinity_than_least_loaded():
    reports = {}
    for policy in (LEAST_LOADED, PREFIX_AFFINITY):
        catalog, fleet, trace = shared_prefixes(requests=3000, policy=policy)
        reports[policy] = simulate(catalog, parse_fleet(fleet), trace).totals
    spread, kept = reports[LEAST_LOADED], reports[PREFIX_AFFINITY]
    assert spread["prefix_requests"] == kept["prefix_requests"] > 2900
    assert kept["prefix_hit_rate"] > spread["prefix_hit_rate"] + 0.1
    assert kept["prefill_tokens_saved"] > spread["prefill_tokens_saved"]
    assert kept["ttft_p50_ms"] < spread["ttft_p50_ms"]


def test_the_shared_prefixes_scenario_is_deterministic_and_every_request_has_a_tenants_prefix():
    _, _, one = shared_prefixes(requests=500, seed=5)
    _, _, two = shared_prefixes(requests=500, seed=5)
    assert list(one.prefix_rows()) == list(two.prefix_rows())
    assert np.all(one.prefix >= 0) and np.all(one.prefix_tokens >= 1000) and np.all(one.prefix_tokens < one.prompt_tokens)


def test_llmgw_simulate_runs_the_shared_prefixes_scenario():
    out = io.StringIO()
    call_command("llmgw", "simulate", "--scenario", "shared-prefixes", "--requests", "400", "--no-plot",
                 "--no-baseline", "--json", stdout=out)
    data = json.loads(out.getvalue())["llmgw"]
    assert data["totals"]["requests"] == 400 and data["trace"]["prefixes"] == 24
    assert data["models"][0]["routing_policy"] == PREFIX_AFFINITY and data["totals"]["prefix_hits"] > 0


def test_routing_policy_overrides_every_models_policy_so_two_runs_compare_policies():
    def run(policy: str) -> dict:
        out = io.StringIO()
        call_command("llmgw", "simulate", "--scenario", "shared-prefixes", "--requests", "1500", "--no-plot",
                     "--no-baseline", "--json", "--routing-policy", policy, stdout=out)
        return json.loads(out.getvalue())["llmgw"]["models"][0]
    least, affinity = run(LEAST_LOADED), run(PREFIX_AFFINITY)
    assert (least["routing_policy"], affinity["routing_policy"]) == (LEAST_LOADED, PREFIX_AFFINITY)
    assert affinity["prefix_hit_rate"] > least["prefix_hit_rate"] + 0.1
