"""The web processes ``llmgw up`` and ``llmgw web`` run on this machine, owned here for
both: their uvicorn command line (:func:`web_argv`), the address checks before it
(:func:`can_listen`, :func:`check_exposure`), how many (``--workers``,
``LLMGW_WEB_WORKERS``), and what several of them need: Prometheus' multiprocess directory.

Several web processes are uvicorn's ``--workers``: one listening socket, N processes
accepting on it, each a whole control plane web process (its own watcher, in-memory view,
usage flushes and ``ControlPlane`` row, keyed ``host:pid``). What must be shared between them
is shared only in production mode (docs/architecture.md, "Several web processes"):

* the tenants' rate-limit, budget and concurrency counters (``gateway.counters``) live in
  Redis; in embedded mode each process would count on its own — limits N times too loose;
* the failed-login counters live in the cache, Redis in production mode, the process's own
  memory in embedded mode;
* the channel layer (the shortcut that reaches an agent's websocket in whichever process
  holds it) is Redis; the in-memory one reaches only its own process.

So embedded mode (no ``LLMGW_REDIS_URL``) runs one web process, and refuses more with one
line that says why; production mode runs one per core by default.
"""

from __future__ import annotations

import ipaddress
import math
import os
import secrets
import shutil
import sys
from collections.abc import MutableMapping
from pathlib import Path

from django.conf import settings

from fleet import protocol
from llmgw.datadir import write_private

#: ``--workers``' default and the value that asks for it: one process per core in production
#: mode, one in embedded mode.
AUTO = "auto"
#: The most web processes per core ``--workers`` accepts: past the cores they only share
#: them, each with its own watcher, database connections and memory.
MAX_WORKERS_PER_CORE = 8
#: The environment variable prometheus_client reads at import (multiprocess mode).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. under ``taskset`` or a
    cgroup's cpuset), else ``os.cpu_count()``; at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def add_workers_argument(parser) -> None:
    """``--workers N|auto`` (env ``LLMGW_WEB_WORKERS``; default ``auto``)."""
    parser.add_argument(
        "--workers", default=os.environ.get("LLMGW_WEB_WORKERS", AUTO), metavar="N|auto",
        help=("web processes sharing the port (uvicorn workers; env LLMGW_WEB_WORKERS). 'auto' (the default): "
              "one per core with LLMGW_REDIS_URL set (production mode), else 1. More than 1 needs "
              "LLMGW_REDIS_URL: the rate-limit, budget and concurrency counters, the failed-login counters "
              "and the agents' channel layer are shared between processes only through Redis"))


def resolve_workers(requested: str | int | None) -> tuple[int, str]:
    """``--workers``' value as a number of web processes: ``(n, "")``, or ``(0, why)`` for a
    value refused — not a positive integer nor ``auto``, more than
    :data:`MAX_WORKERS_PER_CORE` per core, or more than 1 without ``LLMGW_REDIS_URL`` (see
    the module docstring)."""
    text = AUTO if requested is None else str(requested).strip().lower()
    shared = bool(settings.REDIS_URL)
    if text in (AUTO, ""):
        return (cores() if shared else 1), ""
    try:
        workers = int(text)
    except ValueError:
        workers = 0
    if workers < 1:
        return 0, f"--workers {requested!r}: give a number of web processes (1 or more) or 'auto'"
    if workers > MAX_WORKERS_PER_CORE * cores():
        return 0, (f"--workers {workers}: at most {MAX_WORKERS_PER_CORE * cores()} on this machine "
                   f"({MAX_WORKERS_PER_CORE} per core, {cores()} cores); each process holds its own watcher, "
                   "database connections and memory, and more than the cores can run adds no requests/s")
    if workers > 1 and not shared:
        return 0, (f"--workers {workers} needs LLMGW_REDIS_URL (production mode): without Redis each web process "
                   f"keeps its own rate-limit, budget and concurrency counters (limits {workers} times too loose), "
                   "failed-login counters and agent channel layer. Set LLMGW_REDIS_URL, or run --workers 1")
    return workers, ""


def port_problem(port: int) -> str:
    """Why ``--port`` cannot be used ("" when it can): not 1-65535 (0 would be a port of the
    kernel's choosing, which ``gateway_url`` and the metrics directory cannot name)."""
    if not 0 < port < 65536:
        return f"--port {port}: give a port from 1 to 65535"
    return ""


def listened_on_anywhere(port: int) -> bool:
    """Whether any address of this machine listens on ``port`` (IPv4 or IPv6): the metrics
    directory is per port, so several web processes must not start on a port another
    server uses on another address (they would empty, then share, its directory)."""
    for wildcard in ("0.0.0.0", "::"):
        try:
            if not protocol.port_free(wildcard, port):
                return True
        except OSError:  # no IPv6 here
            continue
    return False


def metrics_dir(port: int) -> Path:
    """Where the web processes on ``port`` keep their Prometheus samples (multiprocess
    mode): in the data directory, one per port (two ``llmgw web`` on one machine keep
    apart)."""
    return Path(settings.DATA_DIR) / f"prometheus-web-{port}"


def prepare_metrics_env(env: MutableMapping[str, str], workers: int, port: int) -> MutableMapping[str, str]:
    """``env`` for the web processes: with several, ``PROMETHEUS_MULTIPROC_DIR`` names a
    fresh directory (emptied now: counters start from zero with each run, as a single
    process's do), so ``/metrics`` sums every process's samples (``llmgw.metrics``); with
    one, the variable is removed (the process keeps its samples in memory). Returns ``env``."""
    if workers <= 1:
        env.pop(MULTIPROC_ENV, None)
        return env
    path = metrics_dir(port)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, mode=0o700)
    env[MULTIPROC_ENV] = str(path)
    return env


def web_argv(host: str, port: int, access_log: bool = True, max_connections: int | None = None,
             backlog: int | None = None, keep_alive_s: float | None = None, workers: int = 1) -> list[str]:
    """The control plane's web process: uvicorn with uvloop and httptools, chosen over
    daphne by bench/gateway.py (about 0.7 vs 1.2 ms of CPU per /v1/ request on one core).
    Websockets (the agents) run on the `websockets` library; the lifespan shutdown
    flushes usage (``llmgw.asgi``).

    Bounded (docs/architecture.md, "Gateway rules": connections are bounded before work): at
    most ``max_connections`` connections (``LLMGW_MAX_CONNECTIONS``; uvicorn answers 503 beyond
    it; websockets and held requests count), a listen queue of ``backlog`` (``LLMGW_BACKLOG``),
    idle keep-alive connections closed after ``keep_alive_s`` (``LLMGW_KEEP_ALIVE_TIMEOUT``,
    rounded up to whole seconds), and request heads that must be complete within
    ``LLMGW_HEADER_TIMEOUT`` (``llmgw.http.HeaderTimeoutProtocol``, which reads it in the web
    process).

    ``workers``: web processes accepting on the one listening socket (uvicorn's
    ``--workers``, always given, so uvicorn's own ``WEB_CONCURRENCY`` never decides); the
    connection limit holds per process. More than one needs the environment that
    :func:`llmgw.cli.web_processes.prepare_metrics_env` makes and production mode
    (:func:`llmgw.cli.web_processes.resolve_workers`)."""
    max_connections = settings.LLMGW_MAX_CONNECTIONS if max_connections is None else max_connections
    backlog = settings.LLMGW_BACKLOG if backlog is None else backlog
    keep_alive_s = settings.LLMGW_KEEP_ALIVE_TIMEOUT_S if keep_alive_s is None else keep_alive_s
    argv = [sys.executable, "-m", "uvicorn", "llmgw.asgi:application", "--host", host, "--port", str(port),
            "--loop", "uvloop", "--http", "llmgw.http:HeaderTimeoutProtocol", "--ws", "websockets-sansio",
            "--lifespan", "on", "--timeout-graceful-shutdown", "5",
            "--limit-concurrency", str(max_connections), "--backlog", str(backlog),
            "--timeout-keep-alive", str(max(1, math.ceil(keep_alive_s))), "--workers", str(workers)]
    if workers > 1:
        # The supervisor pings each worker (a thread in it); a loaded machine must not get
        # a busy worker killed as hung.
        argv += ["--timeout-worker-healthcheck", "30"]
    return argv if access_log else argv + ["--no-access-log"]


def can_listen(host: str, port: int) -> bool:
    """Whether ``llmgw up`` could listen on ``host:port`` (:func:`fleet.protocol.port_free`,
    IPv6 too); a host that is not this machine's counts as taken, as before."""
    try:
        return protocol.port_free(host, port)
    except OSError:
        return False


def say(stream, text: str) -> None:
    """Write and flush, ignoring a closed pipe (``up | head``, a terminal gone): stopping
    the children must not depend on being able to tell anyone."""
    try:
        stream.write(text)
        stream.flush()
    except (BrokenPipeError, OSError, ValueError):
        pass


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` keeps the server on this machine (``localhost``,
    ``127.0.0.0/8``, ``::1``); ``0.0.0.0``, ``::`` and every other address expose it."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, stdout, stderr) -> int:
    """The safe defaults of a server others can reach (docs/architecture.md, "Security":
    exposure). On a non-loopback ``host``: warn; refuse (returns 2) without
    ``LLMGW_ALLOWED_HOSTS``; unless ``LLMGW_METRICS_TOKEN`` or ``LLMGW_METRICS_PUBLIC=1`` is
    set, protect /metrics with a token generated once into the data directory (the web process
    reads it from there) and say how Prometheus sends it. Returns 0 to go on."""
    if is_loopback(host):
        kept = Path(settings.LLMGW_METRICS_TOKEN_FILE)
        if not settings.LLMGW_METRICS_PUBLIC and not os.environ.get("LLMGW_METRICS_TOKEN") and kept.exists():
            say(stdout, f"llmgw up: /metrics needs Authorization: Bearer <the token in {kept}> (kept from an "
                        "exposed run; delete the file or set LLMGW_METRICS_PUBLIC=1 to make it public)\n")
        return 0
    if not settings.LLMGW_ALLOWED_HOSTS:
        stderr.write(
            f"llmgw up: --host {host} makes this server reachable from other machines, so it needs "
            "LLMGW_ALLOWED_HOSTS: the names or addresses clients use to reach it, comma separated "
            "(e.g. LLMGW_ALLOWED_HOSTS=cp.example.com,10.0.0.2). Nothing was started.\n")
        return 2
    say(stdout, f"llmgw up: WARNING: listening on {host}: every machine that can reach it can try the admin "
                "login, /api/ and /v1/ (with a key). Put a TLS terminator in front (then set LLMGW_BEHIND_TLS=1) "
                "and a firewall around the engines' ports (README, Security).\n")
    if settings.LLMGW_METRICS_PUBLIC:
        say(stdout, "llmgw up: /metrics is public (LLMGW_METRICS_PUBLIC=1)\n")
    elif not os.environ.get("LLMGW_METRICS_TOKEN"):
        path = Path(settings.LLMGW_METRICS_TOKEN_FILE)
        if not path.exists() or not path.read_text().strip():
            write_private(path, secrets.token_urlsafe(32))
        say(stdout, f"llmgw up: /metrics needs Authorization: Bearer <the token in {path}>; in Prometheus' "
                    "scrape config: authorization: {type: Bearer, credentials_file: <a copy of that file>} "
                    "(LLMGW_METRICS_PUBLIC=1 makes it public)\n")
    return 0
