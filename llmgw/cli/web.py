"""``llmgw web``: this machine's control-plane web process alone (what the systemd web unit
runs), with the same uvicorn options and exposure checks as ``llmgw up``."""

from __future__ import annotations

import os

from llmgw.cli.up import check_exposure, web_argv

HELP = ("Run the control plane's web process (admin, API, gateway, agent websocket) in the foreground, "
        "as `llmgw up` runs it: bounded connections, header and body deadlines. A non-loopback --host "
        "needs LLMGW_ALLOWED_HOSTS (exit 2 without). Used by the systemd web unit.")


def add_arguments(parser) -> None:
    parser.add_argument("--host", default=os.environ.get("LLMGW_HOST", "127.0.0.1"),
                        help="address to listen on (env LLMGW_HOST)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("LLMGW_PORT", "8000")),
                        help="port (env LLMGW_PORT)")


def run(options, stdout, stderr) -> int:
    """Replace this process with uvicorn (so systemd signals reach it directly); returns 2
    without doing so when the exposure check refuses the address."""
    refused = check_exposure(options["host"], stdout, stderr)
    if refused:
        return refused
    argv = web_argv(options["host"], options["port"])
    stdout.flush()
    os.execv(argv[0], argv)
    return 1  # not reached
