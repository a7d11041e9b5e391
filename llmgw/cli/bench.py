"""``llmgw bench MODEL --slo-ttft-p95-ms X``: measure a model's capacity through the gateway
and store it as its Benchmark (used by load scaling)."""

from __future__ import annotations

import asyncio
import math
from urllib.parse import urlsplit

from rich.progress import BarColumn, Progress, TextColumn

from catalog.models import Benchmark, Model, Profile
from fleet.models import ModelState, Replica
from fleet.ops import cluster as read
from gateway.loadtest import (
    MIN_REQUESTS_FOR_P95,
    concurrency_steps,
    ramp,
    requests_for_step,
)
from gateway.models import ApiKey
import llmgw.cli.gateway_url as gateway_url
from llmgw.cli.output import FAILED, OK, USAGE, console, table, write_json

HELP = ("Find the highest concurrency per replica that meets an SLO (TTFT p95, optionally TPOT p95) by "
        "ramping streamed requests through the gateway; store it as the model's Benchmark. "
        "Warns when the result is capped by --max-concurrency (the SLO was never crossed) or a step had fewer "
        f"than {MIN_REQUESTS_FOR_P95} requests. --dry-run says what it would send and sends nothing. "
        "Exit 0 stored (or dry run), 1 refused or no step met the SLO, 2 bad usage.")


def add_arguments(parser) -> None:
    parser.add_argument("model", help="the model's name (or an alias)")
    parser.add_argument("--profile", default=None, help="profile the measurement is for (default: the model's)")
    parser.add_argument("--slo-ttft-p95-ms", type=float, required=True,
                        help="required: the time to first token that 95%% of requests must meet, in milliseconds")
    parser.add_argument("--slo-tpot-p95-ms", type=float, default=None,
                        help="the time per output token (after the first) that 95%% of requests must meet, in "
                             "milliseconds (default: not checked)")
    parser.add_argument("--url", default=None,
                        help="the gateway's base URL (default: env LLMGW_GATEWAY_URL, else the web process `llmgw up` "
                             f"or `llmgw web` runs on this machine, else {gateway_url.DEFAULT_URL})")
    parser.add_argument("--max-concurrency", type=int, default=64,
                        help="the ramp's cap: concurrency 1, 2, 4, … and then this, the last step (default 64)")
    parser.add_argument("--requests-per-step", type=int, default=None,
                        help=f"default: max({MIN_REQUESTS_FOR_P95}, 3 × concurrency)")
    parser.add_argument("--max-tokens", type=int, default=32,
                        help="max_tokens of each request: the answer's length in tokens (default 32)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the model, URL, steps, requests and SLO it would use; send nothing, store nothing")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _usage_problem(options) -> str | None:
    """What is wrong with the numbers and URL given, or None."""
    for name, value in (("--slo-ttft-p95-ms", options["slo_ttft_p95_ms"]),
                        ("--slo-tpot-p95-ms", options["slo_tpot_p95_ms"])):
        if value is not None and not (math.isfinite(value) and value > 0):
            return f"{name} takes milliseconds > 0, not {value:g}"
    for name, key in (("--max-concurrency", "max_concurrency"), ("--requests-per-step", "requests_per_step"),
                      ("--max-tokens", "max_tokens")):
        if options[key] is not None and options[key] < 1:
            return f"{name} must be at least 1, not {options[key]}"
    per_step = options["requests_per_step"]
    if per_step is not None and per_step < options["max_concurrency"]:
        return (f"--requests-per-step ({per_step}) must be at least --max-concurrency ({options['max_concurrency']}): "
                "a step with fewer requests than its concurrency never reaches it")
    url = urlsplit(options["url"])
    if url.scheme not in ("http", "https") or not url.hostname:
        source = "" if options["url_from"] == "--url" else f" (it came from {options['url_from']})"
        return f"--url takes the gateway's base URL, like http://127.0.0.1:8000, not {options['url']!r}{source}"
    return None


def _slo_text(options) -> str:
    return (f"TTFT p95 ≤ {options['slo_ttft_p95_ms']:g} ms"
            + (f" and TPOT p95 ≤ {options['slo_tpot_p95_ms']:g} ms" if options["slo_tpot_p95_ms"] else ""))


def _nothing_answers(options) -> str | None:
    """One line saying that nothing answers at the gateway's URL, and where that URL came
    from, or None when something does."""
    why = gateway_url.nothing_answers(options["url"])
    if why is None:
        return None
    return (f"nothing answers at {options['url']} ({options['url_from']}): {why}; is the cluster up? "
            "(`llmgw up`, or give the gateway's URL with --url)")


def _dry_run(options, model, profile, ready: int, why_not: str, stdout, stderr) -> int:
    """``--dry-run``: what a run would send and store; nothing is sent, no key is made."""
    steps = concurrency_steps(options["max_concurrency"])
    requests = [requests_for_step(c, options["requests_per_step"]) for c in steps]
    url = options["url"].rstrip("/")
    plan = {"dry_run": True, "model": model.name, "profile": profile.name, "url": f"{url}/v1/chat/completions",
            "ready_replicas": ready, "slo_ttft_p95_ms": options["slo_ttft_p95_ms"],
            "slo_tpot_p95_ms": options["slo_tpot_p95_ms"], "concurrency_steps": steps, "requests_per_step": requests,
            "max_tokens": options["max_tokens"], "at_most_requests": sum(requests), "would_refuse": why_not or None}
    if options["json"]:
        write_json(stdout, plan)
    else:
        stdout.write(f"would measure {model.name} on profile {profile.name} through {plan['url']} "
                     f"({ready} ready replica(s) now)\n"
                     f"  SLO:      {_slo_text(options)}\n"
                     f"  steps:    concurrency {', '.join(map(str, steps))}; stops at the first step that misses "
                     "the SLO\n"
                     f"  requests: {', '.join(map(str, requests))} per step (streamed chat, max_tokens "
                     f"{options['max_tokens']}); at most {sum(requests):,} in all\n"
                     f"  stores:   the highest concurrency within the SLO ÷ ready replicas, as {model.name}'s "
                     f"benchmark on {profile.name}\n"
                     "nothing sent, nothing stored (--dry-run)\n")
    if why_not:
        stderr.write(f"warning: a run now would be refused: {why_not}\n")
    unreachable = _nothing_answers(options)
    if unreachable:
        stderr.write(f"warning: {unreachable}\n")
    return OK


def run(options, stdout, stderr) -> int:
    """Measure (or with ``--dry-run`` plan) and store the model's Benchmark; the exit code."""
    options = dict(options)
    if options["url"] is None:
        options["url"], options["url_from"] = gateway_url.default_url()
    else:
        options["url_from"] = "--url"
    problem = _usage_problem(options)
    if problem:
        stderr.write(f"{problem}\n")
        return USAGE
    model = Model.resolve(options["model"])
    if model is None:
        stderr.write(f"no model called {options['model']!r}\n")
        return FAILED
    profile = Profile.objects.filter(name=options["profile"]).first() if options["profile"] else model.profile
    if profile is None:
        stderr.write("choose a profile with --profile (the model has none: external models cannot be benchmarked)\n")
        return FAILED
    ready = Replica.objects.ready().filter(model=model, profile=profile, agent__in=read.moment().heard_agents()).count()
    why_not = ""
    if not ready:
        state = ModelState.objects.filter(model=model).first()
        why = state.reason if state and state.reason else "nothing placed yet"
        why_not = (f"{model.name} has no ready replica on profile {profile.name} ({why}); "
                   "start one first (min replicas ≥ 1, or send it a request if it is on demand)")
    if options["dry_run"]:
        return _dry_run(options, model, profile, ready, why_not, stdout, stderr)
    if why_not:
        stderr.write(why_not + "\n")
        return FAILED
    unreachable = _nothing_answers(options)
    if unreachable:
        stderr.write(unreachable + "\n")
        return FAILED
    key, clear = ApiKey.create_key(f"bench {model.name}")
    out = console(stdout)
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      console=out, transient=True, disable=options["json"]) as progress:
            tasks: dict[int, int] = {}

            def update(concurrency, done, total):
                if concurrency not in tasks:
                    tasks[concurrency] = progress.add_task(f"concurrency {concurrency:>3}", total=total)
                progress.update(tasks[concurrency], completed=done)

            result = asyncio.run(ramp(options["url"].rstrip("/"), clear, model.name, options["slo_ttft_p95_ms"],
                                      options["slo_tpot_p95_ms"], options["max_concurrency"],
                                      options["requests_per_step"], options["max_tokens"], update))
    finally:
        # Deleted, not revoked: a revoked "bench MODEL" per run would pile up in `keys list`
        # and the admin. Its usage records stay (the web process keeps a record whose key is
        # gone, without the key).
        key.delete()
    steps = result.as_json()
    per_replica = result.best_concurrency // ready if result.best_concurrency else 0
    warnings = result.warnings()
    if options["json"]:
        write_json(stdout, {"model": model.name, "profile": profile.name, "ready_replicas": ready,
                            "best_concurrency": result.best_concurrency, "max_concurrency_per_replica": per_replica,
                            "capped": result.capped, "warnings": warnings, "steps": steps})
    else:
        out.print(table(f"{model.name} on {profile.name} ({ready} ready replica(s))",
                        ["concurrency", "requests/s", "TTFT p50", "TTFT p95", "TPOT p50", "TPOT p95", "errors"],
                        [[s["concurrency"], s["requests_per_s"], s["ttft_p50_ms"], s["ttft_p95_ms"], s["tpot_p50_ms"],
                          s["tpot_p95_ms"], s["errors"]] for s in steps]))
    for warning in warnings:
        stderr.write(f"warning: {warning}\n")
    if result.steps and not result.steps[0].requests:
        stderr.write(f"every request at concurrency 1 failed: is the gateway at {options['url']} and the model "
                     "served? (`llmgw explain MODEL`)\n")
    if result.best_concurrency and not per_replica:
        stderr.write(f"concurrency {result.best_concurrency} met {_slo_text(options)} across {ready} ready replicas: "
                     "under one request per replica, which is no capacity figure; nothing stored (measure with "
                     "fewer replicas ready, or a looser SLO)\n")
        return FAILED
    if not per_replica:
        stderr.write(f"no concurrency met {_slo_text(options)}; nothing stored\n")
        return FAILED
    Benchmark.objects.update_or_create(
        model=model, profile=profile,
        defaults={"max_concurrency": per_replica, "slo_ttft_p95_ms": options["slo_ttft_p95_ms"],
                  "slo_tpot_p95_ms": options["slo_tpot_p95_ms"], "steps": steps,
                  "method": f"llmgw bench: streamed chat, max_tokens {options['max_tokens']}, "
                            f"{ready} replica(s), concurrency ×2 per step up to the cap"
                            + (f"; capped at --max-concurrency {options['max_concurrency']}: a lower bound"
                               if result.capped else "")},
    )
    if not options["json"]:
        stdout.write(f"stored: {model.name} on {profile.name} holds {'at least ' if result.capped else ''}"
                     f"{per_replica} concurrent request(s) per replica within the SLO\n")
    return OK
