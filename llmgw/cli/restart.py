"""``llmgw restart``: restart the software without interrupting serving.

Order: every agent restarts in place over its websocket (engines keep serving and are
adopted), then the other control planes over ssh, standbys before the leader, then this
machine's own web and worker through systemd.
"""

from __future__ import annotations

import getpass
import os
import shlex
import socket
import subprocess
import time

from django.utils import timezone

from fleet.models import Agent
from fleet.ops.operations import control_planes, leader_host, request_agent_restarts
from llmgw.cli.output import FAILED, NO_SYSTEMD, OK
from llmgw.cli.systemd import UNITS, systemctl, systemd_available

HELP = ("Restart agents (engines keep serving), then the other control planes over ssh (standbys "
        "before the leader), then this one. Exit 0 all restarted, 1 something failed, 3 this "
        "machine has no systemd to restart itself with.")

REMOTE_COMMAND = f"systemctl restart {UNITS['web']} {UNITS['worker']}"


def add_arguments(parser) -> None:
    parser.add_argument("--agents-only", action="store_true", help="restart only the agents")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="how long to wait for agents to come back")
    parser.add_argument("--remote-command", default=os.environ.get("LLMGW_RESTART_REMOTE_COMMAND", REMOTE_COMMAND),
                        help="what ssh runs on the other control planes")


def restart_order(planes: list[dict], leader: str, me: str) -> list[str]:
    """Hosts to restart over ssh: every control-plane host but this one, standbys first,
    the leader last."""
    hosts = sorted({p["host"] for p in planes if p["host"] != me})
    return [h for h in hosts if h != leader] + [h for h in hosts if h == leader]


def run(options, stdout, stderr) -> int:
    started = timezone.now()
    code = OK
    names = request_agent_restarts(f"{getpass.getuser()} (CLI)")
    stdout.write(f"agents: asked {len(names)} to restart in place ({', '.join(names) or 'none connected'})\n")
    deadline = time.monotonic() + options["timeout_s"]
    pending = set(names)
    while pending and time.monotonic() < deadline:
        back = set(Agent.objects.connected().filter(name__in=pending, connected_since__gt=started)
                   .values_list("name", flat=True))
        for name in sorted(back):
            stdout.write(f"  {name}: back\n")
        pending -= back
        if pending:
            time.sleep(0.2)
    if pending:
        stderr.write(f"agents not back after {options['timeout_s']:.0f} s: {', '.join(sorted(pending))}\n")
        code = FAILED
    if options["agents_only"]:
        return code

    me = socket.gethostname()
    planes = control_planes()
    for host in restart_order(planes, leader_host(), me):
        argv = ["ssh", "-o", "BatchMode=yes", host, options["remote_command"]]
        stdout.write(f"control plane {host}: {shlex.join(argv)}\n")
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            stderr.write(f"  {host}: ssh failed: {exc}\n")
            code = FAILED
            continue
        if done.returncode != 0:
            stderr.write(f"  {host}: exit {done.returncode}: {done.stderr.strip()}\n")
            code = FAILED

    available, why = systemd_available()
    if not available:
        stderr.write(f"this machine ({me}): {why}; restart its web and worker processes yourself "
                     "(under `llmgw up`: stop it with Ctrl-C and run it again)\n")
        return NO_SYSTEMD if code == OK else code
    stdout.write(f"this machine ({me}): systemctl restart {UNITS['web']} {UNITS['worker']}\n")
    done = systemctl("restart", UNITS["web"], UNITS["worker"])
    if done.returncode != 0:
        stderr.write(done.stderr or "systemctl restart failed\n")
        return FAILED
    return code
