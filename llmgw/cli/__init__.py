"""Subcommands of ``manage.py llmgw``. Each module has HELP, add_arguments(parser) and
run(options, stdout, stderr) -> exit code (0 ok, 1 failed, 2 bad usage)."""

from llmgw.cli import agent, agents, explain, up

COMMANDS = {
    "up": up,
    "agent": agent,
    "agents": agents,
    "explain": explain,
}
