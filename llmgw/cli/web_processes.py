"""How many web processes ``llmgw up`` and ``llmgw web`` run on this machine (``--workers``,
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

import os
import shutil
from collections.abc import MutableMapping
from pathlib import Path

from django.conf import settings

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
    from fleet import protocol

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
