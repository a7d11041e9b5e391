"""``llmgw explain MODEL``: why a model has the replicas it has."""

import json
from datetime import datetime

from catalog.models import Model
from fleet.ops.explain import explain_model

HELP = ("Explain a model's state: desired and ready replicas, demand, last use, placement reason, routing "
        "policy.")


def add_arguments(parser) -> None:
    parser.add_argument("model")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _when(iso: str | None) -> str:
    """An ISO instant from the JSON, to the second, for people."""
    if not iso:
        return "-"
    return datetime.fromisoformat(iso).replace(microsecond=0).isoformat()


def run(options, stdout, stderr) -> int:
    model = Model.resolve(options["model"])
    if model is None:
        if options["json"]:
            stdout.write(json.dumps({"error": f"no model called {options['model']!r}"}) + "\n")
        stderr.write(f"no model called {options['model']!r}\n")
        return 1
    info = explain_model(model)
    if options["json"]:
        stdout.write(json.dumps(info, indent=2) + "\n")
        return 0
    window = f"; the window in force: {info['window_now']}" if info.get("window_now") else ""
    stdout.write(f"{info['model']}: {info['ready']} ready of {info['desired']} desired"
                 f" (min {info['min_replicas']}, max {info['max_replicas']}{', on demand' if info['on_demand'] else ''}"
                 f"{window})\n")
    stdout.write(f"  why:         {info['reason']}\n")
    stdout.write(f"  limits:      {info['limits']['text']}\n")
    stdout.write(f"  endpoints:   {', '.join(info['limits']['served_endpoints'])}\n")
    stdout.write(f"  routing:     {info['routing']['text']}\n")
    if info.get("engine_protected") is False:
        stdout.write("  UNPROTECTED: its profile starts engines without {api_key}: anyone who reaches an engine's"
                     " port can use it around the gateway\n")
    if info["on_demand"]:
        stdout.write(f"  wanted at:   {info['wanted_at'] or 'not wanted (no request within its idle timeout)'}\n")
    idle = "never used" if info["idle_for_s"] is None else f"idle for {info['idle_for_s']:.0f} s"
    stdout.write(f"  last used:   {info['last_used_at'] or '-'} ({idle})\n")
    if info["schedule"]:
        stdout.write(f"  schedule:    {'; '.join(info['schedule'])} — now: {info['window_now'] or 'outside every window'}\n")
    if info["measured_per_replica"]:
        stdout.write(f"  measured:    {info['measured_per_replica']} concurrent per replica within its SLO\n")
    elif info["observed_per_replica"]:
        stdout.write(f"  capacity:    {info['observed_per_replica']} running per replica while requests queued"
                     " (learned; a benchmark would measure it)\n")
    warm = info.get("warmth")
    if warm:
        cold = warm["cold_start"]
        agents = "; ".join(f"{a['agent']}: {a['text']}" for a in cold["by_agent"])
        stdout.write(f"  cold start:  {cold['text']}" + (f" (differs on {agents})" if agents else "") + "\n")
        if warm["now"]:
            stdout.write(f"  warm ahead:  {warm['now']}" + (" — on free room only, evicted first" if warm["speculative"]
                                                           else "") + "\n")
        pre = warm["prewarm"]
        if pre["next_window"]:
            when = (f"placed from {_when(pre['placed_from'])} ({cold['lead_s']:.0f} s ahead)" if pre["enabled"]
                    else "pre-warm off for this cluster: placed at its start")
            stdout.write(f"  next window: {pre['next_window']} at {_when(pre['starts_at'])}, {when}\n")
        else:
            stdout.write("  pre-warm:    no schedule window to place ahead of"
                         + ("" if pre["enabled"] else " (and off for this cluster)") + "\n")
        pred = warm["prediction"]
        if not pred["applies"]:
            stdout.write("  predicted:   only for on-demand models (this one runs its min)\n")
        else:
            if not pred["enabled"]:
                stdout.write("  predicted:   off for this cluster\n")
            else:
                usual = pred["usually_asked"] or (f"no habit yet ({pred['weeks_observed']:g} weeks observed; "
                                                  "an hour asked for four weeks running is one)")
                stdout.write(f"  usually:     {usual}\n")
                if pred["now"]:
                    stdout.write(f"  predicted:   {pred['now']}\n")
        stdout.write(f"  ramp:        {warm['ramp']['text']}\n")
    for e in info["scaling_events"]:
        stdout.write(f"  scaled:      {e['at']} {e['from']} → {e['to']}: {e['why']}\n")
    if info["last_failure"]:
        stdout.write("  last failure:\n" + "\n".join("    " + line for line in info["last_failure"].splitlines()[-15:]) + "\n")
    for r in info["replicas"]:
        stdout.write(f"  replica {r['id']:>5} on {r['agent']:<16} {r['state']:<11} "
                     + (f"[{r['note']}] " if r.get("note") else "") + r["reason"]
                     + (f" — {r['error']}" if r["error"] else "") + "\n")
    for r in info.get("recently_stopped", []):
        stdout.write(f"  stopped {r['id']:>5} on {r['agent']:<16} {r['stopped_at']}: {r['reason']}\n")
    return 0
