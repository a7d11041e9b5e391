"""``llmgw status``: the cluster at a glance."""

from datetime import datetime, timezone

from fleet.ops.operations import cluster_status
from llmgw.cli.output import OK, console, table, write_json

HELP = "Show the cluster: serving or STOPPED, control planes, agents, models, replicas (--json for scripts)."


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(options, stdout, stderr) -> int:
    status = cluster_status()
    if options["json"]:
        write_json(stdout, status)
        return OK
    out = console(stdout)
    if status["stopped"]:
        out.print(f"[bold red]STOPPED[/] since {status['stopped_at']} by {status['stopped_by'] or 'unknown'} "
                  "— `llmgw start` to serve again")
    else:
        out.print("[bold green]serving[/]" + (f" — leader {status['leader_process']}" if status["leader_process"]
                                              else " — [bold red]no worker leads[/] (is `llmgw worker` running?)"))
    out.print(_admission(status["admission"]))
    out.print(table("control planes", ["host", "role", "pid", "lease", "last seen"],
                    [[c["host"], c["role"], c["pid"], _lease(c), c["last_seen_at"]] for c in status["control_planes"]]))
    out.print(table("agents", ["name", "connected", "GPUs used/total", "CPU cores", "RAM MiB", "address"],
                    [[a["name"], _connected(a), f"{a['gpus_used']}/{a['gpus_total']}",
                      a["cpu_cores"], a["memory_mib"], a["address"]] for a in status["agents"]]))
    out.print(table("models", ["model", "desired", "ready", "why"],
                    [[m["name"] + (" (external)" if m["external"] else " (on demand)" if m["on_demand"] else ""),
                      m["desired"], m["ready"], _why(m, status)] for m in status["models"]]))
    out.print(table("replicas", ["id", "model", "agent", "state", "port", "GPUs", "note"],
                    [[r["id"], r["model"], r["agent"], r["state"], r["port"], ",".join(map(str, r["gpus"])),
                      r["note"]] for r in status["replicas"]]))
    return OK


def _admission(admission: dict) -> str:
    """The cluster's admission settings in a line (``catalog.models.ClusterSettings``)."""
    policy = admission["rate_limits_without_redis"]
    without = "admitted uncounted" if policy == "open" else "refused with 503"
    return (f"admission: a request waits up to {admission['admission_wait_s']} s in a full model's queue; "
            f"without Redis, limited keys are {without} (rate_limits_without_redis={policy})")


def _connected(agent: dict) -> str:
    """The table's "connected": NO, or yes with how long its connection has lasted, so an
    agent that was restarted or cut off shows it ("yes, for 12 s")."""
    if not agent["connected"]:
        return "NO"
    since = agent.get("connected_since")
    if not since:
        return "yes"
    lasted_s = (datetime.now(timezone.utc) - datetime.fromisoformat(since)).total_seconds()
    return f"yes, for {_duration(max(0.0, lasted_s))}"


def _duration(seconds: float) -> str:
    """Seconds as a person reads them: 12 s, 4 min, 3 h, 2 d."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f} {unit}"
    return f"{seconds:.0f} s"


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
