"""``llmgw simulate``: what a catalog costs and how it serves, before it touches a GPU.

Runs a trace through a simulated fleet in simulated time, with the real planner deciding
(``fleet.simulation``); reports per model and in total, against a static fleet sized for the
peak, and saves a plot of GPUs and replicas over time. A trace whose requests carry prefixes
(``prefix_id``, ``prefix_tokens``) also gets each model's prefix-cache hit rate and the
prefill tokens saved, routed by the catalog's ``routing_policy`` (issue 17). ``--compare``
referees the trace through every policy of ``fleet.simulation.referee`` — llmgw with and
without its warm-before-demand rules, the static fleet, Ollama/llama-swap-like and
Kubernetes HPA+KEDA-like — in one run, and plots the GPUs each held (issue 18).
"""

from __future__ import annotations

import dataclasses

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings

from fleet.simulation import traces
from gateway.models import UsageRecord
from fleet.simulation import (
    SimConfig,
    baseline,
    catalog_from_db,
    compare,
    fleet_from_db,
    parse_fleet,
    plot,
    read_catalog,
    simulate,
)
from fleet.planning.routing import POLICIES
from fleet.simulation.referee import DESCRIPTIONS, LABELS, POLICIES as REFEREE_POLICIES, ROWS, ahead, plot_policies
from fleet.simulation.referee import policy_rows, referee
from fleet.simulation.referee import totals as policy_totals
from fleet.simulation.scenarios import SCENARIOS, diurnal_long_tail, diurnal_long_tail_history, shared_prefixes
from llmgw.cli.output import FAILED, OK, USAGE, console, table, write_json

HELP = ("Simulate a trace on a fleet with the real planner: requests served, held and rejected, TTFT "
        "against the SLO, GPU-hours, scale steps, against a static fleet sized for the peak. "
        "An estimate, not a measurement: see its limits below. "
        "Exit 0 done, 1 the trace has no requests, 2 bad input (a bad trace line is named by its number).")

LIMITS = """what it does not model (read its figures as estimates of placement, scaling and cold starts):
  engines: a replica serves `slots` requests at once (its benchmark, else 8) at a fixed speed:
    TTFT = wait + ttft_base_ms + prefill_ms_per_token x prompt tokens, then tpot_ms per token;
    no batching slowdown, no KV-cache memory limit, no context-length refusals, no engine errors
  failures: engines never crash or fail to start, agents never go silent, no network delays;
    cold starts take exactly cold_start_s (from the catalog, else --cold-start), stops 5 s
  tenants: no API keys, team limits, budgets or admission-queue priorities: every request is
    admitted (the gateway's rate limits and fair share are not simulated)
  GPUs: placement by the catalog's GPU count and memory per GPU; no fragmentation within a GPU,
    no other processes, no real memory readings; --from-db leaves external models out
  traces: a year at most (t_s up to 31,622,400 s; usage records spanning 366 days), instants
    between 1970 and 2200"""

EPILOG = """examples:
  llmgw simulate --scenario diurnal-long-tail                     the published day (1M requests, 200 models)
  llmgw simulate --scenario shared-prefixes                       tenants' system prompts, prefix-affinity
  llmgw simulate --trace day.jsonl --catalog catalog.yaml --fleet 8x8xH100-80G
  llmgw simulate --usage-records --since 24h --from-db            replay the last day of this cluster
  llmgw simulate --scenario diurnal-long-tail --compare           every policy on the published day
trace files: JSONL or CSV with t_s, model, prompt_tokens, output_tokens (see fleet/simulation/traces.py);
usage-record exports (at, model, prompt_tokens, completion_tokens, total_ms) are replayed too.
prefixes: a trace may add per request prefix_id (a name for the prompt's shared start, e.g. a
  tenant's system prompt) and prefix_tokens (its length, 0..prompt_tokens), both or neither (CSV:
  two more columns, empty without a prefix). Replicas then keep a prefix cache (the catalog's
  prefix_cache_slots per model, default 4, LRU), requests route by the model's routing_policy
  (least-loaded, prefix-affinity, session), and a cached prefix skips prefix_tokens x
  prefill_ms_per_token of TTFT; the report adds the hit rate and prefill tokens saved."""


try:
    from yaml import YAMLError as _YAMLError
except ImportError:  # PyYAML is optional (YAML catalogs only)
    _YAMLError = None
#: What bad input raises while reading the trace, catalog and options: said in one line, exit 2.
_INPUT_ERRORS = (OSError, ValueError, ImportError) + ((_YAMLError,) if _YAMLError else ())


def add_arguments(parser) -> None:
    parser.epilog = EPILOG + "\n\n" + LIMITS
    source = parser.add_argument_group("what to simulate")
    source.add_argument("--trace", metavar="FILE", help="trace or usage-record export (.jsonl/.csv, optionally "
                        ".gz); optional prefix_id and prefix_tokens per request (see below)")
    source.add_argument("--usage-records", action="store_true",
                        help="replay this cluster's usage records from the database as the trace")
    source.add_argument("--since", default="24h", help="with --usage-records: ISO 8601 instant or a span like 24h, 7d")
    source.add_argument("--scenario", choices=SCENARIOS, help="a ready-made catalog, fleet and trace")
    source.add_argument("--requests", type=int, default=None, help="with --scenario (default 1,000,000 for "
                        "diurnal-long-tail, 7,200 for shared-prefixes)")
    source.add_argument("--models", type=int, default=200, help="with --scenario diurnal-long-tail (default 200)")
    source.add_argument("--seed", type=int, default=1, help="with --scenario: the trace's seed (default 1)")
    source.add_argument("--catalog", metavar="FILE", help="catalog file (.json, .yaml)")
    source.add_argument("--from-db", action="store_true", help="the catalog (and, without --fleet, the agents) "
                        "from this cluster's database")
    source.add_argument("--fleet", metavar="SPEC", help="e.g. 8x8xH100-80G (agents × GPUs × memory); "
                        "join specs with +")
    how = parser.add_argument_group("how")
    how.add_argument("--baseline", default="peak", metavar="peak|N",
                     help="static fleet to compare with: sized for each model's peak (default), or N per model")
    how.add_argument("--no-baseline", action="store_true", help="no static fleet to compare with")
    how.add_argument("--routing-policy", choices=POLICIES, default=None,
                     help="route every model by this policy instead of its own (compare two runs: "
                          "least-loaded against prefix-affinity on a trace with prefixes)")
    how.add_argument("--interval", type=float, default=None,
                     help="seconds between reconcile passes (default: LLMGW_RECONCILE_INTERVAL)")
    how.add_argument("--duration", type=float, default=None, help="seconds to simulate (default: the trace, "
                     "rounded up to an hour)")
    how.add_argument("--compare", action="store_true",
                     help="referee the trace through every policy (llmgw with and without its warm-before-demand "
                     "rules, static, Ollama/llama-swap-like, Kubernetes HPA+KEDA-like) and compare them")
    how.add_argument("--policies", metavar="LIST", default=None,
                     help="a comma-separated subset of " + ",".join(REFEREE_POLICIES) + " (implies --compare)")
    how.add_argument("--history", metavar="FILE", default=None,
                     help="a trace of requests before this one (same formats): the on-demand models' arrival "
                     "profiles are learned from it (predictive warmth)")
    how.add_argument("--history-weeks", type=int, default=4,
                     help="with --scenario diurnal-long-tail or --usage-records: the weeks of history before the "
                     "trace to learn from (default 4; 0: none, as on a new cluster)")
    how.add_argument("--cold-start", type=float, default=60.0,
                     help="seconds from placement to ready for models that do not say (default 60)")
    out = parser.add_argument_group("output")
    out.add_argument("--plot", metavar="PNG", help="where to save the plot (default: ./simulate-NAME.png)")
    out.add_argument("--no-plot", action="store_true", help="save no plot")
    out.add_argument("--save-trace", metavar="FILE", help="also write the trace simulated (.jsonl/.csv)")
    out.add_argument("--top", type=int, default=15, help="models shown in the table (default 15)")
    out.add_argument("--json", action="store_true", help="machine-readable output")


def _since(text: str) -> datetime:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text and text[-1] in units and text[:-1].replace(".", "", 1).isdigit():
        return datetime.now(UTC) - timedelta(seconds=float(text[:-1]) * units[text[-1]])
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _usage_trace(since: datetime) -> traces.Trace:
    rows = (UsageRecord.objects.filter(at__gte=since).order_by("at")
            .values_list("at", "model_name", "prompt_tokens", "completion_tokens", "total_ms"))
    return traces.from_usage(rows.iterator(), f"usage records since {since:%Y-%m-%d %H:%M} UTC")


def _history(options, trace: traces.Trace) -> traces.Trace | None:
    """The requests before ``trace`` the on-demand models learn their arrival profiles from:
    ``--history FILE``, else (with ``--usage-records``) the usage records of the
    ``--history-weeks`` before the trace's start; None without either."""
    if options.get("history"):
        return traces.read_trace(options["history"])
    weeks = options.get("history_weeks") or 0
    if options.get("usage_records") and weeks > 0 and len(trace):
        since = trace.start - timedelta(weeks=weeks)
        rows = (UsageRecord.objects.filter(at__gte=since, at__lt=trace.start).order_by("at")
                .values_list("at", "model_name", "prompt_tokens", "completion_tokens", "total_ms"))
        history = traces.from_usage(rows.iterator(), f"usage records of the {weeks} weeks before")
        return history if len(history) else None
    return None


def _inputs(options):
    """(catalog, fleet, trace, name, history) from the options; ValueError for what is missing."""
    fleet = parse_fleet(options["fleet"]) if options["fleet"] else ()
    if options["scenario"] == "shared-prefixes":
        catalog, spec, trace = shared_prefixes(options["requests"] or 7200, options["seed"])
        return catalog, fleet or parse_fleet(spec), trace, options["scenario"], _history(options, trace)
    if options["scenario"]:
        requests = options["requests"] or 1_000_000
        catalog, spec, trace = diurnal_long_tail(options["models"], requests, options["seed"])
        weeks = options.get("history_weeks") or 0
        history = _history(options, trace) or (
            diurnal_long_tail_history(options["models"], requests, options["seed"], weeks) if weeks > 0 else None)
        return catalog, fleet or parse_fleet(spec), trace, options["scenario"], history
    if bool(options["catalog"]) == bool(options["from_db"]):
        raise ValueError("give the catalog: --catalog FILE or --from-db (or --scenario)")
    catalog = (read_catalog(options["catalog"], options["cold_start"]) if options["catalog"]
               else catalog_from_db(options["cold_start"]))
    if options["trace"] and options["usage_records"]:
        raise ValueError("give one trace: --trace FILE or --usage-records")
    if options["trace"]:
        trace = traces.read_trace(options["trace"])
        name = Path(options["trace"]).name.split(".")[0]
    elif options["usage_records"]:
        trace = _usage_trace(_since(options["since"]))
        name = "usage"
    else:
        raise ValueError("give a trace: --trace FILE or --usage-records (or --scenario)")
    fleet = fleet or catalog.fleet or (fleet_from_db() if options["from_db"] else ())
    if not fleet:
        raise ValueError("give the fleet: --fleet SPEC like 8x8xH100-80G")
    return catalog, fleet, trace, name, _history(options, trace)


def _one_line(exc: Exception, catalog: str | None = None) -> str:
    """An input error in one line, without Python's own words: ``day.jsonl: no such file or
    directory``; a YAML catalog's parse error with its line; else the error's first line."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror[0].lower()}{exc.strerror[1:]}"
    if _YAMLError is not None and isinstance(exc, _YAMLError):
        mark = getattr(exc, "problem_mark", None)
        where = f"{catalog}:{mark.line + 1}" if mark is not None else str(catalog)
        return f"{where}: not YAML: {getattr(exc, 'problem', None) or _one_line(ValueError(str(exc)))}"
    if isinstance(exc, ImportError):
        return f"{catalog}: a YAML catalog needs PyYAML (pip install pyyaml), or write it as JSON"
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def run(options, stdout, stderr) -> int:
    try:
        catalog, fleet, trace, name, history = _inputs(options)
        policies = [p.strip() for p in (options.get("policies") or "").split(",") if p.strip()]
        unknown = [p for p in policies if p not in REFEREE_POLICIES]
        if unknown:
            raise ValueError(f"--policies: unknown {', '.join(unknown)} (known: {', '.join(REFEREE_POLICIES)})")
        if options["interval"] is not None and not options["interval"] > 0:
            raise ValueError("--interval takes seconds > 0")
        if options["duration"] is not None and not options["duration"] > 0:
            raise ValueError("--duration takes seconds > 0")
        count = None
        if not options["no_baseline"] and options["baseline"] != "peak":
            count = int(options["baseline"])
            if count < 0:
                raise ValueError("--baseline takes peak or a replica count ≥ 0")
    except _INPUT_ERRORS as exc:
        stderr.write(f"{_one_line(exc, options.get('catalog'))}\n")
        return USAGE
    if options.get("routing_policy"):
        catalog = dataclasses.replace(catalog, models=tuple(
            dataclasses.replace(m, routing_policy=options["routing_policy"]) for m in catalog.models))
    if not len(trace):
        stderr.write("the trace has no requests\n")
        return FAILED
    if options["save_trace"]:
        traces.write_trace(trace, options["save_trace"])
    interval = options["interval"] or float(getattr(settings, "LLMGW_RECONCILE_INTERVAL_S", 3.0))
    config = SimConfig(reconcile_interval_s=interval, duration_s=options["duration"])
    if options.get("compare") or policies:
        return _compare(options, catalog, fleet, trace, history, config, policies or list(REFEREE_POLICIES), name,
                        stdout, stderr)
    began = time.perf_counter()
    ours = simulate(catalog, fleet, trace, config, history=history)
    base = None if options["no_baseline"] else baseline(catalog, fleet, trace, config, count)
    wall_s = time.perf_counter() - began
    comparison = compare(ours, base) if base else None
    png = None
    if not options["no_plot"]:
        png = str(plot(ours, options["plot"] or f"simulate-{name}.png", base))
    if options["json"]:
        write_json(stdout, {"llmgw": ours.data, "baseline": base.data if base else None,
                            "comparison": comparison, "plot": png,
                            "wall_s": {"total": round(wall_s, 2), "llmgw": round(ours.wall_s, 2),
                                       "plan": round(ours.plan_wall_s, 2)}})
        return OK
    _print(console(stdout), ours, base, comparison, png, wall_s, options["top"])
    return OK


def _compare(options, catalog, fleet, trace, history, config, policies, name, stdout, stderr) -> int:
    """``--compare``: every policy of ``fleet.simulation.referee`` on the trace, a table
    (or ``--json``) and one plot of the GPUs each held."""
    out = console(stdout)
    began = time.perf_counter()
    progress = (lambda label: None) if options["json"] else (lambda label: out.print(f"  simulating: {label}"))
    entries = referee(catalog, fleet, trace, config, history, policies, progress)
    wall_s = time.perf_counter() - began
    png = None if options["no_plot"] else str(plot_policies(entries, options["plot"] or f"simulate-{name}-compare.png"))
    ours = next((e for e in entries if e.key == "llmgw"), None)
    verdicts = [ahead(ours, e) for e in entries if ours is not None and e.key in ("ollama", "hpa")]
    if options["json"]:
        write_json(stdout, {"policies": policy_rows(entries), "ahead": verdicts, "plot": png,
                            "history_requests": len(history) if history is not None else 0,
                            "reports": {e.key: e.report.data for e in entries}, "wall_s": round(wall_s, 2)})
        return OK
    d = entries[0].report.data
    out.print(f"[bold]{d['trace']['description']}[/]")
    out.print(f"catalog: {d['catalog']['models']} models; fleet: {d['fleet']['summary']}; history for the arrival "
              f"profiles: {f'{len(history):,} requests' if history is not None else 'none'}")
    rows = [[label] + [_fmt(policy_totals(e)[key], kind) for e in entries] for key, label, kind in ROWS]
    rows.insert(0, ["fleet"] + [e.report.data["fleet"]["summary"] for e in entries])
    title = "every policy, the same trace" if len(entries) == len(REFEREE_POLICIES) else \
        f"{len(entries)} policies, the same trace"
    out.print(table(title, [""] + [LABELS[e.key] for e in entries], rows))
    for e in entries:
        out.print(f"  {LABELS[e.key]}: {DESCRIPTIONS[e.key]}")
    for v in verdicts:
        other = LABELS[v["other"]]
        ratio = "-" if v["gpu_hours_ratio"] is None else f"× {v['gpu_hours_ratio']:.3f}"
        out.print(f"llmgw vs {other}: GPU-hours {ratio}, SLO attainment {v['slo_points']:+.3f} points — "
                  + ("ahead on both" if v["ahead_on_both"] else "not ahead on both"))
    if png:
        out.print(f"plot: {png}")
    out.print(f"simulated in {wall_s:.1f} s wall")
    return OK


def _fmt(value, kind: str = "") -> str:
    if value is None:
        return "-"
    if kind == "%":
        return f"{value:.2%}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


_TOTALS = [
    ("requests", "requests", ""), ("served", "served", ""), ("held", "held for a cold start", ""),
    ("hold_p50_s", "  held for, p50 (s)", ""), ("hold_max_s", "  held for, max (s)", ""),
    ("rejected_unservable", "rejected: unservable", ""), ("rejected_timeout", "rejected: cold-start timeout", ""),
    ("cut_off", "cut off by a stop", ""), ("ttft_p50_ms", "TTFT p50 (ms)", ""), ("ttft_p95_ms", "TTFT p95 (ms)", ""),
    ("slo_attainment", "SLO attainment", "%"), ("gpu_hours", "GPU-hours", ""), ("peak_gpus", "peak GPUs held", ""),
    ("placements", "placements", ""), ("evictions", "evictions (to make room)", ""),
    ("idle_stops", "idle stops (scaled to zero)", ""), ("scale_ups", "scale steps up", ""),
    ("scale_steps", "scale steps, all", ""), ("oscillations", "oscillations", ""),
    ("unfinished", "unfinished at the end", ""), ("unknown_model", "for models not in the catalog", ""),
    ("after_end", "arrived after the end", ""),
]


#: The totals of a fleet without GPUs: replica-hours on CPUs where GPU-hours do not apply.
_CPU_TOTALS = [("replica_hours", "CPU replica-hours (no GPUs)", "") if key == "gpu_hours" else (key, label, kind)
               for key, label, kind in _TOTALS if key != "peak_gpus"]


def _print_prefixes(out, ours, base, top) -> None:
    """The prefix caches' table: per model with prefixed requests, and in total (with the
    baseline's, which routes as the catalog says on its static fleet)."""
    rows = [m for m in ours.data["models"] if "prefix_requests" in m][:top]
    theirs = {m["name"]: m for m in base.data["models"]} if base else {}
    lines = [[m["name"], m["routing_policy"], _fmt(m["prefix_cache_slots"]), _fmt(m["prefix_requests"]),
              _fmt(m["prefix_hit_rate"], "%"), _fmt(m["prefill_tokens_saved"])]
             + ([_fmt(theirs.get(m["name"], {}).get("prefix_hit_rate"), "%")] if base else []) for m in rows]
    t = ours.totals
    lines.append(["all", "", "", _fmt(t["prefix_requests"]), _fmt(t["prefix_hit_rate"], "%"),
                  _fmt(t["prefill_tokens_saved"])] + ([_fmt(base.totals.get("prefix_hit_rate"), "%")] if base else []))
    out.print(table(f"prefix cache ({ours.data['trace']['prefixes']:,} prefixes in the trace)",
                    ["model", "routing", "slots", "with a prefix", "hit rate", "prefill tokens saved"]
                    + (["hit rate, baseline"] if base else []), lines))


def _print(out, ours, base, comparison, png, wall_s, top) -> None:
    d = ours.data
    out.print(f"[bold]{d['trace']['description']}[/]")
    out.print(f"catalog: {d['catalog']['models']} models ({d['catalog']['on_demand']} on demand, "
              f"{d['catalog']['with_windows']} with schedules); fleet: {d['fleet']['summary']}; "
              f"{d['duration_s'] / 3600:g} h simulated, a pass every {d['reconcile_interval_s']:g} s")
    gpus = d["fleet"]["gpus"]
    columns = ["", "llmgw"] + ([f"static ({base.data['fleet']['gpus']} GPUs)" if gpus else "static (CPUs, no GPUs)"]
                               if base else [])
    rows = [[label, _fmt(ours.totals[key], kind)] + ([_fmt(base.totals[key], kind)] if base else [])
            for key, label, kind in (_TOTALS if gpus else _CPU_TOTALS)]
    out.print(table("totals", columns, rows))
    if "prefix_requests" in ours.totals:
        _print_prefixes(out, ours, base, top)
    models = d["models"][:top]
    out.print(table(
        f"models (top {len(models)} of {len(d['models'])} by requests; --json for all)",
        ["model", "requests", "held", "rejected", "TTFT p50", "TTFT p95", "SLO", "attained", "GPU-h", "max rep.",
         "steps"],
        [[m["name"] + (" (on demand)" if m["on_demand"] else ""), _fmt(m["requests"]), _fmt(m["held"]),
          _fmt(m["rejected_unservable"] + m["rejected_timeout"]), _fmt(m["ttft_p50_ms"]),
          _fmt(m["ttft_p95_ms"]) + ("" if m["p95_within_slo"] in (None, True) else " ✗"), _fmt(m["slo_ttft_ms"]),
          _fmt(m["slo_attainment"], "%"), _fmt(m["gpu_hours"]), m["max_replicas"], m["scale_steps"]]
         for m in models]))
    steps = d["scale_steps"]
    if steps:
        shown = steps[:8]
        out.print(table(f"scale steps ({len(steps)}, first {len(shown)})", ["at (h)", "model", "step", "why"],
                        [[f"{s['t_s'] / 3600:.2f}", s["model"], f"{s['from']} → {s['to']}", s["why"]] for s in shown]))
    if comparison:
        out.print(f"[bold]{comparison['sentence']}[/]")
    if png:
        out.print(f"plot: {png}")
    out.print(f"simulated in {wall_s:.1f} s wall ({ours.wall_s:.1f} s for llmgw's run, "
              f"{ours.plan_wall_s:.1f} s of it in plan())")
