"""``llmgw explain MODEL``: why a model has the replicas it has."""

import json

from django.utils import timezone

from catalog.models import Benchmark, ClusterSettings, Model
from catalog.schedules import active_window, describe
from fleet.models import ModelState, ScalingEvent

HELP = "Explain a model's state: desired and ready replicas, demand, last use, placement reason."


def add_arguments(parser) -> None:
    parser.add_argument("model")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _ago(when):
    if when is None:
        return None
    return round((timezone.now() - when).total_seconds(), 1)


def explain_model(model: Model) -> dict:
    state = ModelState.objects.filter(model=model).first()
    replicas = list(model.replicas.select_related("agent").order_by("-id")[:20])
    used = [r.last_used_at for r in replicas if r.last_used_at]
    last_used = max(used) if used else None
    cluster = ClusterSettings.get_solo()
    windows = [w.as_window() for w in model.schedule_windows.all()]
    window = active_window(windows, timezone.now(), cluster.time_zone) if windows else None
    bench = Benchmark.objects.filter(model=model, profile_id=model.profile_id).first()
    events = list(ScalingEvent.objects.filter(model=model)[:5])
    failed = [r for r in replicas if r.state == "failed"]
    return {
        "model": model.name,
        "schedule": [describe(w) for w in windows],
        "window_now": describe(window) if window else None,
        "load_extra_replicas": state.extra_replicas if state else 0,
        "measured_per_replica": bench.max_concurrency if bench else None,
        "scaling_events": [{"at": e.at.isoformat(), "from": e.from_replicas, "to": e.to_replicas, "why": e.reason}
                           for e in events],
        "last_failure": failed[0].error if failed else None,
        "on_demand": model.on_demand,
        "external": model.is_external,
        "min_replicas": model.min_replicas,
        "max_replicas": model.max_replicas,
        "desired": state.desired if state else 0,
        "ready": sum(1 for r in replicas if r.state == "ready"),
        "wanted_at": state.wanted_at.isoformat() if state and state.wanted_at else None,
        "last_used_at": last_used.isoformat() if last_used else None,
        "idle_for_s": _ago(last_used),
        "unservable": bool(state and state.unservable),
        "reason": state.reason if state else "no reconcile pass has looked at it yet",
        "replicas": [
            {"id": r.pk, "agent": r.agent.name, "state": r.state, "port": r.port, "reason": r.reason,
             "error": r.error.splitlines()[0] if r.error else ""}
            for r in replicas if r.state not in ("stopped",)
        ],
    }


def run(options, stdout, stderr) -> int:
    model = Model.resolve(options["model"])
    if model is None:
        stderr.write(f"no model called {options['model']!r}\n")
        return 1
    info = explain_model(model)
    if options["json"]:
        stdout.write(json.dumps(info, indent=2) + "\n")
        return 0
    stdout.write(f"{info['model']}: {info['ready']} ready of {info['desired']} desired"
                 f" (min {info['min_replicas']}, max {info['max_replicas']}{', on demand' if info['on_demand'] else ''})\n")
    stdout.write(f"  why:         {info['reason']}\n")
    stdout.write(f"  wanted at:   {info['wanted_at'] or 'not wanted'}\n")
    idle = "never used" if info["idle_for_s"] is None else f"idle for {info['idle_for_s']:.0f} s"
    stdout.write(f"  last used:   {info['last_used_at'] or '-'} ({idle})\n")
    if info["schedule"]:
        stdout.write(f"  schedule:    {'; '.join(info['schedule'])} — now: {info['window_now'] or 'outside every window'}\n")
    if info["measured_per_replica"]:
        stdout.write(f"  measured:    {info['measured_per_replica']} concurrent per replica within its SLO\n")
    for e in info["scaling_events"]:
        stdout.write(f"  scaled:      {e['at']} {e['from']} → {e['to']}: {e['why']}\n")
    if info["last_failure"]:
        stdout.write("  last failure:\n" + "\n".join("    " + line for line in info["last_failure"].splitlines()[-15:]) + "\n")
    for r in info["replicas"]:
        stdout.write(f"  replica {r['id']:>5} on {r['agent']:<16} {r['state']:<11} {r['reason']}"
                     + (f" — {r['error']}" if r["error"] else "") + "\n")
    return 0
