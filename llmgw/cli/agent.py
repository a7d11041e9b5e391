"""``llmgw agent``: run this machine's agent (needs no database)."""

import argparse

from fleet.agent.__main__ import build_parser, main_from_args

HELP = "Run this machine's agent: connect to the control plane and run the engines it assigns."


def add_arguments(parser) -> None:
    build_parser(parser)


def run(options, stdout, stderr) -> int:
    keys = ["server", "token", "name", "advertise_address", "state_dir", "bind_host", "port_range",
            "heartbeat_s", "stop_grace_s", "stop_engines_on_exit", "cache_max_gib", "unready_fail_s", "hung_fail_s",
            "fake_gpus"]
    return main_from_args(argparse.Namespace(**{k: options[k] for k in keys}))
