"""Subcommands of ``manage.py llmgw``. Each module has HELP, add_arguments(parser) and
run(options, stdout, stderr) -> exit code (see ``llmgw.cli.output``: 0 ok, 1 failed,
2 bad usage, 3 no systemd)."""

from llmgw.cli import agent, agents, bench, explain, keys, mirror, restart, service, start, status, stop, up, web, worker
from llmgw.cli import changes, simulate, teams

COMMANDS = {
    "up": up,
    "status": status,
    "stop": stop,
    "start": start,
    "restart": restart,
    "service": service,
    "explain": explain,
    "changes": changes,
    "agent": agent,
    "agents": agents,
    "keys": keys,
    "teams": teams,
    "bench": bench,
    "mirror": mirror,
    "simulate": simulate,
    "web": web,
    "worker": worker,
}
