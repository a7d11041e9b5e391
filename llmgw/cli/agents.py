"""``llmgw agents add NAME``: register an agent and print its token (shown once)."""

from fleet.models import Agent

HELP = "Register an agent (or give it a new token) and print the token once."


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=["add"])
    parser.add_argument("name")


def run(options, stdout, stderr) -> int:
    agent, token = Agent.create_with_token(options["name"])
    stdout.write(f"agent {agent.name}: token {token}\n")
    stdout.write(f"run on that machine: manage.py llmgw agent --server http://CONTROL_PLANE:8000 --token {token}\n")
    return 0
