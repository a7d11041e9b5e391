"""``python -m fleet.agent --server URL --token T``: the agent without Django."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from fleet.agent.client import ClientOptions, run_agent
from fleet.agent.engines import AgentConfig
from fleet.agent.inventory import FAKE_GPUS_ENV, parse_fake_gpus


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="llmgw agent", description="Run this machine's llmgw agent.")
    env = os.environ.get
    parser.add_argument("--server", default=env("LLMGW_SERVER", ""), help="control plane URL, e.g. http://cp:8000 (env LLMGW_SERVER)")
    parser.add_argument("--token", default=env("LLMGW_AGENT_TOKEN", ""), help="this agent's token (env LLMGW_AGENT_TOKEN)")
    parser.add_argument("--name", default=socket.gethostname(), help="agent name (default: host name)")
    parser.add_argument("--advertise-address", default=env("LLMGW_ADVERTISE_ADDRESS", ""),
                        help="address the gateway uses to reach engines (default: the address this agent reached the control plane from)")
    parser.add_argument("--state-dir", default=env("LLMGW_AGENT_STATE_DIR", str(Path.home() / ".local/share/llmgw-agent")),
                        help="engine logs, weights cache and the adoption state file")
    parser.add_argument("--bind-host", default=env("LLMGW_ENGINE_BIND_HOST", ""),
                        help="address engines listen on (default: the advertised one; 0.0.0.0 or :: listen on "
                             "every interface, which the engine key still guards; env LLMGW_ENGINE_BIND_HOST)")
    parser.add_argument("--port-range", default=env("LLMGW_ENGINE_PORTS", "20000-20999"), help="engine ports, outside 32768-60999")
    parser.add_argument("--heartbeat-s", type=float, default=float(env("LLMGW_AGENT_HEARTBEAT_S", "5")),
                        help="seconds between heartbeats to the control plane (default 5; env LLMGW_AGENT_HEARTBEAT_S)")
    parser.add_argument("--stop-grace-s", type=float, default=float(env("LLMGW_ENGINE_STOP_GRACE_S", "10")),
                        help="seconds an engine has to exit after SIGTERM before SIGKILL (default 10; "
                             "env LLMGW_ENGINE_STOP_GRACE_S)")
    parser.add_argument("--unready-fail-s", type=float, default=float(env("LLMGW_ENGINE_UNREADY_FAIL_S", "30")),
                        help="fail a ready engine that refuses or errors on its readiness path this long")
    parser.add_argument("--hung-fail-s", type=float, default=float(env("LLMGW_ENGINE_HUNG_FAIL_S", "300")),
                        help="fail a ready engine that does not answer its readiness path at all this long "
                             "(busy engines may answer late)")
    parser.add_argument("--cache-max-gib", type=float, default=float(env("LLMGW_AGENT_CACHE_MAX_GIB", "0")),
                        help="size limit of the cache of mirror: weights; least recently used weights not in use "
                             "are evicted (0 = no limit; env LLMGW_AGENT_CACHE_MAX_GIB)")
    parser.add_argument("--stop-engines-on-exit", action="store_true",
                        help="stop engines when the agent exits (llmgw up); by default they keep serving")
    parser.add_argument("--fake-gpus", default=env(FAKE_GPUS_ENV, ""), metavar="COUNTxMIB",
                        help="for tests and demos: report simulated GPUs instead of this machine's, e.g. 2x24576 "
                             "(two of 24576 MiB); engines get CUDA_VISIBLE_DEVICES for them (env LLMGW_AGENT_FAKE_GPUS)")
    return parser


def main_from_args(args: argparse.Namespace) -> int:
    if not args.server or not args.token:
        print("llmgw agent: --server and --token are required", file=sys.stderr)
        return 2
    try:
        low, high = (int(x) for x in args.port_range.split("-"))
    except ValueError:
        print(f"llmgw agent: --port-range {args.port_range!r} is not LOW-HIGH", file=sys.stderr)
        return 2
    fake_gpus = (getattr(args, "fake_gpus", "") or "").strip()
    if fake_gpus:
        try:
            parse_fake_gpus(fake_gpus)
        except ValueError as exc:
            print(f"llmgw agent: --fake-gpus: {exc}", file=sys.stderr)
            return 2
        # read_inventory reads it (engines never see LLMGW_* variables).
        os.environ[FAKE_GPUS_ENV] = fake_gpus
        print(f"llmgw agent: reporting simulated GPUs {fake_gpus} (for tests and demos)", file=sys.stderr)
    # Engines listen on the advertised address only (docs/architecture.md, "Decisions": the
    # agent advertises its address; EngineManager.bind_host):
    # without --advertise-address, the address this agent reaches the control plane from,
    # known once connected. --bind-host overrides it.
    bind = args.bind_host.strip()
    if args.bind_host.strip() in ("0.0.0.0", "::"):
        print(f"llmgw agent: engines will listen on every interface ({args.bind_host}); only their keys keep "
              "them to the gateway: firewall the engine ports", file=sys.stderr)
    config = AgentConfig(state_dir=Path(args.state_dir), bind_host=bind, port_min=low, port_max=high,
                         stop_grace_s=args.stop_grace_s, unready_fail_s=args.unready_fail_s,
                         hung_fail_s=args.hung_fail_s,
                         # Checked a few times within the shorter limit, at most every 2 s.
                         readiness_watch_s=min(2.0, max(0.2, min(args.unready_fail_s, args.hung_fail_s) / 3)),
                         cache_max_bytes=int(max(0.0, getattr(args, "cache_max_gib", 0.0)) * 2**30))
    options = ClientOptions(server=args.server, token=args.token, name=args.name,
                            advertise_address=args.advertise_address, heartbeat_s=args.heartbeat_s,
                            stop_engines_on_exit=args.stop_engines_on_exit)
    return run_agent(options, config)


def main(argv: list[str] | None = None) -> int:
    return main_from_args(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
