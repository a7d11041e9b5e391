"""``llmgw web``: this machine's control-plane web process alone (what the systemd web unit
runs), with the same uvicorn options and exposure checks as ``llmgw up``."""

from __future__ import annotations

import os

import llmgw.cli.gateway_url as gateway_url
import llmgw.cli.web_processes as web_processes
from llmgw.cli.web_processes import can_listen, check_exposure, web_argv

HELP = ("Run the control plane's web process (admin, API, gateway, agent websocket) in the foreground, "
        "as `llmgw up` runs it: bounded connections, header and body deadlines; --workers N processes share "
        "the port (more than 1 needs LLMGW_REDIS_URL). A non-loopback --host needs LLMGW_ALLOWED_HOSTS "
        "(exit 2 without). Used by the systemd web unit.")


def add_arguments(parser) -> None:
    parser.add_argument("--host", default=os.environ.get("LLMGW_HOST", "127.0.0.1"),
                        help="address to listen on (env LLMGW_HOST)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("LLMGW_PORT", "8000")),
                        help="port (env LLMGW_PORT)")
    web_processes.add_workers_argument(parser)


def run(options, stdout, stderr) -> int:
    """Replace this process with uvicorn (so systemd signals reach it directly), with
    ``--workers`` web processes (``llmgw.cli.web_processes``); returns 2 without doing so when
    the exposure check refuses the address or the number of processes is refused (more than
    one without Redis, or more than ``web_processes.MAX_WORKERS_PER_CORE`` per core), 1 when
    the address is already in use."""
    workers, why = web_processes.resolve_workers(options.get("workers"))
    if not workers:
        stderr.write(f"llmgw web: {why}\n")
        return 2
    problem = web_processes.port_problem(options["port"])
    if problem:
        stderr.write(f"llmgw web: {problem}\n")
        return 2
    refused = check_exposure(options["host"], stdout, stderr)
    if refused:
        return refused
    if not can_listen(options["host"], options["port"]) or (
            workers > 1 and web_processes.listened_on_anywhere(options["port"])):
        # Before anything else: the metrics directory below belongs to whatever already
        # listens there, if it is another `llmgw web` on this port.
        stderr.write(f"llmgw web: {options['host']}:{options['port']} is already in use "
                     "(another llmgw web or up?); choose another with --port\n")
        return 1
    argv = web_argv(options["host"], options["port"], workers=workers)
    env = web_processes.prepare_metrics_env(dict(os.environ), workers, options["port"])
    shown_host = "127.0.0.1" if options["host"] in ("0.0.0.0", "::") else options["host"]
    gateway_url.record(f"http://{shown_host}:{options['port']}")  # for `llmgw bench`; left when it stops
    stdout.flush()
    os.execve(argv[0], argv, env)
    return 1  # not reached
