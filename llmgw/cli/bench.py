"""``llmgw bench MODEL --slo-ttft-p95-ms X``: measure a model's capacity through the gateway
and store it as its Benchmark (used by load scaling)."""

from __future__ import annotations

import asyncio
import os

from rich.progress import BarColumn, Progress, TextColumn

from catalog.models import Benchmark, Model, Profile
from fleet.models import ModelState, Replica
from fleet.ops import cluster as read
from gateway.loadtest import ramp
from gateway.models import ApiKey
from llmgw.cli.output import FAILED, OK, console, table, write_json

HELP = ("Find the highest concurrency per replica that meets an SLO (TTFT p95, optionally TPOT p95) by "
        "ramping streamed requests through the gateway; store it as the model's Benchmark. "
        "Exit 0 stored, 1 refused or no step met the SLO.")


def add_arguments(parser) -> None:
    parser.add_argument("model")
    parser.add_argument("--profile", default=None, help="profile the measurement is for (default: the model's)")
    parser.add_argument("--slo-ttft-p95-ms", type=float, required=True)
    parser.add_argument("--slo-tpot-p95-ms", type=float, default=None)
    parser.add_argument("--url", default=os.environ.get("LLMGW_GATEWAY_URL", "http://127.0.0.1:8000"),
                        help="the gateway's base URL (env LLMGW_GATEWAY_URL)")
    parser.add_argument("--max-concurrency", type=int, default=64)
    parser.add_argument("--requests-per-step", type=int, default=None, help="default: max(8, 3 × concurrency)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--json", action="store_true")


def run(options, stdout, stderr) -> int:
    model = Model.resolve(options["model"])
    if model is None:
        stderr.write(f"no model called {options['model']!r}\n")
        return FAILED
    profile = Profile.objects.filter(name=options["profile"]).first() if options["profile"] else model.profile
    if profile is None:
        stderr.write("choose a profile with --profile (the model has none: external models cannot be benchmarked)\n")
        return FAILED
    ready = Replica.objects.ready().filter(model=model, profile=profile, agent__in=read.moment().heard_agents()).count()
    if not ready:
        state = ModelState.objects.filter(model=model).first()
        why = state.reason if state and state.reason else "nothing placed yet"
        stderr.write(f"{model.name} has no ready replica on profile {profile.name} ({why}); "
                     "start one first (min replicas ≥ 1, or send it a request if it is on demand)\n")
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
        key.revoke()
    steps = result.as_json()
    per_replica = result.best_concurrency // ready if result.best_concurrency else 0
    if options["json"]:
        write_json(stdout, {"model": model.name, "profile": profile.name, "ready_replicas": ready,
                            "best_concurrency": result.best_concurrency, "max_concurrency_per_replica": per_replica,
                            "steps": steps})
    else:
        out.print(table(f"{model.name} on {profile.name} ({ready} ready replica(s))",
                        ["concurrency", "requests/s", "TTFT p50", "TTFT p95", "TPOT p50", "TPOT p95", "errors"],
                        [[s["concurrency"], s["requests_per_s"], s["ttft_p50_ms"], s["ttft_p95_ms"], s["tpot_p50_ms"],
                          s["tpot_p95_ms"], s["errors"]] for s in steps]))
    if not per_replica:
        stderr.write(f"no concurrency met TTFT p95 ≤ {options['slo_ttft_p95_ms']} ms"
                     + (f" and TPOT p95 ≤ {options['slo_tpot_p95_ms']} ms" if options["slo_tpot_p95_ms"] else "")
                     + "; nothing stored\n")
        return FAILED
    Benchmark.objects.update_or_create(
        model=model, profile=profile,
        defaults={"max_concurrency": per_replica, "slo_ttft_p95_ms": options["slo_ttft_p95_ms"],
                  "slo_tpot_p95_ms": options["slo_tpot_p95_ms"], "steps": steps,
                  "method": f"llmgw bench: streamed chat, max_tokens {options['max_tokens']}, "
                            f"{ready} replica(s), concurrency ×2 per step"},
    )
    if not options["json"]:
        stdout.write(f"stored: {model.name} on {profile.name} holds {per_replica} concurrent request(s) per replica "
                     f"within the SLO\n")
    return OK
