"""``llmgw agents list|add|rekey|cordon|uncordon|drain``: the machines of the cluster.

* ``list``: every agent's own health (``fleet.ops.cluster.agents_health``): alive,
  disconnected, lost or never connected, its last heartbeat's age, cordoned, GPUs (with
  utilisation and temperature when the agent reports them), replicas, version.
* ``add NAME`` / ``rekey NAME``: register an agent (or give it a new token) and print the
  token once. A re-key (or deleting the agent in the admin) closes the agent's live
  websocket (``Agent.rekey``; at once over a shared channel layer, else within
  ``LLMGW_AGENT_TOKEN_RECHECK``) and its old token is refused from then on.
* ``cordon NAME`` / ``uncordon NAME``: nothing new is placed there (or may be again); what
  runs there keeps serving (``fleet.ops.operations.set_cordoned``, as the dashboard and
  ``POST /api/agents/{id}/cordon/``).
* ``drain NAME``: cordon it and move its replicas away (``fleet.ops.operations.drain_agent``,
  as the dashboard and the REST API): ready ones drain (out of routing at once, in-flight
  requests finish, then they stop), ones still coming up stop now, and the reconciler's next
  pass places their successors on other agents where there is room. It does not wait for a
  successor to be ready before draining: a model whose only ready replicas were there is
  served again after its successor's cold start (its requests are held meanwhile, as for a
  cold start); the command names such models.
"""

from __future__ import annotations

import getpass

from fleet.models import Agent, Replica
from fleet.ops import cluster as read
from fleet.ops.operations import drain_agent, set_cordoned
from fleet.states import COMING_UP, ReplicaState
from llmgw.cli.output import (
    FAILED,
    OK,
    USAGE,
    console,
    duration,
    print_table,
    write_json,
)

HELP = ("The cluster's machines: list (health: alive or lost, heartbeat age, cordoned, GPUs, replicas, "
        "version), add NAME (register; prints its token once), rekey NAME (a new token; the old one stops "
        "working at once), cordon NAME (nothing new is placed there), uncordon NAME, drain NAME (cordon, then "
        "move its replicas to other agents: ready ones drain, successors are placed where there is room). "
        "Exit 0 ok, 1 no agent of that name (or, for add, one exists), 2 bad usage.")

ACTIONS = ["list", "add", "rekey", "cordon", "uncordon", "drain"]

#: The longest agent name (``Agent.name``'s column).
MAX_NAME = Agent._meta.get_field("name").max_length


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=ACTIONS, help="what to do: " + ", ".join(ACTIONS))
    parser.add_argument("name", nargs="?", help="the agent's name (all but list)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(options, stdout, stderr) -> int:
    action, name = options["action"], options["name"]
    if action == "list":
        if name:
            stderr.write("agents list takes no NAME (it lists every agent)\n")
            return USAGE
        return _list(options, stdout)
    if not name:
        stderr.write(f"agents {action} needs the agent's NAME\n")
        return USAGE
    if action == "add":
        return _add(name, options, stdout, stderr)
    agent = Agent.objects.filter(name=name).first()
    if agent is None:
        stderr.write(f"llmgw agents {action}: no agent named {name!r} (`llmgw agents list` lists them)\n")
        return FAILED
    if action == "rekey":
        token = agent.rekey()
        if options["json"]:
            write_json(stdout, {"agent": agent.name, "token": token})
            return OK
        stdout.write(f"agent {agent.name}: re-keyed; the old token no longer works and its connection is closed\n")
        _print_token(stdout, agent, token)
        return OK
    if action == "drain":
        return _drain(agent, options, stdout)
    return _cordon(agent, action == "cordon", options, stdout)


def _print_token(stdout, agent: Agent, token: str) -> None:
    stdout.write(f"agent {agent.name}: token {token}\n")
    # In the environment, not argv: `ps` shows every process's arguments to everyone.
    stdout.write("run on that machine: LLMGW_AGENT_TOKEN=<the token> manage.py llmgw agent "
                 "--server http://CONTROL_PLANE:8000\n")


def _add(name: str, options, stdout, stderr) -> int:
    if len(name) > MAX_NAME or not name.strip() or any(not c.isprintable() for c in name):
        stderr.write(f"an agent's name is 1 to {MAX_NAME} printable characters, not {name!r}\n")
        return USAGE
    if Agent.objects.filter(name=name).exists():
        stderr.write(f"an agent named {name!r} exists; `llmgw agents rekey {name}` gives it a new token "
                     "(its old one then stops working)\n")
        return FAILED
    agent, token = Agent.create_with_token(name)
    if options["json"]:
        write_json(stdout, {"agent": agent.name, "token": token})
        return OK
    _print_token(stdout, agent, token)
    return OK


def _list(options, stdout) -> int:
    agents = read.agents_health(read.moment())
    if options["json"]:
        write_json(stdout, agents)
        return OK
    out = console(stdout)
    print_table(out, "agents", ["name", "health", "last heartbeat", "cordoned", "GPUs", "replicas", "version"],
                [[a["name"], a["health"], heartbeat(a), "yes" if a["cordoned"] else "no", gpus_text(a),
                  replicas_text(a["replicas"]), a["version"] or "—"] for a in agents],
                "no agents registered yet: `llmgw agents add NAME` registers one (`llmgw up` runs a local one)")
    return OK


def heartbeat(agent: dict) -> str:
    """An agent's last heartbeat for people: ``4 s ago``, ``never``."""
    age_s = agent["heartbeat_age_s"]
    return "never" if age_s is None else f"{duration(age_s)} ago"


def gpus_text(agent: dict) -> str:
    """``2 used of 4`` (``none`` on a CPU-only machine)."""
    total = len(agent["gpus"])
    return f"{agent['gpus_used']} used of {total}" if total else "none"


def replicas_text(replicas: dict[str, int]) -> str:
    """``2 ready, 1 starting``; ``none``."""
    return ", ".join(f"{n} {state}" for state, n in replicas.items()) or "none"


def _cordon(agent: Agent, cordoned: bool, options, stdout) -> int:
    changed = set_cordoned(agent, cordoned, f"{getpass.getuser()} (CLI)")
    if options["json"]:
        write_json(stdout, {"agent": agent.name, "cordoned": cordoned, "changed": changed})
    elif cordoned:
        stdout.write(f"cordoned {agent.name}: nothing new is placed there; what runs there keeps serving "
                     f"(`llmgw agents drain {agent.name}` moves it away)\n" if changed
                     else f"{agent.name} was already cordoned\n")
    else:
        stdout.write(f"uncordoned {agent.name}: replicas may be placed there again\n" if changed
                     else f"{agent.name} was not cordoned\n")
    return OK


def _drain(agent: Agent, options, stdout) -> int:
    was_cordoned = agent.cordoned
    moving = list(Replica.objects.filter(agent=agent).in_states({ReplicaState.READY, *COMING_UP})
                  .select_related("model"))
    moved = drain_agent(agent, f"{getpass.getuser()} (CLI)")
    models = sorted({r.shown_model_name for r in moving})
    ready = read.ready_by_model(read.moment(), {r.model_id for r in moving if r.model_id})
    waiting = sorted({r.shown_model_name for r in moving if r.model_id and not ready.get(r.model_id)})
    if options["json"]:
        write_json(stdout, {"agent": agent.name, "cordoned": True, "changed": not was_cordoned or moved > 0,
                            "moved": moved, "models": models, "without_a_ready_replica": waiting})
        return OK
    if not moved:
        stdout.write(f"{agent.name} {'was already' if was_cordoned else 'is now'} cordoned; "
                     "it had no ready or starting replica to move\n")
        return OK
    stdout.write(f"draining {agent.name}: cordoned; {moved} replica(s) moving away ({', '.join(models)}): ready ones "
                 "drain (in-flight requests finish, then they stop), ones still starting stop now; the reconciler "
                 "places their successors on other agents where there is room (`llmgw status` shows where)\n")
    if waiting:
        stdout.write(f"no ready replica left elsewhere for {', '.join(waiting)}: its requests wait for a "
                     "successor to be ready (503 with the reason if no other agent has room)\n")
    return OK
