"""bench/gateway.py's pure pieces (goal evaluation, wrk's output, the tables) and one run of
the bench in its quickest form. No timing is asserted: speed is the bench's to print."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench import _gateway_goals as rules
from bench import _gateway_load as load
from bench import gateway as gw
from bench._gateway_goals import Result, Stalls, Step, Wrk

WRK_OUTPUT = """Running 2s test @ http://127.0.0.1:8000/v1/chat/completions
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    41.22ms    8.01ms 120.00ms   80.00%
    Req/Sec     1.55k   100.00     1.70k    70.00%
  Latency Distribution
     50%  812.00us
     75%   45.00ms
     90%   50.00ms
     99%    1.20s
  3100 requests in 2.00s, 1.50MB read
  Socket errors: connect 0, read 2, write 1, timeout 4
  Non-2xx or 3xx responses: 5
Requests/sec:   1549.75
Transfer/sec:    767.21KB
"""


def test_wrk_output_is_read_with_its_units_and_failures():
    w = load.parse_wrk(WRK_OUTPUT, 64)
    assert w.rps == pytest.approx(1549.75)
    assert w.p50_ms == pytest.approx(0.812)
    assert w.p99_ms == pytest.approx(1200.0)
    assert w.requests == 3100
    assert (w.errors, w.timeouts) == (2 + 1 + 5, 4)


def test_wrk_output_without_errors_lines_has_none():
    text = "\n".join(line for line in WRK_OUTPUT.splitlines() if "errors" not in line and "Non-2xx" not in line)
    w = load.parse_wrk(text, 64)
    assert (w.errors, w.timeouts) == (0, 0)


def test_wrk_output_without_a_rate_is_an_error():
    with pytest.raises(ValueError, match="Requests/sec"):
        load.parse_wrk("unable to connect to 127.0.0.1:1 Connection refused\n", 64)


def test_wrk_script_posts_the_body_with_the_key():
    script = load.wrk_script("sk-abc", b'{"model": "m"}')
    assert 'wrk.method = "POST"' in script
    assert 'wrk.body = [==[{"model": "m"}]==]' in script
    assert "[==[Bearer sk-abc]==]" in script
    with pytest.raises(ValueError):
        load.wrk_script("k", b'"]==]"')


def step(clients: int, stream: bool, rps: float, cpu_ms: float | None, scenario: str = "replica",
         timeouts: int = 0, errors: int = 0) -> Step:
    """A step of 1 s with ``rps`` answers and ``cpu_ms`` of CPU per answer."""
    s = Step(clients, stream, 1.0, scenario, ok=int(rps), answered=int(rps), timeouts=timeouts, errors=errors)
    s.cpu_s = None if cpu_ms is None else cpu_ms * int(rps) / 1000
    return s


def results() -> list[Result]:
    direct = Result("direct", kind="direct", p50_ms=1.0, p99_ms=2.0,
                    steps=[step(64, False, 9000, 0.05), step(64, True, 5000, 0.1)])
    uvicorn = Result("uvicorn", p50_ms=1.3, p99_ms=6.0, held_ms=250.0, steps=[
        step(64, False, 1500, 0.4),  # measured 1,500/s, cap 2,500/s: the cap decides, PASS
        step(64, True, 1500, 0.8),  # cap 1,250/s: MISS
        step(256, False, 1000, 0.5), step(256, True, 900, 0.9, timeouts=1),
        step(1024, False, 1000, 0.5), step(1024, True, 900, 0.9),
        step(64, False, 1450, 0.42, "external"), step(64, True, 1450, 0.84, "external"),  # within 10%
        step(64, False, 1000, 0.6, "on-demand"), step(64, True, 1450, 0.84, "on-demand"),  # JSON is not
    ], wrk=Wrk(64, rps=1400, p50_ms=40, p99_ms=90, requests=2800, cpu_ms=0.45))
    workers = Result("uvicorn-w2", workers=2, p50_ms=1.3, p99_ms=6.0,
                     steps=[step(64, False, 1800, 0.42), step(64, True, 1500, 0.8)])
    shipped = Result("as-shipped", kind="as-shipped", p50_ms=1.4, p99_ms=5.5,
                     stalls=Stalls(10_000, 20.0, 2, 0.4, 2.5, 180.0))
    return [direct, uvicorn, workers, shipped]


def verdicts(rs: list[Result]) -> dict[tuple[str, str], str]:
    return {(g.target, g.goal): g.verdict for g in rules.evaluate_goals(rs)}


def test_every_goal_is_judged_from_one_run():
    v = verdicts(results())
    assert v[("uvicorn", "req/s JSON @64")] == "PASS"
    assert v[("uvicorn", "req/s streamed @64")] == "MISS"
    assert v[("uvicorn", "CPU per request @64 (JSON / streamed)")] == "MISS"
    assert v[("uvicorn", "added p50, one client")] == "PASS"  # +0.3 ms
    assert v[("uvicorn", "added p99, one client")] == "MISS"  # +4 ms
    assert v[("uvicorn", "failures @256 clients")] == "MISS"
    assert v[("uvicorn", "failures @1,024 clients")] == "PASS"
    assert v[("uvicorn", "external vs replica, JSON @64")] == "PASS"
    assert v[("uvicorn", "external vs replica, streamed @64")] == "PASS"
    assert v[("uvicorn", "on-demand vs replica, JSON @64")] == "MISS"
    assert v[("uvicorn", "on-demand vs replica, streamed @64")] == "PASS"
    assert v[("uvicorn", "held-then-served (cold request)")] == "PASS"
    assert v[("uvicorn-w2", "CPU per request, 2 workers vs 1, JSON @64")] == "PASS"  # 0.42 vs 0.4 ms: 1.05x
    assert v[("uvicorn-w2", "req/s, 2 workers vs 1, JSON @64")] == "-"  # reported, not judged
    assert v[("uvicorn-w2", "req/s JSON @64")] == "PASS"  # cap 2 x 1000 / 0.42 ms
    assert v[("as-shipped", "added p50, one client as shipped")] == "PASS"
    assert v[("as-shipped", "added p99, one client as shipped")] == "MISS"
    assert v[("as-shipped", "stalls in 10,000 sequential as shipped")] == "MISS"


def floor(json_ms: float = 0.35, stream_ms: float = 0.6) -> Result:
    return Result("floor", kind="floor", p50_ms=1.1, p99_ms=1.9,
                  steps=[step(64, False, 2800, json_ms), step(64, True, 1700, stream_ms)])


def test_the_floor_is_reported_beside_llmgw_and_never_judged():
    rs = results()
    rs.insert(3, floor())
    goals = {(g.target, g.goal): g for g in rules.evaluate_goals(rs)}
    alone = goals[("floor", "stack alone: CPU per request @64 (JSON / streamed)")]
    assert alone.verdict == "-"
    assert alone.figure == "0.350 / 0.600 ms; over the 0.5 ms goal by itself (streamed)"
    above = goals[("uvicorn", "CPU above the stack's floor @64 (JSON / streamed)")]
    assert above.verdict == "-"
    assert above.figure.startswith("+0.050 / +0.200 ms")  # llmgw 0.4 / 0.8 ms
    assert goals[("uvicorn", "added p50 / p99 above the stack's floor, one client")].figure == "+0.200 / +4.100 ms"
    assert goals[("uvicorn", "CPU per request @64 (JSON / streamed)")].verdict == "MISS"  # llmgw still judged
    assert "floor: uvicorn + aiohttp, no llmgw" in rules.render_markdown(rs)
    rs[3] = floor(0.3, 0.45)
    assert rules.evaluate_goals(rs)[-4].figure.endswith("within the 0.5 ms goal by itself")
    django = Result("floor-django", kind="floor", p50_ms=1.2, p99_ms=2.0,
                    steps=[step(64, False, 2500, 0.25), step(64, True, 1600, 0.55)])
    goals = {(g.target, g.goal): g for g in rules.evaluate_goals([*rs, django])}
    assert goals[("floor-django", "stack + Django's handler: CPU per request @64 (JSON / streamed)")].figure == (
        "0.250 / 0.550 ms; over the 0.5 ms goal by itself (streamed)")
    assert goals[("floor-django", "stack + Django's handler: added p50 / p99, one client")].figure == "+0.200 / +0.000 ms"
    assert "floor: + Django's lean handler, no llmgw" in rules.render_markdown([*rs, django])
    two = Result("floor-w2", kind="floor", workers=2, steps=[step(64, False, 3000, 0.39)])
    last = rules.evaluate_goals([*rs, two])[-1]
    assert (last.target, last.goal, last.figure, last.verdict) == (
        "floor-w2", "stack alone: CPU per request, 2 workers vs 1, JSON @64", "0.390 vs 0.300 ms (1.30x)", "-")
    assert "floor: uvicorn + aiohttp, no llmgw, 2 workers" in rules.render_markdown([*rs, two])


def test_the_floor_proxy_is_started_as_uvicorn_without_llmgw():
    argv = gw.gateway_argv(rules.FLOOR, 8124)
    assert "bench._floor_proxy:app" in argv and "llmgw.asgi:application" not in argv
    assert argv[argv.index("--loop") + 1] == "uvloop" and argv[argv.index("--http") + 1] == "httptools"


def test_workers_whose_cpu_per_request_grows_miss():
    rs = results()
    rs[2].steps[0] = step(64, False, 1800, 0.5)  # 1.25x one worker's 0.4 ms
    assert verdicts(rs)[("uvicorn-w2", "CPU per request, 2 workers vs 1, JSON @64")] == "MISS"


def test_a_step_that_answered_nothing_does_not_pass_the_failures_goal():
    rs = results()
    rs[1].steps[4] = step(1024, False, 0, None)  # nothing answered: no timeouts, no errors either
    assert verdicts(rs)[("uvicorn", "failures @1,024 clients")] == "MISS"


def test_measured_rate_decides_without_cpu_and_says_so():
    rs = results()
    rs[1].steps[0] = step(64, False, 2100, None)
    goal = next(g for g in rules.evaluate_goals(rs) if g.target == "uvicorn" and g.goal == "req/s JSON @64")
    assert goal.ok is True and "decides: no CPU read" in goal.figure
    rs[1].steps[0] = step(64, False, 1500, 0.4)
    goal = next(g for g in rules.evaluate_goals(rs) if g.target == "uvicorn" and g.goal == "req/s JSON @64")
    assert "cap 2,500/s from CPU (decides)" in goal.figure and "1,500/s measured" in goal.figure


def test_a_held_request_that_failed_misses_and_says_why():
    rs = results()
    rs[1].held_ms, rs[1].held_error = None, "HTTP 503: b'loading'"
    rs[1].steps = [s for s in rs[1].steps if s.scenario != "on-demand"]
    goals = {g.goal: g for g in rules.evaluate_goals(rs) if g.target == "uvicorn"}
    assert goals["held-then-served (cold request)"].verdict == "MISS"
    assert "503" in goals["held-then-served (cold request)"].figure
    assert goals["on-demand vs replica, JSON @64"].verdict == "-"


def test_stalls_count_requests_over_the_threshold_added():
    st = load.stall_summary([1.0] * 97 + [22.5, 30.0, 1.5], base_ms=1.0, threshold_ms=20.0)
    assert (st.requests, st.over, st.max_added_ms) == (100, 2, 29.0)
    assert load.stall_summary([], 1.0).requests == 0


def test_the_table_is_aligned_and_has_every_scenario():
    head, rows = rules.table_rows(results(), (64, 256, 1024))
    lines = rules.render_table(head, rows)
    assert lines[0].split() == ["scenario", "direct", "uvicorn", "ratio", "uvicorn-w2", "ratio", "as-shipped", "ratio"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    labels = [r[0] for r in rows]
    for label in ("req/s 1024 clients json", "external req/s 64 json", "on-demand req/s 64 stream",
                  "held-then-served ms", "wrk req/s 64 json", "stalls > 20 ms added", "cpu ms/req external 64 json"):
        assert label in labels
    assert all(len(r) == len(head) for r in rows)
    text = rules.report(results(), gw.parse_args(["--quick"]), ["a note"])
    assert "goals (uvicorn" in text and "MISS" in text and "note: a note" in text


def test_markdown_has_the_readme_tables_shape():
    md = rules.render_markdown(results(), ["a note"])
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert table[0] == "| at 64 clients | uvicorn (chosen) | uvicorn, 2 workers | as `llmgw up` runs it |"
    assert table[1] == "|---|---|---|---|"
    assert {line.count("|") for line in table} == {5}
    assert "| requests/s, JSON | 1,500 | 1,800 | - |" in table
    assert any(line.startswith("| stalls > 20 ms added in 10,000 sequential") for line in table)
    assert "* PASS uvicorn: req/s JSON @64" in md and "* note: a note" in md


def test_server_options():
    assert gw.parse_args([]).servers == ("uvicorn", "daphne", "granian")
    assert gw.parse_args(["--server", "both"]).servers == ("uvicorn", "daphne")
    assert gw.parse_args(["--quick"]).concurrency == (64, 256, 1024)
    with pytest.raises(SystemExit):
        gw.parse_args(["--servers", "uvicorn,hypercorn"])
    argv = gw.gateway_argv("uvicorn", 8123, workers=3)
    assert argv[-2:] == ["--workers", "3"]
    assert gw.gateway_argv("granian", 8123, granian=["/x/python", "-m", "granian"])[:5] == [
        "/x/python", "-m", "granian", "--interface", "asgi"]


@pytest.mark.timeout(600)
def test_the_bench_runs_in_its_quickest_form(tmp_path):
    """One llmgw server, 2 clients, short steps: every phase runs and every goal is printed
    (the figures themselves are not judged here)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMGW_", "DJANGO_"))}
    proc = subprocess.run(
        [sys.executable, str(gw.ROOT / "bench" / "gateway.py"), "--servers", "uvicorn", "--concurrency", "2",
         "--duration-s", "0.3", "--latency-s", "0.2", "--stall-requests", "30", "--litellm", "off", "--json"],
        capture_output=True, text=True, env=env, cwd=gw.ROOT, timeout=540, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert [r["name"] for r in data["results"]] == ["direct", "uvicorn", "floor", "floor-django", "as-shipped"]
    uvicorn = data["results"][1]
    for floor in data["results"][2:4]:  # the bare proxy and the trivial Django view answer
        assert all(s["ok"] and not s["errors"] for s in floor["steps"]), floor["steps"]
    assert uvicorn["held_ms"] is not None, uvicorn["held_error"]
    assert {s["scenario"] for s in uvicorn["steps"]} == {"replica", "external", "on-demand"}
    assert data["results"][4]["stalls"]["requests"] == 30
    goals = {(g["target"], g["goal"]) for g in data["goals"]}
    assert ("as-shipped", "stalls in 30 sequential as shipped") in goals
    assert ("uvicorn", "CPU above the stack's floor @64 (JSON / streamed)") in goals
    assert ("floor-django", "stack + Django's handler: CPU per request @64 (JSON / streamed)") in goals
    assert all(g["verdict"] in ("PASS", "MISS", "-") for g in data["goals"])


def test_a_saved_run_renders_as_the_live_one(tmp_path):
    rs = results()
    args = gw.parse_args(["--quick"])
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps(rules.as_json(rs, args, 0, {1}, ["a note"])))
    loaded = rules.load_results(json.loads(saved.read_text()))
    assert rules.report(loaded, args, ["a note"]) == rules.report(rs, args, ["a note"])
    assert rules.render_markdown(loaded, ["a note"]) == rules.render_markdown(rs, ["a note"])
