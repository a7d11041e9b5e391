"""``llmgw status``: the cluster at a glance, with each agent's own health (alive,
disconnected, lost or never connected, as ``agents list`` says it; how long it has been
connected, heartbeat age, cordoned, version, and its GPUs' utilisation and temperature when reported)."""

from datetime import UTC, datetime

from django.conf import settings

from fleet.ops import cluster as read
from fleet.ops.operations import cluster_status
from llmgw.cli.agents import heartbeat
from llmgw.cli.output import OK, console, duration, print_table, when, write_json

HELP = ("Show the cluster: serving or STOPPED, control planes, agents (health, last heartbeat, cordoned, "
        "version, GPUs), models, replicas (--json for scripts).")


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(options, stdout, stderr) -> int:
    status = cluster_status()
    health = {a["name"]: a for a in read.agents_health(read.moment())}
    for agent in status["agents"]:
        h = health.get(agent["name"], {})
        agent.update({k: h.get(k) for k in ("health", "heartbeat_age_s", "version", "gpus")})
    if options["json"]:
        write_json(stdout, status)
        return OK
    out = console(stdout)
    if status["stopped"]:
        out.print(f"[bold red]STOPPED[/] since {when(status['stopped_at'])} by {status['stopped_by'] or 'unknown'} "
                  "— `llmgw start` to serve again")
    else:
        out.print("[bold green]serving[/]" + (f" — leader {status['leader_process']}" if status["leader_process"]
                                              else " — [bold red]no worker leads[/] (is `llmgw worker` running?)"))
    out.print(_admission(status["admission"]))
    print_table(out, "control planes", ["host", "role", "pid", "lease", "last seen"],
                [[c["host"], c["role"], c["pid"], _lease(c), when(c["last_seen_at"])] for c in status["control_planes"]],
                "none heard from lately (`llmgw web` and `llmgw worker` register as they run)")
    print_table(out, "agents", ["name", "health", "connected for", "last heartbeat", "cordoned", "version",
                                "GPUs used/total", "CPU cores", "RAM MiB", "address"],
                [[a["name"], a.get("health") or "—", _connected_for(a), heartbeat(a) if a.get("health") else "—",
                  "yes" if a["cordoned"] else "no", a.get("version") or "—", f"{a['gpus_used']}/{a['gpus_total']}",
                  a["cpu_cores"], a["memory_mib"], a["address"]] for a in status["agents"]],
                "no agents registered yet: `llmgw agents add NAME` registers one (`llmgw up` runs a local one)",
                no_wrap=("health",))
    gpus = [[a["name"], g["index"], g["name"] or "—", f"{g['memory_used_mib']:,}/{g['memory_total_mib']:,}",
             _pct(g["utilisation_pct"]), _celsius(g["temperature_c"])]
            for a in status["agents"] for g in a.get("gpus") or []]
    if gpus:
        print_table(out, "GPUs", ["agent", "GPU", "name", "memory used/total MiB", "utilisation", "temperature"],
                    gpus, "")
    print_table(out, "models", ["model", "desired", "ready", "why"],
                [[m["name"] + (" (external)" if m["external"] else " (on demand)" if m["on_demand"] else ""),
                  m["desired"], m["ready"], _why(m, status)] for m in status["models"]],
                "the catalog has no models yet: add one in the admin (/admin/catalog/model/) or POST /api/models/")
    print_table(out, "replicas", ["id", "model", "agent", "state", "port", "GPUs", "note"],
                [[r["id"], r["model"], r["agent"], r["state"], r["port"], ",".join(map(str, r["gpus"])),
                  r["note"]] for r in status["replicas"]],
                "none running" + (" (the cluster is stopped)" if status["stopped"] else ""))
    return OK


def _admission(admission: dict, shared_counters: bool | None = None) -> str:
    """The cluster's admission settings in a line (``catalog.models.ClusterSettings``).
    ``shared_counters``: whether the tenants' counters live in Redis (production mode;
    default: ``LLMGW_REDIS_URL`` is set) — the Redis policy applies only then; in embedded
    mode the web process counts them itself."""
    if shared_counters is None:
        shared_counters = bool(settings.REDIS_URL)
    wait = f"admission: a request waits up to {admission['admission_wait_s']} s in a full model's queue; "
    if not shared_counters:
        return wait + "rate limits and budgets are counted by the web process (embedded mode, no Redis)"
    policy = admission["rate_limits_without_redis"]
    without = "admitted uncounted" if policy == "open" else "refused with 503"
    return wait + f"while Redis is unreachable, limited keys are {without} (rate_limits_without_redis={policy})"


def _connected_for(agent: dict) -> str:
    """The table's "connected for": how long the agent's current connection has lasted
    ("12 s": an agent that was restarted or cut off shows it), "—" while it has none. Its
    health word (alive, disconnected, lost, never connected) is the column before, as in
    ``agents list``."""
    since = agent.get("connected_since") if agent["connected"] else None
    if not since:
        return "—"
    return duration((datetime.now(UTC) - datetime.fromisoformat(since)).total_seconds())


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}%"


def _celsius(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f} °C"


def _lease(plane: dict) -> str:
    """The table's "lease": a worker leads or stands by; a web process holds none."""
    return "leader" if plane["leader"] else "standby" if plane["standby"] else ""


def _why(model: dict, status: dict) -> str:
    """The table's "why": the reconciler's reason when the model is short of (or over) what
    it wants, else a few words saying it is as it should be."""
    if model.get("reason"):
        return model["reason"]
    if model["external"]:
        return "served at its base URL"
    if status["stopped"]:
        return "cluster stopped"
    if model["desired"]:
        return "all wanted replicas ready"
    return "none wanted (on demand: not asked for lately)" if model["on_demand"] else "none wanted now"
