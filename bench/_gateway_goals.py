"""bench/gateway.py's goals and reports: issue 20's targets, each judged PASS/MISS from one
run's results (``evaluate_goals``), the records a run fills (``Target``, ``Step``, ``Wrk``,
``Stalls``, ``Result``), and the run as text tables, markdown (README's table) and
JSON (``as_json``, read back by ``load_results``). Pure: no process, no network."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

MODEL = "bench-model"
EXTERNAL_MODEL = "bench-external"
ON_DEMAND_MODEL = "bench-on-demand"  # + "-<server>": one cold model per server
CONCURRENCY = (1, 16, 64, 256, 1024)
QUICK_CONCURRENCY = (64, 256, 1024)
GOAL_RPS_AT = 64
GOAL_RPS = {False: 2000.0, True: 1600.0}  # stream? -> requests/s on one core
GOAL_CPU_MS = 0.5  # CPU per request at GOAL_RPS_AT clients
GOAL_ADDED_P50_MS = 0.5
GOAL_ADDED_P99_MS = 3.0
GOAL_NO_FAILURES_AT = (256, 1024)  # no timeouts, no errors at these client counts
GOAL_WITHIN = 0.10  # external / on-demand (warm) vs the replica path; N workers' CPU vs 1 worker's
GOAL_STALL_MS = 20.0  # a sequential request slower than this (added) is a stall
STALL_REQUESTS = 10_000
SERVERS = ("uvicorn", "daphne", "granian")
CHOSEN = "uvicorn"  # what `llmgw up` runs: its goals decide
AS_SHIPPED = "as-shipped"
FLOOR = "floor"  # bench/_floor_proxy.py: uvicorn + aiohttp and nothing of llmgw
FLOOR_DJANGO = "floor-django"  # bench/_floor_django.py: + Django's lean handler and a trivial view
SCENARIOS = ("external", "on-demand")
HEARTBEAT_S = 3.0
LATENCY_MIN_REQUESTS = 500
LITELLM_KEY = "sk-bench-litellm-master"
HELD_TIMEOUT_S = 60.0


# --------------------------------------------------------------------------- records
@dataclass
class Target:
    name: str
    url: str  # .../v1/chat/completions
    key: str
    pid: int | None = None


@dataclass
class Step:
    clients: int
    stream: bool
    seconds: float
    scenario: str = "replica"  # or "external", "on-demand" (warm, after held-then-served)
    ok: int = 0
    errors: int = 0
    timeouts: int = 0
    first_error: str = ""
    answered: int = 0  # every 200, warm-up and stragglers included (for CPU per request)
    cpu_s: float | None = None  # the target's CPU time over the whole step

    @property
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    @property
    def cpu_ms(self) -> float | None:
        """The target's CPU time per answered request."""
        return self.cpu_s * 1000 / self.answered if self.cpu_s is not None and self.answered else None


@dataclass
class Wrk:
    """One wrk run: requests/s, latency percentiles (ms), failures (socket errors, non-2xx,
    wrk's timeouts) and the target's CPU ms per request over it (None: /proc unread)."""

    clients: int
    rps: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    requests: int = 0
    errors: int = 0  # socket errors (connect, read, write) and non-2xx/3xx answers
    timeouts: int = 0
    cpu_ms: float | None = None
    error: str = ""  # wrk failed or printed nothing readable


@dataclass
class Stalls:
    """Sequential requests' added latency (each round trip - the direct p50, ms): how many
    were slower than ``threshold_ms`` added, and the p50, p99 and max added."""

    requests: int
    threshold_ms: float
    over: int
    p50_added_ms: float
    p99_added_ms: float
    max_added_ms: float


@dataclass
class Result:
    name: str
    kind: str = "llmgw"  # "direct", "llmgw", "as-shipped", "floor" or "litellm"
    workers: int = 1
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    latency_n: int = 0
    latency_errors: int = 0
    overhead_p50_ms: float | None = None
    overhead_p99_ms: float | None = None
    latency_cpu_ms: float | None = None  # the target's CPU time per request, one at a time
    steps: list[Step] = field(default_factory=list)
    wrk: Wrk | None = None
    held_ms: float | None = None  # held-then-served: the cold request's round trip
    held_error: str = ""
    stalls: Stalls | None = None
    profiles: dict[str, str] = field(default_factory=dict)

    def step(self, clients: int, stream: bool, scenario: str = "replica") -> Step | None:
        return next((s for s in self.steps if s.clients == clients and s.stream == stream
                     and s.scenario == scenario), None)




# --------------------------------------------------------------------------- goals
@dataclass
class Goal:
    """One goal judged for one target: its figure and target as text, ``ok`` None where it
    is reported only (N workers' req/s) or could not be measured (then ``figure`` says so)."""

    target: str
    goal: str
    figure: str
    wanted: str
    ok: bool | None

    @property
    def verdict(self) -> str:
        return "-" if self.ok is None else ("PASS" if self.ok else "MISS")


def _rps_goal(r: Result, stream: bool) -> Goal:
    mode = "streamed" if stream else "JSON"
    s = r.step(GOAL_RPS_AT, stream)
    wanted = f">= {GOAL_RPS[stream]:,.0f}/s"
    if s is None:
        return Goal(r.name, f"req/s {mode} @{GOAL_RPS_AT}", "not measured", wanted, None)
    if s.cpu_ms:
        cap = r.workers * 1000 / s.cpu_ms
        return Goal(r.name, f"req/s {mode} @{GOAL_RPS_AT}",
                    f"cap {cap:,.0f}/s from CPU (decides), {s.rps:,.0f}/s measured", wanted, cap >= GOAL_RPS[stream])
    return Goal(r.name, f"req/s {mode} @{GOAL_RPS_AT}", f"{s.rps:,.0f}/s measured (decides: no CPU read)", wanted,
                s.rps >= GOAL_RPS[stream])


def _within_goals(r: Result, scenario: str) -> list[Goal]:
    out = []
    for stream in (False, True):
        mode = "streamed" if stream else "JSON"
        base, s = r.step(GOAL_RPS_AT, stream), r.step(GOAL_RPS_AT, stream, scenario)
        name = f"{scenario} vs replica, {mode} @{GOAL_RPS_AT}"
        wanted = f"CPU <= {1 + GOAL_WITHIN:.2f}x, req/s >= {1 - GOAL_WITHIN:.2f}x"
        if base is None or s is None or not base.rps:
            out.append(Goal(r.name, name, "not measured", wanted, None))
            continue
        rps_ratio = s.rps / base.rps
        figure = f"req/s {s.rps:,.0f} vs {base.rps:,.0f} ({rps_ratio:.2f}x)"
        ok = rps_ratio >= 1 - GOAL_WITHIN
        if s.cpu_ms and base.cpu_ms:
            cpu_ratio = s.cpu_ms / base.cpu_ms
            figure = f"CPU {s.cpu_ms:.3f} vs {base.cpu_ms:.3f} ms ({cpu_ratio:.2f}x), " + figure
            ok = ok and cpu_ratio <= 1 + GOAL_WITHIN
        out.append(Goal(r.name, name, figure, wanted, ok))
    return out


def _latency_goals(r: Result, direct: Result, how: str) -> list[Goal]:
    added50, added99 = r.p50_ms - direct.p50_ms, r.p99_ms - direct.p99_ms
    return [Goal(r.name, f"added p50, one client{how}", f"{added50:+.3f} ms", f"<= {GOAL_ADDED_P50_MS:g} ms",
                 None if math.isnan(added50) else added50 <= GOAL_ADDED_P50_MS),
            Goal(r.name, f"added p99, one client{how}", f"{added99:+.3f} ms", f"<= {GOAL_ADDED_P99_MS:g} ms",
                 None if math.isnan(added99) else added99 <= GOAL_ADDED_P99_MS)]


def evaluate_goals(results: list[Result]) -> list[Goal]:
    """Every goal of issue 20's gateway part, judged per target (``results[0]`` is the
    direct baseline): the one-worker servers' req/s (cap from CPU deciding), CPU per request,
    added latency, failures at 256 and 1,024 clients, the external and on-demand scenarios;
    the as-shipped gateway's added latency and stalls; N workers' CPU per request against
    one uvicorn worker's, and their req/s (reported)."""
    direct = results[0]
    goals: list[Goal] = []
    one_worker = {r.name: r for r in results if r.kind == "llmgw" and r.workers == 1}
    for r in results[1:]:
        if r.kind == AS_SHIPPED:
            goals += _latency_goals(r, direct, " as shipped")
            st = r.stalls
            if st is None or not st.requests:
                goals.append(Goal(r.name, "stalls, sequential as shipped", "not measured",
                                  f"0 over {GOAL_STALL_MS:g} ms added", None))
            else:
                goals.append(Goal(r.name, f"stalls in {st.requests:,} sequential as shipped",
                                  f"{st.over} over {st.threshold_ms:g} ms added (max +{st.max_added_ms:.1f} ms, "
                                  f"p99 +{st.p99_added_ms:.2f} ms)", f"0 over {GOAL_STALL_MS:g} ms", st.over == 0))
            continue
        if r.kind != "llmgw":
            continue
        goals += [_rps_goal(r, False), _rps_goal(r, True)]
        cpus = [s.cpu_ms for s in (r.step(GOAL_RPS_AT, False), r.step(GOAL_RPS_AT, True)) if s and s.cpu_ms]
        goals.append(Goal(r.name, f"CPU per request @{GOAL_RPS_AT} (JSON / streamed)",
                          " / ".join(f"{c:.3f}" for c in cpus) + " ms" if cpus else "not measured",
                          f"<= {GOAL_CPU_MS:g} ms", max(cpus) <= GOAL_CPU_MS if cpus else None))
        if r.workers == 1:
            goals += _latency_goals(r, direct, "")
        for clients in GOAL_NO_FAILURES_AT:
            steps = [s for s in r.steps if s.clients == clients and s.scenario == "replica"]
            if not steps:
                continue
            t, e = sum(s.timeouts for s in steps), sum(s.errors for s in steps)
            answered = min(s.answered for s in steps)  # a step that answered nothing proves nothing
            goals.append(Goal(r.name, f"failures @{clients:,} clients",
                              f"{t} timeouts, {e} errors ({answered:,} answered in the emptiest step)",
                              "0, 0, some answered", t == 0 and e == 0 and answered > 0))
        if r.workers == 1:
            for scenario in SCENARIOS:
                if any(s.scenario == scenario for s in r.steps) or (scenario == "on-demand" and r.held_error):
                    if scenario == "on-demand":
                        goals.append(Goal(r.name, "held-then-served (cold request)",
                                          f"{r.held_ms:,.0f} ms to its answer" if r.held_ms is not None
                                          else r.held_error, "served (200)", r.held_ms is not None))
                    goals += _within_goals(r, scenario)
        else:
            base = one_worker.get(CHOSEN)
            b, s = (base.step(GOAL_RPS_AT, False) if base else None), r.step(GOAL_RPS_AT, False)
            name = f"CPU per request, {r.workers} workers vs 1, JSON @{GOAL_RPS_AT}"
            if b and s and b.cpu_ms and s.cpu_ms:
                ratio = s.cpu_ms / b.cpu_ms
                goals.append(Goal(r.name, name, f"{s.cpu_ms:.3f} vs {b.cpu_ms:.3f} ms ({ratio:.2f}x)",
                                  f"<= {1 + GOAL_WITHIN:.2f}x", ratio <= 1 + GOAL_WITHIN))
                goals.append(Goal(r.name, f"req/s, {r.workers} workers vs 1, JSON @{GOAL_RPS_AT}",
                                  f"{s.rps:,.0f} vs {b.rps:,.0f}/s ({fmt_ratio(s.rps, b.rps)})", "reported", None))
            else:
                goals.append(Goal(r.name, name, "not measured", f"<= {1 + GOAL_WITHIN:.2f}x", None))
    floor = next((r for r in results if r.name == FLOOR), None)
    if floor is not None:
        goals += _floor_goals(floor, one_worker.get(CHOSEN), direct,
                              next((r for r in results if r.name == FLOOR_DJANGO), None))
        for r in results:
            if r.kind == FLOOR and r.workers > 1:
                b, s = floor.step(GOAL_RPS_AT, False), r.step(GOAL_RPS_AT, False)
                figure = (f"{s.cpu_ms:.3f} vs {b.cpu_ms:.3f} ms ({s.cpu_ms / b.cpu_ms:.2f}x)"
                          if b and s and b.cpu_ms and s.cpu_ms else "not measured")
                goals.append(Goal(r.name, f"stack alone: CPU per request, {r.workers} workers vs 1, JSON @{GOAL_RPS_AT}",
                                  figure, "reported", None))
    return goals


def _cpu_pair(r: Result) -> tuple[float | None, float | None]:
    """CPU ms per request at :data:`GOAL_RPS_AT` clients, (JSON, streamed); None: not read."""
    return tuple(s.cpu_ms if (s := r.step(GOAL_RPS_AT, stream)) else None for stream in (False, True))


def _floor_goals(floor: Result, chosen: Result | None, direct: Result,
                 django: Result | None = None) -> list[Goal]:
    """What the stack costs by itself (:data:`FLOOR`) and with Django's lean handler
    (:data:`FLOOR_DJANGO`) — reported, never judged: neither is llmgw — and what llmgw costs
    above the stack, per request at :data:`GOAL_RPS_AT` clients and one client at a time;
    the goal a floor already exceeds cannot be met on that stack."""
    def pair(values) -> str:
        return " / ".join("-" if v is None else f"{v:.3f}" for v in values) + " ms"

    goals = []
    for r, what in ((floor, "stack alone"), (django, "stack + Django's handler")):
        if r is None:
            continue
        cpus = _cpu_pair(r)
        over = [mode for mode, c in zip(("JSON", "streamed"), cpus) if c is not None and c > GOAL_CPU_MS]
        verdict = (f"; over the {GOAL_CPU_MS:g} ms goal by itself ({', '.join(over)})" if over else
                   f"; within the {GOAL_CPU_MS:g} ms goal by itself")
        goals += [Goal(r.name, f"{what}: CPU per request @{GOAL_RPS_AT} (JSON / streamed)",
                       pair(cpus) + (verdict if any(c is not None for c in cpus) else ""), "reported", None),
                  Goal(r.name, f"{what}: added p50 / p99, one client",
                       f"{r.p50_ms - direct.p50_ms:+.3f} / {r.p99_ms - direct.p99_ms:+.3f} ms", "reported", None)]
    cpus = _cpu_pair(floor)
    if chosen is not None:
        mine = _cpu_pair(chosen)
        above = [None if a is None or b is None else a - b for a, b in zip(mine, cpus)]
        goals.append(Goal(chosen.name, f"CPU above the stack's floor @{GOAL_RPS_AT} (JSON / streamed)",
                          " / ".join("-" if v is None else f"{v:+.3f}" for v in above)
                          + f" ms (llmgw {pair(mine)}, floor {pair(cpus)})", "reported", None))
        goals.append(Goal(chosen.name, "added p50 / p99 above the stack's floor, one client",
                          f"{chosen.p50_ms - floor.p50_ms:+.3f} / {chosen.p99_ms - floor.p99_ms:+.3f} ms",
                          "reported", None))
    return goals


def render_goals(goals: list[Goal]) -> list[str]:
    """The goals block: one line per goal, target, figure, wanted, verdict."""
    if not goals:
        return []
    w_target = max(len(g.target) for g in goals)
    w_goal = max(len(g.goal) for g in goals)
    out = [f"goals ({CHOSEN}, what `llmgw up` runs, and {AS_SHIPPED} decide; the other servers for comparison):"]
    for g in goals:
        out.append(f"  {g.verdict:<4}  {g.target:<{w_target}}  {g.goal:<{w_goal}}  {g.figure}  (goal {g.wanted})")
    return out


# --------------------------------------------------------------------------- reporting
def fmt_ratio(value: float, base: float) -> str:
    if not base or value is None or math.isnan(value) or math.isnan(base):
        return "-"
    return f"{value / base:.2f}x"


def render_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """Aligned text columns: the first left-aligned, the rest right-aligned, a rule under
    the head."""
    widths = [max(len(str(row[i])) for row in [head] + rows) for i in range(len(head))]
    line = lambda row: "  ".join(  # noqa: E731
        str(c).ljust(widths[i]) if i == 0 else str(c).rjust(widths[i]) for i, c in enumerate(row)).rstrip()
    return [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]


def table_rows(results: list[Result], concurrency) -> tuple[list[str], list[list[str]]]:
    """(head, rows) of the comparison table: direct, then each target and its ratio to
    direct (latency and CPU ratios > 1 are slower, req/s ratios < 1 are slower)."""
    direct, others = results[0], results[1:]
    head = ["scenario", "direct"] + [c for r in others for c in (r.name, "ratio")]
    rows: list[list[str]] = []

    def num(v: float | None, fmt: str = ".3f") -> str:
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    def add(label: str, d: float | None, values: list[float | None], fmt: str = ".3f", ratio: bool = True) -> None:
        if all(v is None or (isinstance(v, float) and math.isnan(v)) for v in [d, *values]):
            return
        rows.append([label, num(d, fmt)] + [c for v in values for c in (
            num(v, fmt), fmt_ratio(v, d) if ratio and v is not None and d else "")])

    def cell_step(s: Step | None) -> str:
        if s is None:
            return "-"
        flag = f" ({s.errors}e/{s.timeouts}t)" if s.errors or s.timeouts else ""
        return f"{s.rps:.0f}{flag}"

    add("latency p50 ms", direct.p50_ms, [r.p50_ms for r in others])
    add("latency p99 ms", direct.p99_ms, [r.p99_ms for r in others])
    rows.append(["added p50 ms", "-"] + [c for r in others for c in (num(r.p50_ms - direct.p50_ms, "+.3f"), "")])
    rows.append(["added p99 ms", "-"] + [c for r in others for c in (num(r.p99_ms - direct.p99_ms, "+.3f"), "")])
    if any(r.overhead_p50_ms is not None for r in others):
        rows.append(["X-Llmgw-Overhead p50/p99 ms", "-"] + [c for r in others for c in (
            f"{r.overhead_p50_ms:.2f}/{r.overhead_p99_ms:.2f}" if r.overhead_p50_ms is not None else "-", "")])
    if any(r.stalls for r in others):
        def stall_cell(r: Result, what: str) -> str:
            st = r.stalls
            if st is None:
                return "-"
            return {"n": f"{st.requests:,}", "over": str(st.over), "p99": f"+{st.p99_added_ms:.2f}",
                    "max": f"+{st.max_added_ms:.1f}"}[what]
        for what, label in (("n", "sequential requests"), ("over", f"stalls > {GOAL_STALL_MS:g} ms added"),
                            ("p99", "sequential added p99 ms"), ("max", "sequential added max ms")):
            rows.append([label, "-"] + [c for r in others for c in (stall_cell(r, what), "")])
    for clients in concurrency:
        for stream in (False, True):
            d = direct.step(clients, stream)
            label = f"req/s {clients:>4} clients {'stream' if stream else 'json'}"
            rows.append([label, cell_step(d)] + [c for r in others for c in (
                cell_step(r.step(clients, stream)),
                fmt_ratio(r.step(clients, stream).rps, d.rps) if d and r.step(clients, stream) else "-")])
    for scenario in SCENARIOS:
        if not any(s.scenario == scenario for r in others for s in r.steps):
            continue
        if scenario == "on-demand":
            rows.append(["held-then-served ms", "-"] + [c for r in others for c in (
                f"{r.held_ms:.0f}" if r.held_ms is not None else ("failed" if r.held_error else "-"), "")])
        for stream in (False, True):
            d = direct.step(GOAL_RPS_AT, stream)
            label = f"{scenario} req/s {GOAL_RPS_AT} {'stream' if stream else 'json'}"
            steps = [r.step(GOAL_RPS_AT, stream, scenario) for r in others]
            rows.append([label, cell_step(d)] + [c for s in steps for c in (
                cell_step(s), fmt_ratio(s.rps, d.rps) if d and s else "-")])
    if any(r.wrk for r in results):
        add(f"wrk req/s {GOAL_RPS_AT} json", direct.wrk.rps if direct.wrk else None,
            [r.wrk.rps if r.wrk else None for r in others], ".0f")
        add(f"wrk p50 ms {GOAL_RPS_AT} json", direct.wrk.p50_ms if direct.wrk else None,
            [r.wrk.p50_ms if r.wrk else None for r in others])
        add(f"wrk p99 ms {GOAL_RPS_AT} json", direct.wrk.p99_ms if direct.wrk else None,
            [r.wrk.p99_ms if r.wrk else None for r in others])
        rows.append([f"wrk errors/timeouts {GOAL_RPS_AT}", _wrk_fail(direct)]
                    + [c for r in others for c in (_wrk_fail(r), "")])
    add("cpu ms/req sequential", direct.latency_cpu_ms, [r.latency_cpu_ms for r in others])
    for clients in concurrency:
        for stream in (False, True):
            d = direct.step(clients, stream)
            add(f"cpu ms/req {clients:>4} clients {'stream' if stream else 'json'}", d.cpu_ms if d else None,
                [s.cpu_ms if (s := r.step(clients, stream)) else None for r in others])
    for scenario in SCENARIOS:
        for stream in (False, True):
            d = direct.step(GOAL_RPS_AT, stream)
            add(f"cpu ms/req {scenario} {GOAL_RPS_AT} {'stream' if stream else 'json'}", d.cpu_ms if d else None,
                [s.cpu_ms if (s := r.step(GOAL_RPS_AT, stream, scenario)) else None for r in others])
    if any(r.wrk for r in results):
        add(f"cpu ms/req wrk {GOAL_RPS_AT} json", direct.wrk.cpu_ms if direct.wrk else None,
            [r.wrk.cpu_ms if r.wrk else None for r in others])
    return head, rows


def _wrk_fail(r: Result) -> str:
    if r.wrk is None:
        return "-"
    return "failed" if r.wrk.error else f"{r.wrk.errors}/{r.wrk.timeouts}"


def report(results: list[Result], args, notes: list[str]) -> str:
    """The text report: the table, the goals block, the notes."""
    head, rows = table_rows(results, args.concurrency)
    out = render_table(head, rows)
    out.append("")
    out += render_goals(evaluate_goals(results))
    out.append("  (cap = workers x 1000 / CPU ms per request at that step: what the gateway's core(s) to itself "
               "would serve; req/s themselves depend on what else this machine runs)")
    out += [f"note: {n}" for n in notes]
    return "\n".join(out)


def render_markdown(results: list[Result], notes: list[str] | None = None) -> str:
    """The README's benchmark table (one column per gateway target, rows at 64 clients) and
    the goals as a list, in markdown, for pasting."""
    direct, others = results[0], [r for r in results[1:]]
    cols = [r for r in others if r.kind != AS_SHIPPED]
    shipped = next((r for r in others if r.kind == AS_SHIPPED), None)

    def n0(v: float | None) -> str:
        return "-" if v is None or math.isnan(v) else f"{v:,.0f}"

    def step_cell(r: Result, stream: bool, scenario: str = "replica") -> str:
        s = r.step(GOAL_RPS_AT, stream, scenario)
        return n0(s.rps) if s else "-"

    def cpu_cell(r: Result, scenario: str = "replica") -> str:
        cpus = [s.cpu_ms if (s := r.step(GOAL_RPS_AT, stream, scenario)) else None for stream in (False, True)]
        return " / ".join("-" if c is None else f"{c:.2f}" for c in cpus)

    def added(r: Result) -> str:
        a50, a99 = r.p50_ms - direct.p50_ms, r.p99_ms - direct.p99_ms
        return "-" if math.isnan(a50) else f"{a50:+.2f} / {a99:+.1f} ms"

    def failures(r: Result, clients: int) -> str:
        steps = [s for s in r.steps if s.clients == clients and s.scenario == "replica"]
        return "-" if not steps else str(sum(s.timeouts + s.errors for s in steps))

    def wrk_cell(r: Result) -> str:
        w = r.wrk
        if w is None or w.error:
            return "-"
        if not w.requests:  # e.g. a server still working off the 1,024-client step's backlog
            return "none answered"
        return f"{w.rps:,.0f} ({w.p50_ms:.2f} / {w.p99_ms:.2f} ms)"

    def name(r: Result) -> str:
        if r.name == FLOOR_DJANGO:
            return "floor: + Django's lean handler, no llmgw"
        if r.kind == FLOOR:
            return "floor: uvicorn + aiohttp, no llmgw" + (f", {r.workers} workers" if r.workers > 1 else "")
        label = f"uvicorn, {r.workers} workers" if r.workers > 1 else r.name
        return f"{label} (chosen)" if r.name == CHOSEN else label

    rows = [
        ("requests/s, JSON", [step_cell(r, False) for r in cols]),
        ("requests/s, streamed", [step_cell(r, True) for r in cols]),
        ("CPU ms per request (JSON / streamed)", [cpu_cell(r) for r in cols]),
        ("requests/s, JSON, wrk (p50 / p99)", [wrk_cell(r) for r in cols]),
        ("external model: requests/s JSON / streamed",
         [f"{step_cell(r, False, 'external')} / {step_cell(r, True, 'external')}" for r in cols]),
        ("external model: CPU ms per request", [cpu_cell(r, "external") for r in cols]),
        ("on-demand, held then warm: requests/s JSON / streamed",
         [f"{step_cell(r, False, 'on-demand')} / {step_cell(r, True, 'on-demand')}" for r in cols]),
        ("on-demand, warm: CPU ms per request", [cpu_cell(r, "on-demand") for r in cols]),
        ("added latency p50 / p99, one client", [added(r) for r in cols]),
        ("timeouts + errors at 256 / 1,024 clients",
         [f"{failures(r, 256)} / {failures(r, 1024)}" for r in cols]),
    ]
    head = [f"at {GOAL_RPS_AT} clients"] + [name(r) for r in cols]
    if shipped is not None:
        head.append("as `llmgw up` runs it")
        st = shipped.stalls
        extra = {"added latency p50 / p99, one client": added(shipped)}
        rows = [(label, cells + [extra.get(label, "-")]) for label, cells in rows]
        if st is not None:
            rows.append((f"stalls > {GOAL_STALL_MS:g} ms added in {st.requests:,} sequential (max)",
                         ["-"] * len(cols) + [f"{st.over} (+{st.max_added_ms:.1f} ms)"]))
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join([label, *cells]) + " |" for label, cells in rows]
    out.append("")
    out += [f"* {g.verdict} {g.target}: {g.goal} — {g.figure} (goal {g.wanted})" for g in evaluate_goals(results)]
    out += [f"* note: {n}" for n in notes or []]
    return "\n".join(out)



def load_results(data: dict) -> list[Result]:
    """The results of a run saved with ``--json`` (:func:`as_json`), as :class:`Result` objects."""
    def num(v):
        return float("nan") if v is None else v

    out = []
    for r in data["results"]:
        r = dict(r)
        steps = [Step(**{k: v for k, v in s.items() if k not in ("rps", "cpu_ms")}) for s in r.pop("steps")]
        wrk = Wrk(**{k: num(v) if k in ("p50_ms", "p99_ms") else v for k, v in r.pop("wrk").items()}) \
            if r.get("wrk") else r.pop("wrk", None)
        stalls = Stalls(**{k: num(v) for k, v in r.pop("stalls").items()}) if r.get("stalls") else r.pop("stalls", None)
        r["p50_ms"], r["p99_ms"] = num(r["p50_ms"]), num(r["p99_ms"])
        out.append(Result(**r, steps=steps, wrk=wrk, stalls=stalls))
    return out




def as_json(results: list[Result], args, gateway_core: int, load_cores: set[int], notes: list[str]) -> dict:
    """The run as JSON-ready data: its arguments, cores, notes, every result (steps with
    their req/s and CPU ms per request) and every goal (:func:`evaluate_goals`)."""
    def clean(v):
        if isinstance(v, float) and math.isnan(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    return clean({
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "cores": {"gateway": gateway_core, "load": sorted(load_cores)}, "notes": notes,
        "results": [{**asdict(r), "steps": [{**asdict(s), "rps": s.rps, "cpu_ms": s.cpu_ms} for s in r.steps]}
                    for r in results],
        "goals": [{**asdict(g), "verdict": g.verdict} for g in evaluate_goals(results)],
    })


