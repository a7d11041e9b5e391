"""``llmgw agents add NAME`` / ``rekey NAME``: register an agent (or give it a new token) and
print the token once. A re-key (or deleting the agent in the admin) closes the agent's live
websocket (``Agent.rekey``; at once over a shared channel layer, else within
``LLMGW_AGENT_TOKEN_RECHECK``) and its old token is refused from then on."""

from fleet.models import Agent

HELP = ("Register an agent (add) or give it a new token (rekey: the old one stops working at once); "
        "the token is printed once.")


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=["add", "rekey"])
    parser.add_argument("name")


def _print_token(stdout, agent: Agent, token: str) -> None:
    stdout.write(f"agent {agent.name}: token {token}\n")
    # In the environment, not argv: `ps` shows every process's arguments to everyone.
    stdout.write("run on that machine: LLMGW_AGENT_TOKEN=<the token> manage.py llmgw agent "
                 "--server http://CONTROL_PLANE:8000\n")


def run(options, stdout, stderr) -> int:
    """Exit codes: 0 done, 1 no agent of that name (rekey)."""
    name, action = options["name"], options["action"]
    if action == "add":
        agent, token = Agent.create_with_token(name)
        _print_token(stdout, agent, token)
        return 0
    agent = Agent.objects.filter(name=name).first()
    if agent is None:
        stderr.write(f"llmgw agents {action}: no agent named {name!r} (`llmgw status` lists them)\n")
        return 1
    token = agent.rekey()
    stdout.write(f"agent {agent.name}: re-keyed; the old token no longer works and its connection is closed\n")
    _print_token(stdout, agent, token)
    return 0
